#pragma once
// The online-softmax attention row shared by every ISA. Included by one
// file per ISA with that ISA's primitives; everything here has internal
// linkage so the per-ISA copies never merge at link time.
//
// Prims provides (n = head_dim, kv rows f32 or f16):
//   static float dot(const float* q, const void* k_row, int64_t n, bool f16);
//   static void scale(float* acc, float s, int64_t n);                 // acc *= s
//   static void axpy(float* acc, float a, const void* v_row, int64_t n, bool f16);  // acc += a*v
#include <cmath>
#include <cstdint>

#include "backend/cpu/kernels.h"

namespace rill::cpu {
namespace {

inline constexpr int64_t kMaxHeadDim = 512;

template <typename Prims>
void attend_row_impl(const AttendRowArgs& a) {
  constexpr int64_t kTile = 64;  // scores kept on the stack per tile of keys
  const int64_t n = a.head_dim;
  const PagedKv& kv = a.kv;

  alignas(64) float acc[kMaxHeadDim];
  for (int64_t d = 0; d < n; ++d) acc[d] = 0.0f;
  float s[kTile];
  float m = -INFINITY;  // running max
  float l = 0.0f;       // running sum of exp(score - m)
  for (int64_t j0 = a.j_begin; j0 < a.j_end; j0 += kTile) {
    const int64_t nt = a.j_end - j0 < kTile ? a.j_end - j0 : kTile;
    float tile_max = -INFINITY;
    for_each_row(kv, kv.k, j0, j0 + nt, [&](int64_t j, const uint8_t* k_row) {
      float x = Prims::dot(a.q, k_row, n, a.kv_f16) * a.scale;
      if (a.softcap > 0.0f) x = a.softcap * std::tanh(x / a.softcap);
      s[j - j0] = x;
      tile_max = x > tile_max ? x : tile_max;
    });
    if (tile_max > m) {
      const float corr = std::exp(m - tile_max);  // 0 on the first tile
      l *= corr;
      Prims::scale(acc, corr, n);
      m = tile_max;
    }
    for_each_row(kv, kv.v, j0, j0 + nt, [&](int64_t j, const uint8_t* v_row) {
      const float e = std::exp(s[j - j0] - m);
      l += e;
      Prims::axpy(acc, e, v_row, n, a.kv_f16);
    });
  }
  if (a.has_sink) {  // exp(sink) joins the denominator, against the larger of m and sink
    const float m2 = a.sink > m ? a.sink : m;
    const float corr = std::exp(m - m2);  // 0 without keys
    l = l * corr + std::exp(a.sink - m2);
    Prims::scale(acc, corr, n);
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (int64_t d = 0; d < n; ++d) a.out[d] = acc[d] * inv;
}

}  // namespace
}  // namespace rill::cpu
