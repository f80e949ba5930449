#pragma once
// Helpers shared by the backend tests: seeded random quantized rows with
// sane scales, and the ISAs this CPU can run.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/quants.h"
#include "core/dtype.h"
#include "core/half.h"

namespace rill::cpu::testing {

inline std::vector<Isa> available_isas() {
  std::vector<Isa> isas{Isa::kScalar};
  if (cpu_features().avx2) isas.push_back(Isa::kAvx2);
  if (cpu_features().avx512) isas.push_back(Isa::kAvx512);
  return isas;
}

inline void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

// n_rows rows of n_cols elements of weight type t: random bytes with the f16
// scale fields set to values in [-scale, scale] (mins too), so values are finite.
inline std::vector<uint8_t> random_weight_rows(DType t, int64_t n_rows, int64_t n_cols, uint32_t seed,
                                               float scale = 0.05f) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> real(-1.0f, 1.0f);
  std::vector<uint8_t> buf(row_bytes(t, n_cols) * static_cast<size_t>(n_rows));
  if (t == DType::kF32 || t == DType::kF16 || t == DType::kBF16) {
    for (int64_t i = 0; i < n_rows * n_cols; ++i) {
      const float v = real(rng);
      if (t == DType::kF32)
        std::memcpy(buf.data() + 4 * i, &v, 4);
      else {
        const uint16_t h = t == DType::kF16 ? f32_to_f16(v) : f32_to_bf16(v);
        std::memcpy(buf.data() + 2 * i, &h, 2);
      }
    }
    return buf;
  }
  for (auto& b : buf) b = static_cast<uint8_t>(byte(rng));
  const DTypeInfo info = dtype_info(t);
  const size_t n_blocks = buf.size() / static_cast<size_t>(info.block_bytes);
  for (size_t i = 0; i < n_blocks; ++i) {
    uint8_t* blk = buf.data() + i * static_cast<size_t>(info.block_bytes);
    switch (t) {
      case DType::kQ4_0:
      case DType::kQ5_0:
      case DType::kQ8_0:
        put_f16(blk, scale * real(rng));
        break;
      case DType::kQ4_1:
      case DType::kQ5_1:
      case DType::kQ4_K:
      case DType::kQ5_K:
        put_f16(blk, scale * real(rng));
        put_f16(blk + 2, scale * real(rng));
        break;
      case DType::kQ6_K:
        put_f16(blk + offsetof(BlockQ6_K, d), scale * real(rng) * 0.1f);
        break;
      case DType::kQ2_K:
        put_f16(blk + offsetof(BlockQ2_K, d), scale * real(rng));
        put_f16(blk + offsetof(BlockQ2_K, dmin), scale * real(rng));
        break;
      case DType::kQ3_K:
        put_f16(blk + offsetof(BlockQ3_K, d), scale * real(rng) * 0.1f);
        break;
      case DType::kIQ4_NL:
      case DType::kIQ4_XS:
        put_f16(blk, scale * real(rng) * 0.01f);
        break;
      case DType::kMXFP4:  // e8m0 scales 2^-10 .. 2^-3 (values up to 12 of them)
        blk[0] = static_cast<uint8_t>(118 + byte(rng) % 8);
        break;
      default:
        break;
    }
  }
  return buf;
}

inline std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> real(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = real(rng);
  return v;
}

}  // namespace rill::cpu::testing
