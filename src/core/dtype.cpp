#include "core/dtype.h"

#include <cassert>

#include "core/e4m3.h"

namespace rill {
namespace {

constexpr int kQK = 32;    // block size of the classic quants
constexpr int kQKK = 256;  // block size of the K-quants

}  // namespace

std::optional<DTypeInfo> dtype_info(uint32_t id) {
  switch (static_cast<DType>(id)) {
    case DType::kF32:
      return DTypeInfo{"F32", 1, 4, false};
    case DType::kF16:
      return DTypeInfo{"F16", 1, 2, false};
    case DType::kBF16:
      return DTypeInfo{"BF16", 1, 2, false};
    case DType::kQ4_0:
      return DTypeInfo{"Q4_0", kQK, 2 + kQK / 2, true};
    case DType::kQ4_1:
      return DTypeInfo{"Q4_1", kQK, 4 + kQK / 2, true};
    case DType::kQ5_0:
      return DTypeInfo{"Q5_0", kQK, 2 + 4 + kQK / 2, true};
    case DType::kQ5_1:
      return DTypeInfo{"Q5_1", kQK, 4 + 4 + kQK / 2, true};
    case DType::kQ8_0:
      return DTypeInfo{"Q8_0", kQK, 2 + kQK, true};
    case DType::kQ8_1:
      return DTypeInfo{"Q8_1", kQK, 4 + kQK, true};
    // K-quants: super-blocks of 256 (see backend/cpu/quants.h for layouts).
    case DType::kQ4_K:
      return DTypeInfo{"Q4_K", kQKK, 2 + 2 + 12 + kQKK / 2, true};
    case DType::kQ5_K:
      return DTypeInfo{"Q5_K", kQKK, 2 + 2 + 12 + kQKK / 8 + kQKK / 2, true};
    case DType::kQ6_K:
      return DTypeInfo{"Q6_K", kQKK, kQKK / 2 + kQKK / 4 + kQKK / 16 + 2, true};
    case DType::kQ8_K:
      return DTypeInfo{"Q8_K", kQKK, 4 + kQKK + kQKK / 16 * 2, true};
    case DType::kMXFP4:
      return DTypeInfo{"MXFP4", kQK, 1 + kQK / 2, true};
    case DType::kQ2_K:
      return DTypeInfo{"Q2_K", kQKK, kQKK / 16 + kQKK / 4 + 2 + 2, true};
    case DType::kQ3_K:
      return DTypeInfo{"Q3_K", kQKK, kQKK / 8 + kQKK / 4 + 12 + 2, true};
    // Non-linear 4-bit codes (kIq4nlValues in backend/cpu/quants.h).
    case DType::kIQ4_NL:
      return DTypeInfo{"IQ4_NL", kQK, 2 + kQK / 2, true};
    case DType::kIQ4_XS:
      return DTypeInfo{"IQ4_XS", kQKK, 2 + 2 + kQKK / 64 + kQKK / 2, true};
  }
  return std::nullopt;
}

DTypeInfo dtype_info(DType t) {
  if (t == kF8E4M3) return DTypeInfo{"F8_E4M3", 1, 1, false};  // KV only: not a GGUF type
  if (t == kKvQ4Chan) return DTypeInfo{"Q4_CHAN", kQK, 2 + 1 + kQK / 2, true};
  if (t == kKvQ4Alloc) return DTypeInfo{"Q4_ALLOC", kQK, 2 + 1 + kQK / 2, true};
  if (t == kKvIq4Nl64) return DTypeInfo{"IQ4_NL64", 2 * kQK, 1 + kQK, true};
  if (t == kKvQ8_0x64) return DTypeInfo{"Q8_0_64", 2 * kQK, 2 + 2 * kQK, true};
  auto info = dtype_info(static_cast<uint32_t>(t));
  assert(info);
  return *info;
}

std::string_view dtype_name(DType t) {
  return dtype_info(t).name;
}

size_t row_bytes(DType t, int64_t n) {
  DTypeInfo info = dtype_info(t);
  assert(n % info.block_size == 0);
  return static_cast<size_t>(n / info.block_size) * static_cast<size_t>(info.block_bytes);
}

std::string_view ggml_type_name(uint32_t id) {
  static constexpr std::string_view kNames[] = {
      "F32",     "F16",   "Q4_0",   "Q4_1",  "Q4_2",     "Q4_3",     "Q5_0",     "Q5_1",    "Q8_0",
      "Q8_1",    "Q2_K",  "Q3_K",   "Q4_K",  "Q5_K",     "Q6_K",     "Q8_K",     "IQ2_XXS", "IQ2_XS",
      "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S",    "IQ4_XS",   "I8",       "I16",     "I32",
      "I64",     "F64",   "IQ1_M",  "BF16",  "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",   "TQ2_0"};
  if (id < std::size(kNames)) return kNames[id];
  return "unknown";
}

}  // namespace rill
