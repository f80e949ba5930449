#pragma once
// Pre-tokenization: splitting normalized text into the pieces that BPE runs
// on independently. Mirrors the Hugging Face `tokenizers` pre-tokenizers the
// supported models use (Split, ByteLevel, Metaspace, Digits, Sequence) and
// llama.cpp's per-name regex cascades for GGUF vocabularies.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/result.h"

namespace rill::text {

// A compiled PCRE2 pattern (UTF + UCP). `\s`/`\S` are rewritten to the
// Unicode White_Space set (which includes U+0085, unlike PCRE2's \s) so the
// classes match Oniguruma (tokenizers) and llama.cpp.
class Regex {
 public:
  static Result<std::shared_ptr<const Regex>> compile(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  struct Match {
    size_t begin, end;
  };
  // All non-overlapping, non-empty matches in `text` (valid UTF-8), in order.
  void find_all(std::string_view text, std::vector<Match>& out) const;

 private:
  Regex() = default;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// One step of a pre-tokenizer pipeline. Each step maps every current piece to
// zero or more pieces.
struct PreTokenizerStep {
  enum class Kind { kSplitRegex, kSplitString, kByteLevel, kMetaspace, kDigits };
  Kind kind = Kind::kSplitRegex;
  std::shared_ptr<const Regex> regex;  // kSplitRegex (and kByteLevel with use_regex)
  std::string literal;                 // kSplitString
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // kByteLevel
  // kMetaspace: replacement is U+2581; prepend "always" / "first" / "never".
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
  bool metaspace_split = true;
  bool individual_digits = false;  // kDigits
};

class PreTokenizer {
 public:
  // Built from the "pre_tokenizer" object of tokenizer.json (null allowed);
  // errors name `where`.
  static Result<PreTokenizer> from_json(const nlohmann::json& j, const std::string& where);
  // llama.cpp's cascade for tokenizer.ggml.pre = `name`, followed by the
  // byte-level mapping. Sets *ignore_merges as llama.cpp does for that name.
  static Result<PreTokenizer> for_gguf_pre(const std::string& name, bool* ignore_merges);

  // Splits one normalized segment. `is_first` is whether this segment starts
  // the input (Metaspace prepend_scheme "first").
  void split(std::string_view text, bool is_first, std::vector<std::string>& pieces) const;

  bool empty() const { return steps_.empty(); }

 private:
  std::vector<PreTokenizerStep> steps_;
};

// The GPT-2 pattern used by ByteLevel(use_regex=true).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace rill::text
