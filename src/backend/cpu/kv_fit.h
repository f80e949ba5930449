#pragma once
// The rotated types' encoder's inner loop (kv_quant.cpp's fit_scale): the
// squared error of one block coded against each candidate scale. About 35
// candidates of a 32- or 64-value block per stored block make it the store's
// hot spot in a prefill (docs/perf.md, "the rotated encoder's candidates in
// vector lanes").
#include <cstdint>

namespace rill::cpu::detail {

// A rotated block's levels: iq4_nl's 16 (kIq4nlValues; the code of y is the
// count of midpoints strictly below it) or the integers [lo, hi] (the code
// of y is nearbyint(y) clamped, 0 for a NaN).
struct FitLevels {
  bool nl = false;
  int lo = 0, hi = 0;
};

// err[c] = sum over j in [0, n) in that order of (double(x_j) -
// double(value(code(x_j * id_c)) * d_c))^2, id_c = 1 / d_c (0 when d_c is
// 0), each step rounded as written (no fused multiply-add): the arithmetic
// of kv_quant.cpp's block_error, so the same candidate wins on every path
// and CUDA's encoder (kv_rotated.cuh) keeps storing the CPU's bytes.
// n is 32 or 64; d holds n_d candidates.
void fit_errors_ref(const float* x, int n, const float* d, int n_d, FitLevels lv, double* err);
// The same bits, eight candidates to a vector (each lane its own serial
// sum over j). AVX-512 (F, VL, DQ) only: cpu_features().avx512.
void fit_errors_avx512(const float* x, int n, const float* d, int n_d, FitLevels lv, double* err);
// The same bits, four candidates to a vector. AVX2 with FMA:
// cpu_features().avx2.
void fit_errors_avx2(const float* x, int n, const float* d, int n_d, FitLevels lv, double* err);

// k4c / k4a's K encoder (quantize_chan_values): one channel's 32 values x
// coded against zero zf and step (inv = 1 / step, 0 for a zero step):
// code[j] = nearbyint((x_j - zf) * inv) clamped to [0, n_levels] (0 for a
// NaN), sq[j] = (double(x_j) - double(zf + step * code[j]))^2, each step
// rounded as written. The caller sums sq in index order (in a file built
// without FMA), so the error is the scalar loop's.
void chan_codes_ref(const float* x, float zf, float step, float inv, int n_levels, int* code, double* sq);
// The same bits in vector lanes: AVX-512 (cpu_features().avx512), AVX2
// with FMA (cpu_features().avx2).
void chan_codes_avx512(const float* x, float zf, float step, float inv, int n_levels, int* code, double* sq);
void chan_codes_avx2(const float* x, float zf, float step, float inv, int n_levels, int* code, double* sq);

}  // namespace rill::cpu::detail
