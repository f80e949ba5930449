// glu_narrow: the gated linear unit of a fused gate/up product stored in
// 16 bits (Gemm::run_narrow's F16/BF16 output), for Backend::matmul_glu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace rill::cuda {

// gate_up: n_rows rows of [gate (n_ff) | up (n_ff)] in in_dtype (F16 or
// BF16); out[r, i] = act(gate[r, i]) * up[r, i] in out_dtype, computed in
// f32 with the formulas of silu_mul / gelu_tanh_mul (ops.h): within an ulp of
// those kernels' results on the f32 values of the 16-bit inputs (the
// compiler may contract the arithmetic differently).
void glu_narrow(bool gelu, DType in_dtype, const void* gate_up, int64_t n_rows, int64_t n_ff, DType out_dtype,
                void* out, cudaStream_t stream);

// Whether the CUDA backend's matmul_glu takes the 16-bit gate/up route for
// dense BF16 weights (cuda_backend.cpp): on unless the environment sets
// RILL_GLU_NARROW=0 (read once), which keeps gate/up in f32 as before the
// route existed, for an A/B in one binary. KV numerics name the route
// ("glu=bf16") only when it is on.
bool glu_narrow_on();

}  // namespace rill::cuda
