#include "backend/cpu/kernels.h"

#include <cassert>

#include "backend/cpu/gemm_kquant_amx.h"
#include "backend/cpu/quants.h"

namespace rill::cpu {
namespace {

template <DType W>
void ref_gemm(int64_t n, const void* w, size_t w_stride, int n_r, const void* a, size_t a_stride, int n_t, float* y,
              int64_t y_stride) {
  ref::gemm_tile(W, n, w, w_stride, n_r, a, a_stride, n_t, y, y_stride);
}

constexpr size_t id(DType t) {
  return static_cast<size_t>(t);
}

Kernels make_scalar() {
  Kernels k;
  k.isa = Isa::kScalar;
  k.gemm[id(DType::kF32)] = ref_gemm<DType::kF32>;
  k.gemm[id(DType::kF16)] = ref_gemm<DType::kF16>;
  k.gemm[id(DType::kBF16)] = ref_gemm<DType::kBF16>;
  k.gemm[id(DType::kQ4_0)] = ref_gemm<DType::kQ4_0>;
  k.gemm[id(DType::kQ4_1)] = ref_gemm<DType::kQ4_1>;
  k.gemm[id(DType::kQ5_0)] = ref_gemm<DType::kQ5_0>;
  k.gemm[id(DType::kQ5_1)] = ref_gemm<DType::kQ5_1>;
  k.gemm[id(DType::kQ8_0)] = ref_gemm<DType::kQ8_0>;
  k.gemm[id(DType::kQ4_K)] = ref_gemm<DType::kQ4_K>;
  k.gemm[id(DType::kQ5_K)] = ref_gemm<DType::kQ5_K>;
  k.gemm[id(DType::kQ6_K)] = ref_gemm<DType::kQ6_K>;
  k.gemm[id(DType::kMXFP4)] = ref_gemm<DType::kMXFP4>;
  k.gemm[id(DType::kQ2_K)] = ref_gemm<DType::kQ2_K>;
  k.gemm[id(DType::kQ3_K)] = ref_gemm<DType::kQ3_K>;
  k.gemm[id(DType::kIQ4_NL)] = ref_gemm<DType::kIQ4_NL>;
  k.gemm[id(DType::kIQ4_XS)] = ref_gemm<DType::kIQ4_XS>;
  k.quantize[id(DType::kQ8_0)] = ref::quantize_row_q8_0;
  k.quantize[id(DType::kQ8_1)] = ref::quantize_row_q8_1;
  k.quantize[id(DType::kQ8_K)] = ref::quantize_row_q8_k;
  k.rms_norm_row = ref::rms_norm_row;
  k.rms_scale_row = ref::rms_scale_row;
  k.silu_mul = ref::silu_mul;
  k.gelu_tanh_mul = ref::gelu_tanh_mul;
  k.add_inplace = ref::add_inplace;
  k.rope_rotate = ref::rope_rotate;
  k.attend_row = ref::attend_row;
  return k;
}

}  // namespace

const Kernels& kernels(Isa isa) {
  static const Kernels scalar = make_scalar();
  static const Kernels* avx2 = [] {
    if (!cpu_features().avx2) return static_cast<Kernels*>(nullptr);
    static Kernels k = scalar;
    fill_kernels_avx2(k);
    fill_iquant_avx2(k);
    return &k;
  }();
  static const Kernels* avx512 = [] {
    if (!cpu_features().avx512) return static_cast<Kernels*>(nullptr);
    static Kernels k = *avx2;
    fill_kernels_avx512(k);
    fill_iquant_avx512(k);
    fill_kquant_amx(k);  // over the AVX-512 K-quant entries where AMX works (gemm_kquant_amx.h)
    return &k;
  }();
  switch (isa) {
    case Isa::kScalar:
      return scalar;
    case Isa::kAvx2:
      assert(avx2);
      return *avx2;
    case Isa::kAvx512:
      assert(avx512);
      return *avx512;
  }
  return scalar;
}

const Kernels& kernels() {
  static const Kernels& best = kernels(best_isa());
  return best;
}

}  // namespace rill::cpu
