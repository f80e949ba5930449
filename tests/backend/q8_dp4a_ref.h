#pragma once
// A host restatement of the Q8_0 dp4a decode GEMV (src/backend/cuda/
// q8_dp4a_order.h): quantize_x8's rounding of x and the kernel's order of
// f32 operations, so a device result can be held to it bit for bit (the
// integer sums are exact; only the float order matters). Plain C++, used
// by the CPU test of the restatement (q8_dp4a_ref_test.cpp) and the device
// test (tests/cuda/q8_dp4a_test.cpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cuda/q8_dp4a_order.h"
#include "core/half.h"

namespace rill::testing {

// x [n, cols] quantized as quantize_x8 does, in plain column order:
// q[t * cols + c], d[t * (cols / 32) + b].
struct X8 {
  std::vector<int8_t> q;
  std::vector<float> d;
};

// Per token and 32 columns: d = max |x| / 127 (f32 division), q = x / d
// (f32 division) rounded to nearest even; an all-zero block: d = 0, q = 0.
inline X8 quantize_x8_ref(const std::vector<float>& x, int64_t n, int64_t cols) {
  X8 r;
  r.q.assign(static_cast<size_t>(n * cols), 0);
  r.d.assign(static_cast<size_t>(n * cols / 32), 0.0f);
  for (int64_t b = 0; b < n * cols / 32; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[static_cast<size_t>(b * 32 + i)]));
    const float d = amax / 127.0f;
    r.d[static_cast<size_t>(b)] = d;
    if (!(amax > 0.0f)) continue;
    for (int i = 0; i < 32; ++i) {
      const size_t k = static_cast<size_t>(b * 32 + i);
      const float v = x[k] / d;
      r.q[k] = static_cast<int8_t>(std::nearbyint(v));  // the default rounding mode: to nearest even
    }
  }
  return r;
}

// Block b of a GGUF Q8_0 row: its scale (f16 at byte 0) and code c (byte 2 + c).
inline float q8_scale(const uint8_t* row, int64_t b) {
  uint16_t h;
  std::memcpy(&h, row + 34 * b, 2);
  return f16_to_f32(h);
}
inline int q8_code(const uint8_t* row, int64_t b, int c) {
  return static_cast<int8_t>(row[34 * b + 2 + c]);
}

// The unit's exact integer dot: block b = u / 2, half h = u % 2 covers block
// columns 8h .. 8h + 7 and 16 + 8h .. 16 + 8h + 7.
inline int32_t unit_isum(const uint8_t* row, const int8_t* xq, int64_t u) {
  const int64_t b = u / 2;
  const int h = static_cast<int>(u % 2);
  int32_t s = 0;
  for (int k = 0; k < 8; ++k) {
    for (int c : {8 * h + k, 16 + 8 * h + k}) s += q8_code(row, b, c) * xq[32 * b + c];
  }
  return s;
}

// y for one GGUF Q8_0 row and one token (xq / dx: that token's codes and
// scales), in the kernel's order; accumulate: onto y0.
inline float q8_dp4a_row_ref(const uint8_t* row, const int8_t* xq, const float* dx, int64_t cols,
                             bool accumulate = false, float y0 = 0.0f) {
  const int64_t n_units = cols / rill::cuda::kQ8Dp4aUnitCols;
  const int n_parts = rill::cuda::q8_dp4a_parts(cols);
  float s = 0.0f;
  for (int p = 0; p < n_parts; ++p) {
    float v[32];
    for (int l = 0; l < 32; ++l) {
      float acc = 0.0f;
      for (int64_t u = 32 * p + l; u < n_units; u += 32 * n_parts) {
        const float prod = dx[u / 2] * static_cast<float>(unit_isum(row, xq, u));
        acc = std::fma(q8_scale(row, u / 2), prod, acc);
      }
      v[l] = acc;
    }
    for (int o = 16; o > 0; o >>= 1) {
      float nv[32];
      for (int l = 0; l < 32; ++l) nv[l] = v[l] + v[l ^ o];
      std::memcpy(v, nv, sizeof v);
    }
    s = p == 0 ? v[0] : s + v[0];
  }
  return accumulate ? y0 + s : s;
}

// |y - sum_c w[c] x[c]| (f64, x unquantized) over its bound
// sum_c |w[c]| d_x / 2 + 1e-5 sum_c |w[c] x[c]| (the rounding of x to int8,
// and f32 sums of at most a few thousand terms): <= 1 is within it.
inline double q8_dp4a_error_over_bound(float y, const uint8_t* row, const float* x, const float* dx, int64_t cols) {
  double s = 0, a = 0, bound = 0;
  for (int64_t c = 0; c < cols; ++c) {
    const double w = static_cast<double>(q8_scale(row, c / 32)) * q8_code(row, c / 32, static_cast<int>(c % 32));
    s += w * x[c];
    a += std::fabs(w * x[c]);
    bound += std::fabs(w) * (0.5 * dx[c / 32]);
  }
  return std::fabs(static_cast<double>(y) - s) / (bound + 1e-5 * a + 1e-30);
}

}  // namespace rill::testing
