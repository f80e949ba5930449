#pragma once
// ModulePattern: a module-name pattern from a checkpoint's config
// (quantization_config.modules_to_not_convert), a Python regular
// expression in transformers. Compiled by PCRE2, whose syntax is Python's
// for what such patterns hold, and matched with bounded work: the config
// is untrusted input, and a backtracking matcher without limits (as
// std::regex, which also recurses per character) hangs or overflows the
// stack on a pattern such as "(a|a)*b".
#include <memory>
#include <string>
#include <string_view>

#include "core/result.h"

namespace rill {

class ModulePattern {
 public:
  // An error names PCRE2's complaint and its offset.
  static Result<std::shared_ptr<const ModulePattern>> compile(std::string_view pattern);
  ~ModulePattern();
  ModulePattern(const ModulePattern&) = delete;
  ModulePattern& operator=(const ModulePattern&) = delete;

  // Python's re.match(pattern, name) is not None: a match anchored at the
  // start of `name`, of any length. An error (naming the pattern) when
  // the match needs more than kMatchLimit backtracking steps or
  // kHeapLimitKib of backtracking memory.
  Result<bool> matches_prefix(std::string_view name) const;

  static constexpr uint32_t kMatchLimit = 1'000'000;
  static constexpr uint32_t kHeapLimitKib = 4096;

 private:
  ModulePattern() = default;
  std::string pattern_;
  void* code_ = nullptr;     // pcre2_code_8*
  void* context_ = nullptr;  // pcre2_match_context_8*: the limits
};

}  // namespace rill
