#pragma once
// Test hooks on the KV types' device helpers (tests/cuda/kv_probe_cuda_test.cpp),
// held there to their f32 routes and to the CPU's: synchronous, each
// allocates its own device buffers; not for the model's path.
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/result.h"

namespace rill::cuda {

// The f16 bits of one row of kv_dtype (Q8_0, Q4_0 or IQ4_NL; `row` holds
// whole blocks of 32, its elements n = row.size() / block bytes * 32; or
// IQ4_NL64, iq4_nlh64's blocks of 64),
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

}  // namespace rill::cuda
