#pragma once
// Element types of weights, activations and KV. Values equal GGML's type ids
// so GGUF tensor infos map directly; BF16 is 30 as in GGUF.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace rill {

enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,  // activations only (the partner of Q4_1/Q5_1 in dot products)
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,  // activations only (the partner of the K-quants)
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kBF16 = 30,
  kMXFP4 = 39,  // blocks of 32 e2m1 values with an e8m0 scale (gpt-oss experts)
};

struct DTypeInfo {
  std::string_view name;
  int block_size;   // elements per block (1 for plain floats)
  int block_bytes;  // bytes per block
  bool quantized;
};

// Returns nullopt for ids rill does not support.
std::optional<DTypeInfo> dtype_info(uint32_t id);
DTypeInfo dtype_info(DType t);
std::string_view dtype_name(DType t);

// Bytes of a row of `n` elements; requires n % block_size == 0.
size_t row_bytes(DType t, int64_t n);

// The GGML name of any type id, including ones rill does not support, for
// "unsupported tensor type" errors.
std::string_view ggml_type_name(uint32_t id);

}  // namespace rill
