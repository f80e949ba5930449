#include "loader/module_pattern.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace rill {

Result<std::shared_ptr<const ModulePattern>> ModulePattern::compile(std::string_view pattern) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), 0, &err, &err_off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return Error{std::string(reinterpret_cast<const char*>(msg)) + " at offset " + std::to_string(err_off)};
  }
  auto re = std::shared_ptr<ModulePattern>(new ModulePattern());
  re->pattern_ = std::string(pattern);
  re->code_ = code;
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  if (ctx == nullptr) return Error{"out of memory compiling a module pattern"};
  pcre2_set_match_limit(ctx, kMatchLimit);
  pcre2_set_heap_limit(ctx, kHeapLimitKib);
  re->context_ = ctx;
  return std::shared_ptr<const ModulePattern>(std::move(re));
}

ModulePattern::~ModulePattern() {
  pcre2_match_context_free(static_cast<pcre2_match_context*>(context_));
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

Result<bool> ModulePattern::matches_prefix(std::string_view name) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  if (md == nullptr) return Error{"out of memory matching module pattern '" + pattern_ + "'"};
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(name.data()), name.size(), 0, PCRE2_ANCHORED, md,
                             static_cast<pcre2_match_context*>(context_));
  pcre2_match_data_free(md);
  if (rc >= 0) return true;
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  PCRE2_UCHAR msg[256];
  pcre2_get_error_message(rc, msg, sizeof(msg));
  return Error{"pattern '" + pattern_ + "' against '" + std::string(name) + "': " + reinterpret_cast<const char*>(msg) +
               " (the pattern backtracks without bound)"};
}

}  // namespace rill
