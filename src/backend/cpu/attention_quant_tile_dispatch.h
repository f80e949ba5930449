#pragma once
// What the quantized-KV tile kernels (attention_quant_avx512.cpp,
// attention_quant_tile_avx2.cpp) share: the tile's head addressing and the
// choice of an instantiation per (K type, V type, head_dim). Included only
// by those files; everything here is in an unnamed namespace, so each file
// gets its own copy compiled for its own ISA (an inline function shared
// across them could be merged by the linker into the AVX-512 build and run
// on an AVX2-only CPU).
#include <cstdint>

#include "backend/cpu/attention_quant.h"
#include "core/dtype.h"
#include "core/e4m3.h"

namespace rill::cpu::detail {
namespace {

// Head h of a tile: query h / n_heads, its query head h % n_heads.
struct TileHeads {
  const QuantTileArgs& a;
  int64_t begin(int h) const { return a.j_begin[h / a.n_heads]; }
  int64_t end(int h) const { return a.j_end[h / a.n_heads]; }
  float* scores(int h) const { return a.scores + h * a.score_stride; }
  float* out(int h) const { return a.out + (h / a.n_heads) * a.out_stride + (h % a.n_heads) * a.head_dim; }
};

// Kernel<KT, VT, NB>::run: a file's kernel for heads of NB blocks of 32.
template <template <DType, DType, int> class Kernel, DType KT, DType VT>
QuantTileAttend tile_for_head(int64_t head_dim) {
  // q8_0h64's blocks of 64: heads of whole blocks are 64, 128 or 256 wide
  // (check_kv_layer_types refuses other head_dims), read as pairs of halves.
  constexpr bool kBlocksOf64 = KT == kKvQ8_0x64 || VT == kKvQ8_0x64;
  switch (head_dim) {
    case 32:
      if constexpr (!kBlocksOf64) return Kernel<KT, VT, 1>::run;
      return nullptr;
    case 64:
      return Kernel<KT, VT, 2>::run;
    case 96:
      if constexpr (!kBlocksOf64) return Kernel<KT, VT, 3>::run;
      return nullptr;
    case 128:
      return Kernel<KT, VT, 4>::run;
    case 256:
      return Kernel<KT, VT, 8>::run;
    default:
      return nullptr;
  }
}

template <template <DType, DType, int> class Kernel, DType KT>
QuantTileAttend tile_for_v(DType v, int64_t head_dim) {
  switch (v) {
    case DType::kF32:
      return tile_for_head<Kernel, KT, DType::kF32>(head_dim);
    case DType::kF16:
      return tile_for_head<Kernel, KT, DType::kF16>(head_dim);
    case DType::kBF16:
      return tile_for_head<Kernel, KT, DType::kBF16>(head_dim);
    case DType::kQ8_0:
      return tile_for_head<Kernel, KT, DType::kQ8_0>(head_dim);
    case DType::kQ4_0:
      return tile_for_head<Kernel, KT, DType::kQ4_0>(head_dim);
    case DType::kQ4_1:
      return tile_for_head<Kernel, KT, DType::kQ4_1>(head_dim);
    case DType::kQ5_0:
      return tile_for_head<Kernel, KT, DType::kQ5_0>(head_dim);
    case DType::kQ5_1:
      return tile_for_head<Kernel, KT, DType::kQ5_1>(head_dim);
    case DType::kIQ4_NL:
      return tile_for_head<Kernel, KT, DType::kIQ4_NL>(head_dim);
    default:
      if (v == kKvQ8_0x64) return tile_for_head<Kernel, KT, kKvQ8_0x64>(head_dim);
      return nullptr;
  }
}

// The instantiation for K type k, V type v and head_dim, or nullptr.
template <template <DType, DType, int> class Kernel>
QuantTileAttend tile_for(DType k, DType v, int64_t head_dim) {
  switch (k) {
    case DType::kF32:
      return tile_for_v<Kernel, DType::kF32>(v, head_dim);
    case DType::kF16:
      return tile_for_v<Kernel, DType::kF16>(v, head_dim);
    case DType::kBF16:
      return tile_for_v<Kernel, DType::kBF16>(v, head_dim);
    case DType::kQ8_0:
      return tile_for_v<Kernel, DType::kQ8_0>(v, head_dim);
    case DType::kQ4_0:
      return tile_for_v<Kernel, DType::kQ4_0>(v, head_dim);
    case DType::kQ4_1:
      return tile_for_v<Kernel, DType::kQ4_1>(v, head_dim);
    case DType::kQ5_0:
      return tile_for_v<Kernel, DType::kQ5_0>(v, head_dim);
    case DType::kQ5_1:
      return tile_for_v<Kernel, DType::kQ5_1>(v, head_dim);
    case DType::kIQ4_NL:
      return tile_for_v<Kernel, DType::kIQ4_NL>(v, head_dim);
    default:
      if (k == kKvQ8_0x64) return tile_for_v<Kernel, kKvQ8_0x64>(v, head_dim);
      // fp8 (--kv-type fp8) with fp8 only: a mix of it with another type
      // takes the per-query kernel (no instantiations for pairs nobody names).
      if (k == kF8E4M3 && v == kF8E4M3) return tile_for_head<Kernel, kF8E4M3, kF8E4M3>(head_dim);
      return nullptr;
  }
}

}  // namespace
}  // namespace rill::cpu::detail
