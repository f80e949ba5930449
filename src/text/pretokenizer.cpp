#include "text/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "text/unicode.h"

namespace rill::text {

namespace {

// Unicode White_Space, as Oniguruma's and llama.cpp's \s define it.
constexpr std::string_view kWhiteSpaceBody =
    R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string rewrite_whitespace_classes(std::string_view p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpaceBody) : "[" + std::string(kWhiteSpaceBody) + "]";
      } else if (e == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpaceBody) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct Segment {
  size_t begin, end;
  bool is_match;
};

// Applies a split behaviour to the (gap, match) segmentation of `text`,
// exactly as tokenizers' NormalizedString::split does; empty pieces dropped.
void emit_split(std::string_view text, std::vector<Segment> segs, SplitBehavior behavior, bool invert,
                std::vector<std::string>& out) {
  if (invert)
    for (auto& s : segs) s.is_match = !s.is_match;
  std::vector<Segment> merged;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      merged = std::move(segs);
      break;
    case SplitBehavior::kRemoved:
      for (const auto& s : segs)
        if (!s.is_match) merged.push_back(s);
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& s : segs) {
        if (s.is_match && !previous_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (size_t k = segs.size(); k-- > 0;) {
        const auto& s = segs[k];
        if (s.is_match && !previous_match && !merged.empty()) {
          merged.back().begin = s.begin;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    case SplitBehavior::kContiguous:
      for (const auto& s : segs) {
        if (s.is_match == previous_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
  }
  for (const auto& s : merged)
    if (s.end > s.begin) out.emplace_back(text.substr(s.begin, s.end - s.begin));
}

std::vector<Segment> segments_from_matches(size_t n, const std::vector<Regex::Match>& matches) {
  std::vector<Segment> segs;
  size_t prev = 0;
  for (const auto& m : matches) {
    if (m.begin > prev) segs.push_back({prev, m.begin, false});
    segs.push_back({m.begin, m.end, true});
    prev = m.end;
  }
  if (prev < n) segs.push_back({prev, n, false});
  return segs;
}

void find_literal(std::string_view text, std::string_view lit, std::vector<Regex::Match>& out) {
  if (lit.empty()) return;
  for (size_t pos = text.find(lit); pos != std::string_view::npos; pos = text.find(lit, pos + lit.size()))
    out.push_back({pos, pos + lit.size()});
}

Result<SplitBehavior> parse_behavior(const std::string& name, const std::string& where) {
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return Error{where + ": unknown split behavior '" + name + "'"};
}

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581

}  // namespace

Result<std::shared_ptr<const Regex>> Regex::compile(std::string_view pattern) {
  const std::string rewritten = rewrite_whitespace_classes(pattern);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return Error{"regex '" + std::string(pattern) + "' at offset " + std::to_string(err_off) + ": " +
                 reinterpret_cast<const char*>(msg)};
  }
  auto re = std::shared_ptr<Regex>(new Regex());
  re->code_ = code;
  re->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return std::shared_ptr<const Regex>(std::move(re));
}

Regex::~Regex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

void Regex::find_all(std::string_view text, std::vector<Match>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start < text.size()) {
    int rc = pcre2_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // The interpreter backtracks on the heap, so it handles inputs the
      // default 32 KiB JIT stack cannot.
      rc = pcre2_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
    }
    if (rc < 0) break;  // no match (or a resource limit: the rest is one gap)
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[1] <= ov[0]) {
      start = ov[0] + 1;  // empty match: step over one character
      while (start < text.size() && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) ++start;
      continue;
    }
    out.push_back({ov[0], ov[1]});
    start = ov[1];
  }
  pcre2_match_data_free(md);
}

Result<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& j, const std::string& where) {
  PreTokenizer pt;
  if (j.is_null()) return pt;
  if (!j.is_object() || !j.contains("type")) return Error{where + ": pre_tokenizer has no type"};
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const auto& sub : j.value("pretokenizers", nlohmann::json::array())) {
      RILL_ASSIGN_OR_RETURN(PreTokenizer inner, from_json(sub, where));
      for (auto& s : inner.steps_) pt.steps_.push_back(std::move(s));
    }
    return pt;
  }
  PreTokenizerStep step;
  if (type == "Split") {
    const auto& pat = j.at("pattern");
    if (pat.contains("Regex")) {
      step.kind = PreTokenizerStep::Kind::kSplitRegex;
      auto re = Regex::compile(pat["Regex"].get<std::string>());
      if (!re.ok()) return Error{where + ": Split " + re.error().message};
      step.regex = std::move(re).value();
    } else {
      step.kind = PreTokenizerStep::Kind::kSplitString;
      step.literal = pat.value("String", "");
    }
    RILL_ASSIGN_OR_RETURN(step.behavior, parse_behavior(j.value("behavior", "Isolated"), where));
    step.invert = j.value("invert", false);
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    step.add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) {
      auto re = Regex::compile(kGpt2Pattern);
      if (!re.ok()) return re.error();
      step.regex = std::move(re).value();
    }
  } else if (type == "Metaspace") {
    step.kind = PreTokenizerStep::Kind::kMetaspace;
    const std::string scheme = j.value("prepend_scheme", j.value("add_prefix_space", true) ? "always" : "never");
    step.prepend = scheme == "first"   ? PreTokenizerStep::Prepend::kFirst
                   : scheme == "never" ? PreTokenizerStep::Prepend::kNever
                                       : PreTokenizerStep::Prepend::kAlways;
    step.metaspace_split = j.value("split", true);
  } else if (type == "Digits") {
    step.kind = PreTokenizerStep::Kind::kDigits;
    step.individual_digits = j.value("individual_digits", false);
  } else {
    return Error{where + ": unsupported pre_tokenizer type '" + type + "'"};
  }
  pt.steps_.push_back(std::move(step));
  return pt;
}

Result<PreTokenizer> PreTokenizer::for_gguf_pre(const std::string& name, bool* ignore_merges) {
  // Patterns as llama.cpp writes them (contractions spelled out instead of
  // (?i:...)), applied one after another, each isolating its matches.
  static constexpr std::string_view kLlama3 =
      R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static constexpr std::string_view kQwen2 =
      R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static constexpr std::string_view kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
  std::vector<std::string_view> patterns;
  *ignore_merges = false;
  if (name == "llama3" || name == "llama-v3" || name == "llama-bpe" || name == "falcon3") {
    patterns = {kLlama3};
    *ignore_merges = true;
  } else if (name == "dbrx" || name == "smaug-bpe" || name == "chatglm-bpe") {
    patterns = {kLlama3};
  } else if (name == "qwen2" || name == "stablelm2" || name == "megrez") {
    patterns = {kQwen2};
  } else if (name == "minicpm5") {
    // MiniCPM5 (llama.cpp's MINICPM5 pre-type): digit runs cut into pieces
    // of up to three first, then llama3's pattern with \p{N}+ for its
    // \p{N}{1,3}; a piece that is a whole token skips the merges.
    patterns = {
        R"(\p{N}{1,3})",
        R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};
    *ignore_merges = true;
  } else if (name == "gpt-2" || name == "phi-2" || name == "roberta-bpe" || name == "mpt" || name == "olmo" ||
             name == "jais" || name == "jina-es" || name == "jina-de" || name == "jina-v1-en" || name == "jina-v2-es" ||
             name == "jina-v2-de" || name == "jina-v2-code" || name == "gigachat") {
    patterns = {kGpt2};
  } else if (name == "starcoder" || name == "refact" || name == "command-r" || name == "smollm" ||
             name == "codeshell" || name == "exaone" || name == "minerva-7b") {
    patterns = {R"(\p{N})", kGpt2};
  } else if (name.empty() || name == "default") {
    patterns = {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"};
  } else {
    return Error{"tokenizer.ggml.pre '" + name + "' is not supported"};
  }
  PreTokenizer pt;
  for (auto p : patterns) {
    PreTokenizerStep step;
    step.kind = PreTokenizerStep::Kind::kSplitRegex;
    RILL_ASSIGN_OR_RETURN(step.regex, Regex::compile(p));
    pt.steps_.push_back(std::move(step));
  }
  PreTokenizerStep byte_level;
  byte_level.kind = PreTokenizerStep::Kind::kByteLevel;
  pt.steps_.push_back(std::move(byte_level));
  return pt;
}

void PreTokenizer::split(std::string_view text, bool is_first, std::vector<std::string>& pieces) const {
  pieces.clear();
  if (text.empty()) return;
  pieces.emplace_back(text);
  std::vector<std::string> next;
  std::vector<Regex::Match> matches;
  for (const auto& step : steps_) {
    next.clear();
    for (size_t k = 0; k < pieces.size(); ++k) {
      const std::string& piece = pieces[k];
      matches.clear();
      switch (step.kind) {
        case PreTokenizerStep::Kind::kSplitRegex:
          step.regex->find_all(piece, matches);
          emit_split(piece, segments_from_matches(piece.size(), matches), step.behavior, step.invert, next);
          break;
        case PreTokenizerStep::Kind::kSplitString:
          find_literal(piece, step.literal, matches);
          emit_split(piece, segments_from_matches(piece.size(), matches), step.behavior, step.invert, next);
          break;
        case PreTokenizerStep::Kind::kDigits: {
          for (size_t i = 0; i < piece.size(); ++i)
            if (piece[i] >= '0' && piece[i] <= '9') matches.push_back({i, i + 1});
          emit_split(piece, segments_from_matches(piece.size(), matches),
                     step.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, false, next);
          break;
        }
        case PreTokenizerStep::Kind::kByteLevel: {
          std::string src = piece;
          if (step.add_prefix_space && (src.empty() || src[0] != ' ')) src.insert(src.begin(), ' ');
          std::vector<std::string> parts;
          if (step.regex) {
            step.regex->find_all(src, matches);
            emit_split(src, segments_from_matches(src.size(), matches), SplitBehavior::kIsolated, false, parts);
          } else {
            parts.push_back(std::move(src));
          }
          for (const auto& part : parts) {
            std::string mapped;
            append_byte_level(mapped, part);
            next.push_back(std::move(mapped));
          }
          break;
        }
        case PreTokenizerStep::Kind::kMetaspace: {
          std::string s;
          for (char c : piece) {
            if (c == ' ')
              s += kMetaspace;
            else
              s += c;
          }
          const bool starts = s.compare(0, kMetaspace.size(), kMetaspace) == 0;
          const bool prepend = step.prepend == PreTokenizerStep::Prepend::kAlways ||
                               (step.prepend == PreTokenizerStep::Prepend::kFirst && is_first && k == 0);
          if (prepend && !starts) s.insert(0, kMetaspace);
          if (step.metaspace_split) {
            find_literal(s, kMetaspace, matches);
            emit_split(s, segments_from_matches(s.size(), matches), SplitBehavior::kMergedWithNext, false, next);
          } else {
            next.push_back(std::move(s));
          }
          break;
        }
      }
    }
    pieces.swap(next);
  }
}

}  // namespace rill::text
