// Fuzz target for the --kv-config reader (parse_kv_config) and what the
// model does with its entries (KvTypeOptions::resolve, check_kv_layer_types).
// Input: byte 0 = the model's KV layer count (1..64); the rest = the file.
// Checks: every error names the file; a resolved model has one pair of
// types per layer, each the base type or one the file names; no exception
// escapes and nothing reads out of range (the sanitizers).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/kv_types.h"

#define FUZZ_CHECK(cond)                                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                          \
    }                                                                        \
  } while (0)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string path = "fuzz/kv.conf";
  const int64_t n_layer = 1 + data[0] % 64;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  rill::KvTypeOptions opts;
  const rill::Status parsed = rill::parse_kv_config(text, path, opts);
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.error().message.find(path) != std::string::npos);
    return 0;
  }
  auto layers = opts.resolve(n_layer, rill::DType::kF16);
  if (!layers.ok()) {
    FUZZ_CHECK(layers.error().message.find(path) != std::string::npos);
    return 0;
  }
  FUZZ_CHECK(static_cast<int64_t>(layers->size()) == n_layer);
  for (int64_t l = 0; l < n_layer; ++l) {
    for (const rill::KvType& t : {(*layers)[static_cast<size_t>(l)].k, (*layers)[static_cast<size_t>(l)].v}) {
      FUZZ_CHECK((t.dtype == rill::DType::kF16 && !t.rotated) || opts.mentions(t.dtype));
    }
    (void)rill::check_kv_layer_types(l, (*layers)[static_cast<size_t>(l)], 3, 64).ok();
  }
  return 0;
}
