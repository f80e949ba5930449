#pragma once
// Test hooks on the KV types' device helpers (tests/cuda/kv_probe_cuda_test.cpp),
// held there to their f32 routes and to the CPU's: synchronous, each
// allocates its own device buffers; not for the model's path.
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/result.h"

namespace rill::cuda {

// The f16 bits of one row of kv_dtype (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 or
// IQ4_NL; `row` holds whole blocks of 32, its elements n = row.size() /
// block bytes * 32; or IQ4_NL64, iq4_nlh64's blocks of 64),
// 8 elements at a time: via_h by mma_tile.cuh load8h<KvT> (the f16
// arithmetic of load8_biased's bytes), via_f32 by __floats2half2_rn of
// KvT::load8's f32 values. Either is n values. Refuses another type.
Status probe_load8h(DType kv_dtype, const std::vector<uint8_t>& row, std::vector<uint16_t>& via_h,
                    std::vector<uint16_t>& via_f32);

// kv_rotated.cuh Iq4nlLevels::code (iq4_nlh's 4-step midpoint search) of
// each of y.
Status probe_iq4nl_code(const std::vector<float>& y, std::vector<int>& codes);

// kv_rotated.cuh e4m3_round_bits (iq4_nlh64's scale byte of 16 d) of each of x.
Status probe_e4m3_round(const std::vector<float>& x, std::vector<uint8_t>& bytes);

// Host runs of the same device code (built for the host too: the tests
// that need no GPU): KvIq4Nl64's load1 / load4 / load8 over the n elements
// of a row in host memory (any address; the row's last word may be read
// whole), and e4m3_round_bits of each of x.
void host_iq4nl64_loads(const uint8_t* row, int64_t n, float* via_load1, float* via_load4, float* via_load8);
void host_e4m3_round(const std::vector<float>& x, std::vector<uint8_t>& bytes);

// Host runs of kv_types_ggml.cuh (bf16, q4_1, q5_0, q5_1: not yet run on a
// GPU). host_ggml_store: the n floats of x (n a multiple of 32) as a row of
// kv_dtype by the tags' own arithmetic (KvBf16::encode; the blocks' scale,
// inverse and code) and packing, with each block's minimum, maximum and
// element of largest magnitude found by a serial scan where the device
// store takes a warp reduction. host_ggml_loads: the row's n values through
// load1, load4 and load8, and for Q5_0 (else untouched) via_biased,
// load8_biased's codes as (code - kLevelBias) x the block's scale. Both
// false for another kv_dtype. A BF16 row must be 16-byte aligned.
bool host_ggml_store(DType kv_dtype, const float* x, int64_t n, uint8_t* row);
bool host_ggml_loads(DType kv_dtype, const uint8_t* row, int64_t n, float* via_load1, float* via_load4,
                     float* via_load8, float* via_biased);

}  // namespace rill::cuda
