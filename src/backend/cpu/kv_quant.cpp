#include "backend/cpu/kv_quant.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kv_fit.h"
#include "backend/cpu/quants.h"
#include "core/e4m3.h"
#include "core/half.h"

namespace rill::cpu {
namespace {

// The element of largest magnitude (the first one on ties), with its sign.
float signed_absmax(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void min_max(const float* x, float* min, float* max) {
  *min = INFINITY;
  *max = -INFINITY;
  for (int j = 0; j < kQK; ++j) {
    *min = std::min(*min, x[j]);
    *max = std::max(*max, x[j]);
  }
}

void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    for (int j = 0; j < kQK; ++j) y[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    const float d = signed_absmax(x) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + kQK / 2] * id + 8.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quantize_q4_1(const float* x, BlockQ4_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float min = 0.0f, max = 0.0f;
    min_max(x, &min, &max);
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    y[i].m = f32_to_f16(min);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - min) * id + 0.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j + kQK / 2] - min) * id + 0.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// Q5_0 / Q5_1 share the packing: low nibbles as Q4, bit 4 of element j in qh bit j.
void pack5(const int* q, uint8_t* qs, uint8_t* qh_bytes) {
  uint32_t qh = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + kQK / 2] & 0xF) << 4));
    qh |= static_cast<uint32_t>((q[j] & 0x10) >> 4) << j;
    qh |= static_cast<uint32_t>((q[j + kQK / 2] & 0x10) >> 4) << (j + kQK / 2);
  }
  std::memcpy(qh_bytes, &qh, 4);
}

void quantize_q5_0(const float* x, BlockQ5_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    const float d = signed_absmax(x) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    int q[kQK];
    for (int j = 0; j < kQK; ++j) q[j] = std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f)));
    pack5(q, y[i].qs, y[i].qh);
  }
}

void quantize_q5_1(const float* x, BlockQ5_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float min = 0.0f, max = 0.0f;
    min_max(x, &min, &max);
    const float d = (max - min) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    y[i].m = f32_to_f16(min);
    int q[kQK];
    for (int j = 0; j < kQK; ++j) {
      q[j] = std::min(31, static_cast<int>(static_cast<int8_t>((x[j] - min) * id + 0.5f)));
    }
    pack5(q, y[i].qs, y[i].qh);
  }
}

// The integer nearest y (nearbyint), clamped to [lo, hi] as a float before
// the conversion: a float outside int's range converts to undefined
// behaviour. A NaN (from a block holding one, whose every candidate's error
// is NaN) is code 0 clamped, as CUDA's __float2int_rn makes it.
int nearest_code(float y, int lo, int hi) {
  const float r = std::nearbyint(y);
  if (std::isnan(r)) return std::clamp(0, lo, hi);
  return static_cast<int>(std::clamp(r, static_cast<float>(lo), static_cast<float>(hi)));
}

// The levels of a rotated block: code q stands for value(q) * d.
// Uniform: the integers [lo, hi] (q4_0: -8..7, q8_0: -127..127), the
// nearest by nearbyint, clamped. Nl: iq4_nl's 16 levels (kIq4nlValues,
// GGML's IQ4_NL), spaced for a near-Gaussian block: the code of y is the
// number of midpoints (v[i] + v[i+1]) / 2 strictly below y (exact in f32),
// i.e. the nearest level, the lower one on a tie.
struct UniformLevels {
  int lo, hi;
  float first() const { return static_cast<float>(lo); }
  float last() const { return static_cast<float>(hi); }
  int code(float y) const { return nearest_code(y, lo, hi); }
  float value(int q) const { return static_cast<float>(q); }
  detail::FitLevels spec() const { return {false, lo, hi}; }
};
struct NlLevels {
  float first() const { return static_cast<float>(kIq4nlValues[0]); }
  float last() const { return static_cast<float>(kIq4nlValues[15]); }
  int code(float y) const {
    int q = 0;
    for (int i = 0; i < 15; ++i) {
      q += y > 0.5f * static_cast<float>(kIq4nlValues[i] + kIq4nlValues[i + 1]) ? 1 : 0;
    }
    return q;
  }
  float value(int q) const { return static_cast<float>(kIq4nlValues[q]); }
  detail::FitLevels spec() const { return {true, 0, 15}; }
};

// How a rotated block's scale d is stored: f16 (q4_0h, q8_0h, iq4_nlh) or
// an e4m3 byte holding d * 16 (iq4_nlh64: d in 2^-13 .. 28, a value of a
// block up to 28 * 127 = 3,556).
// A NaN d (the block holds a NaN or an inf) is stored as the positive f16
// NaN 0x7e00: a NaN's sign is the device's choice (x86 makes negative ones,
// CUDA positive), and CUDA's encoder (kv_rotated.cuh) stores the same bytes.
struct F16Scale {
  using Bits = uint16_t;
  Bits round(float d) const { return std::isnan(d) ? Bits{0x7e00} : f32_to_f16(d); }
  float value(Bits b) const { return f16_to_f32(b); }
};
struct E4m3x16Scale {
  using Bits = uint8_t;
  Bits round(float d) const { return e4m3_round(d * 16.0f); }
  float value(Bits b) const { return e4m3_value(b) * (1.0f / 16.0f); }
};

// The squared error of a block of N stored as value(q[j]) * d, q[j] the
// code of x[j] / d.
template <int N, class Levels>
double block_error(const float* x, float d, const Levels& lv, int* q) {
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  double err = 0;
  for (int j = 0; j < N; ++j) {
    q[j] = lv.code(x[j] * id);
    const double e = double{x[j]} - double{lv.value(q[j]) * d};
    err += e * e;
  }
  return err;
}
// The same for iq4_nl's levels, the codes counted midpoint by midpoint over
// the whole block (NlLevels::code's rule, in a loop the compiler
// vectorizes: the store is the rotated types' hot spot).
template <int N>
double block_error(const float* x, float d, const NlLevels& lv, int* q) {
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  float y[N];
  for (int j = 0; j < N; ++j) {
    y[j] = x[j] * id;
    q[j] = 0;
  }
  for (int i = 0; i < 15; ++i) {
    const float mid = 0.5f * static_cast<float>(kIq4nlValues[i] + kIq4nlValues[i + 1]);
    for (int j = 0; j < N; ++j) q[j] += y[j] > mid ? 1 : 0;
  }
  double err = 0;
  for (int j = 0; j < N; ++j) {
    const double e = double{x[j]} - double{lv.value(q[j]) * d};
    err += e * e;
  }
  return err;
}

template <int N>
void fit_errors_n(const float* x, const float* d, int n_d, detail::FitLevels lv, double* err) {
  int q[N];
  for (int c = 0; c < n_d; ++c) {
    err[c] = lv.nl ? block_error<N>(x, d[c], NlLevels{}, q) : block_error<N>(x, d[c], UniformLevels{lv.lo, lv.hi}, q);
  }
}

}  // namespace

void detail::fit_errors_ref(const float* x, int n, const float* d, int n_d, FitLevels lv, double* err) {
  if (n == 2 * kQK) {
    fit_errors_n<2 * kQK>(x, d, n_d, lv, err);
  } else {
    fit_errors_n<kQK>(x, d, n_d, lv, err);
  }
}

void detail::chan_codes_ref(const float* x, float zf, float step, float inv, int n_levels, int* code, double* sq) {
  for (int j = 0; j < kKvChanTokens; ++j) {
    code[j] = nearest_code((x[j] - zf) * inv, 0, n_levels);
    const double e = double{x[j]} - double{zf + step * static_cast<float>(code[j])};
    sq[j] = e * e;
  }
}

namespace {

// Rotated types are rill's own (no GGUF file holds them), so their encoder
// is free to choose each block's levels and scale. Levels: those of the
// scale with the least squared error (a rotated head is close to Gaussian,
// whose max-abs scale spends levels on the tails). Tried: d from the signed
// maximum onto the first or onto the last level, each times 1, 0.975, ...,
// 0.6, then a least-squares refit of d to the best candidate's levels;
// errors with d rounded as stored (Scale). Scale: then refit so the block is
// not shrunk (x_hat . x = x . x): least-squares scales shrink every block a
// little, which does not average out over a context as noise does: shrunk
// V damps every attention output and shrunk K flattens every softmax.
// Measured on the default model (docs/perf.md, q4_0h, 1,024 tokens): least
// squares alone cut KL 5% but raised perplexity from +5.7% to +9.2% over
// f16; with the refit +5.2%. Returns d's stored bits; q the codes. About 35
// candidates of N multiply-rounds per block: ~1M operations per token of
// the default model (q4_0h; iq4_nlh's 15 compares per element cost more),
// the grid's 34 in vector lanes on AVX-512 and AVX2 (kv_fit.h: the same bits).
template <int N, class Levels, class Scale = F16Scale>
typename Scale::Bits fit_scale(const float* x, const Levels& lv, int* q, Scale sc = {}) {
  float m = 0.0f, amax = 0.0f;  // the signed absolute maximum, the first on ties
  for (int j = 0; j < N; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      m = x[j];
    }
  }
  if (m == 0.0f) {
    std::fill(q, q + N, lv.code(0.0f));
    return sc.round(0.0f);
  }
  // Codes of a zero scale until a candidate wins: none does when the block
  // holds a NaN or a scale overflows its format (every error is then NaN).
  std::fill(q, q + N, lv.code(0.0f));
  constexpr int kGrid = 34;
  typename Scale::Bits grid_bits[kGrid];
  float grid[kGrid];
  int c = 0;
  for (const float top : {lv.first(), lv.last()}) {
    for (int i = 0; i <= 16; ++i, ++c) {
      grid_bits[c] = sc.round(m / top * (1.0f - 0.025f * static_cast<float>(i)));
      grid[c] = sc.value(grid_bits[c]);
    }
  }
  double grid_err[kGrid];
  if (cpu_features().avx512) {
    detail::fit_errors_avx512(x, N, grid, kGrid, lv.spec(), grid_err);
  } else if (cpu_features().avx2) {
    detail::fit_errors_avx2(x, N, grid, kGrid, lv.spec(), grid_err);
  } else {
    detail::fit_errors_ref(x, N, grid, kGrid, lv.spec(), grid_err);
  }
  double best = INFINITY;
  typename Scale::Bits best_d = 0;
  int best_c = -1;
  for (c = 0; c < kGrid; ++c) {  // the first of least error; NaN never wins
    if (grid_err[c] < best) {
      best = grid_err[c];
      best_c = c;
    }
  }
  if (best_c >= 0) {
    best_d = grid_bits[best_c];
    block_error<N>(x, grid[best_c], lv, q);  // its codes
  }
  int cand[N];
  auto consider = [&](float d) {
    const typename Scale::Bits dh = sc.round(d);
    const double err = block_error<N>(x, sc.value(dh), lv, cand);
    if (err < best) {
      best = err;
      best_d = dh;
      std::copy(cand, cand + N, q);
    }
  };
  double xx = 0, xq = 0, qq = 0;
  for (int j = 0; j < N; ++j) {
    xq += double{x[j]} * lv.value(q[j]);
    qq += static_cast<double>(lv.value(q[j])) * lv.value(q[j]);
  }
  if (qq > 0) consider(static_cast<float>(xq / qq));
  xq = 0;
  for (int j = 0; j < N; ++j) {
    xx += double{x[j]} * x[j];
    xq += double{x[j]} * lv.value(q[j]);
  }
  return xq != 0 ? sc.round(static_cast<float>(xx / xq)) : best_d;
}

void quantize_q4_0_fit(const float* x, BlockQ4_0* y, int64_t nb) {
  int q[kQK];
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    y[i].d = fit_scale<kQK>(x, UniformLevels{-8, 7}, q);
    for (int j = 0; j < kQK / 2; ++j) y[i].qs[j] = static_cast<uint8_t>((q[j] + 8) | ((q[j + kQK / 2] + 8) << 4));
  }
}

void quantize_q8_0_fit(const float* x, BlockQ8_0* y, int64_t nb) {
  int q[kQK];
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    y[i].d = fit_scale<kQK>(x, UniformLevels{-127, 127}, q);
    for (int j = 0; j < kQK; ++j) y[i].qs[j] = static_cast<int8_t>(q[j]);
  }
}

// GGML's IQ4_NL block (nibbles as Q4_0's: element j low, j + 16 high).
void quantize_iq4_nl_fit(const float* x, BlockIQ4_NL* y, int64_t nb) {
  int q[kQK];
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    y[i].d = fit_scale<kQK>(x, NlLevels{}, q);
    for (int j = 0; j < kQK / 2; ++j) y[i].qs[j] = static_cast<uint8_t>(q[j] | (q[j + kQK / 2] << 4));
  }
}

// iq4_nlh64's blocks of 64 (kKvIq4Nl64): the e4m3 byte of d * 16, then
// element j < 32 in the low nibble of byte 1 + j, j + 32 in its high nibble.
void quantize_iq4_nl64_fit(const float* x, uint8_t* y, int64_t nb) {
  constexpr int kN = 2 * kQK;
  int q[kN];
  for (int64_t i = 0; i < nb; ++i, x += kN, y += kIq4Nl64Bytes) {
    y[0] = fit_scale<kN>(x, NlLevels{}, q, E4m3x16Scale{});
    for (int j = 0; j < kN / 2; ++j) y[1 + j] = static_cast<uint8_t>(q[j] | (q[j + kN / 2] << 4));
  }
}

// q8_0h64's blocks of 64 (kKvQ8_0x64): the f16 d, then the 64 int8 codes.
void quantize_q8_0x64_fit(const float* x, uint8_t* y, int64_t nb) {
  constexpr int kN = 2 * kQK;
  int q[kN];
  for (int64_t i = 0; i < nb; ++i, x += kN, y += kQ8_0x64Bytes) {
    const uint16_t d = fit_scale<kN>(x, UniformLevels{-127, 127}, q);
    std::memcpy(y, &d, 2);
    for (int j = 0; j < kN; ++j) y[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(q[j]));
  }
}

// f16 bits of the largest f16 value <= x (x finite, within f16's range).
uint16_t f16_at_or_below(float x) {
  uint16_t h = f32_to_f16(x);
  if (f16_to_f32(h) > x)
    h = (h & 0x8000) ? static_cast<uint16_t>(h + 1) : h == 0 ? uint16_t{0x8001} : static_cast<uint16_t>(h - 1);
  return h;
}

}  // namespace

void quantize_chan_values(const float* values, int bits, bool sequence_start, ChanCodes* out) {
  assert(bits >= 0 && bits <= kKvChanMaxBits);
  constexpr int kT = kKvChanTokens;
  const int n_levels = (1 << bits) - 1;  // L: codes 0..L
  // Token 0's weight in a candidate's error (1 elsewhere, and for token 0
  // of any other block: the same sums as a plain squared error).
  const double w0 = sequence_start ? kKvChanSinkWeight : 1.0;
  float x[kT];
  float mn = INFINITY, mx = -INFINITY;
  for (int j = 0; j < kT; ++j) {
    x[j] = values[j];
    mn = std::min(mn, x[j]);
    mx = std::max(mx, x[j]);
  }
  uint16_t best_z = f16_at_or_below(mn);
  uint8_t best_code = 0;
  uint8_t* q = out->q;
  std::fill(q, q + kT, uint8_t{0});
  if (bits == 0) {
    // No codes: z alone, the least squared error's (the mean), or token 0
    // at a sequence's start; a non-finite mean keeps the f16 at or below
    // the minimum (what the coded widths store for such a channel).
    double mean = x[0];
    if (!sequence_start) {
      double sum = 0;
      for (int j = 0; j < kT; ++j) sum += double{x[j]};
      mean = sum / kT;
    }
    if (std::isfinite(mean)) best_z = f32_to_f16(static_cast<float>(mean));
    out->z = best_z;
    out->d = 0;
    return;
  }
  double best = INFINITY;
  // The squared error of x stored as zero zh and step code `code`, its
  // codes into cand.
  int cand[kT];
  static_assert(kT == 32, "chan_codes_* take 32 values");
  const auto codes = cpu_features().avx512 ? detail::chan_codes_avx512
                     : cpu_features().avx2 ? detail::chan_codes_avx2
                                           : detail::chan_codes_ref;
  auto error_of = [&](uint16_t zh, uint8_t code) {
    const float zf = f16_to_f32(zh), step = e4m3_value(code) * (1.0f / 16.0f);
    const float inv = step > 0.0f ? 1.0f / step : 0.0f;
    double sq[kT];
    codes(x, zf, step, inv, n_levels, cand, sq);
    double err = 0;
    for (int j = 0; j < kT; ++j) err += (j == 0 ? w0 : 1.0) * sq[j];
    return err;
  };
  auto consider = [&](uint16_t zh, uint8_t code) {
    const double err = error_of(zh, code);
    if (err < best) {
      best = err;
      best_z = zh;
      best_code = code;
      for (int j = 0; j < kT; ++j) q[j] = static_cast<uint8_t>(cand[j]);
    }
  };
  const float z_lo = f16_to_f32(best_z);
  if (mx > z_lo) {
    // The e4m3 steps around (max - z) / L, z the f16 at or below the
    // minimum: the nearest, one below (clipping the top codes) and three
    // above (widening every step). For each, z as is and then z refit to
    // the mean of x - d q (the grid's offset by least squares: an e4m3
    // step is rounded by up to 1/16, which a fixed z at the minimum
    // cannot take up). The least squared error wins, the first on ties.
    const int c0 = e4m3_round((mx - z_lo) / static_cast<float>(n_levels) * 16.0f);
    const uint16_t z0 = best_z;
    for (int code = std::max(1, c0 - 1); code <= std::min(0x7e, c0 + 3); ++code) {
      const auto k = static_cast<uint8_t>(code);
      consider(z0, k);  // leaves the codes of (z0, k) in cand, won or not
      const float step = e4m3_value(k) * (1.0f / 16.0f);
      double sum = 0;
      for (int j = 0; j < kT; ++j) sum += double{x[j]} - double{step} * cand[j];
      consider(f32_to_f16(static_cast<float>(sum / kT)), k);
      if (sequence_start) {
        // The grids through the sequence's first key: z = x_0 - d q for
        // each code q, so x_0 is held to within z's f16 rounding.
        for (int code0 = 0; code0 <= n_levels; ++code0) {
          consider(f32_to_f16(x[0] - step * static_cast<float>(code0)), k);
        }
      }
    }
  }
  out->z = best_z;
  out->d = best_code;
}

void quantize_chan_block(const float* rows, int64_t src_stride, int64_t width, uint8_t* dst, bool sequence_start) {
  constexpr int kT = kKvChanTokens;
  auto* z = reinterpret_cast<uint16_t*>(dst);
  uint8_t* d = dst + 2 * width;
  uint8_t* qs = dst + 3 * width;
  for (int64_t c = 0; c < width; ++c) {
    float x[kT];
    for (int j = 0; j < kT; ++j) x[j] = rows[j * src_stride + c];
    ChanCodes codes;
    quantize_chan_values(x, 4, sequence_start, &codes);
    const uint8_t* q = codes.q;
    z[c] = codes.z;
    d[c] = codes.d;
    for (int j = 0; j < kT / 2; ++j) qs[c * (kT / 2) + j] = static_cast<uint8_t>(q[j] | (q[j + kT / 2] << 4));
  }
}

void dequantize_chan_block(const uint8_t* src, int64_t width, float* rows) {
  constexpr int kT = kKvChanTokens;
  const auto* z = reinterpret_cast<const uint16_t*>(src);
  const uint8_t* d = src + 2 * width;
  const uint8_t* qs = src + 3 * width;
  for (int64_t c = 0; c < width; ++c) {
    const float zf = f16_to_f32(z[c]), step = e4m3_value(d[c]) * (1.0f / 16.0f);
    for (int j = 0; j < kT / 2; ++j) {
      const uint8_t b = qs[c * (kT / 2) + j];
      rows[j * width + c] = zf + step * static_cast<float>(b & 0xF);
      rows[(j + kT / 2) * width + c] = zf + step * static_cast<float>(b >> 4);
    }
  }
}

void hadamard_rotate(float* x, int64_t n) {
  assert(n > 0 && (n & (n - 1)) == 0);
  for (int64_t len = 1; len < n; len <<= 1) {
    for (int64_t i = 0; i < n; i += 2 * len) {
      for (int64_t j = i; j < i + len; ++j) {
        const float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
    }
  }
  const float s = 1.0f / std::sqrt(static_cast<float>(n));
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

bool kv_dtype_supported(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kIQ4_NL:  // rotated only (iq4_nlh): check_kv_layer_types refuses it plain
      return true;
    default:
      return t == kF8E4M3 || kv_chan_k(t) || t == kKvIq4Nl64 || t == kKvQ8_0x64;
  }
}

namespace ref {

void quantize_kv_row(DType t, const float* x, void* y, int64_t n) {
  const int64_t nb = n / kQK;
  if (t == kF8E4M3) {  // CUDA's rounding (cvt.rn.satfinite): the same bytes on both devices
    for (int64_t j = 0; j < n; ++j) static_cast<uint8_t*>(y)[j] = e4m3_round(x[j]);
    return;
  }
  switch (t) {
    case DType::kF32:
      std::memcpy(y, x, static_cast<size_t>(n) * 4);
      return;
    case DType::kF16:
      for (int64_t j = 0; j < n; ++j) static_cast<uint16_t*>(y)[j] = f32_to_f16(x[j]);
      return;
    case DType::kBF16:
      for (int64_t j = 0; j < n; ++j) static_cast<uint16_t*>(y)[j] = f32_to_bf16(x[j]);
      return;
    case DType::kQ8_0:
      assert(n % kQK == 0);
      return quantize_q8_0(x, static_cast<BlockQ8_0*>(y), nb);
    case DType::kQ4_0:
      assert(n % kQK == 0);
      return quantize_q4_0(x, static_cast<BlockQ4_0*>(y), nb);
    case DType::kQ4_1:
      assert(n % kQK == 0);
      return quantize_q4_1(x, static_cast<BlockQ4_1*>(y), nb);
    case DType::kQ5_0:
      assert(n % kQK == 0);
      return quantize_q5_0(x, static_cast<BlockQ5_0*>(y), nb);
    case DType::kQ5_1:
      assert(n % kQK == 0);
      return quantize_q5_1(x, static_cast<BlockQ5_1*>(y), nb);
    default:
      assert(false && "quantize_kv_row: not a KV dtype");
  }
}

}  // namespace ref

void store_kv_row(DType t, bool rotated, const float* src, uint8_t* dst, int64_t n_head, int64_t head_dim) {
  if (!rotated) {
    ref::quantize_kv_row(t, src, dst, n_head * head_dim);
    return;
  }
  thread_local std::vector<float> tmp;  // grows to the widest row once
  tmp.assign(src, src + n_head * head_dim);
  for (int64_t h = 0; h < n_head; ++h) hadamard_rotate(tmp.data() + h * head_dim, head_dim);
  quantize_rotated_row(t, tmp.data(), dst, n_head * head_dim);
}

void store_chan_tail_rows(const float* k, const float* v, bool v_rotated, int64_t n_head, int64_t head_dim,
                          uint8_t* k_dst, uint8_t* v_dst) {
  const int64_t n = n_head * head_dim;
  assert(n % kQK == 0);
  ref::quantize_kv_row(kKvChanTailType, k, k_dst, n);
  if (!v_rotated) return ref::quantize_kv_row(kKvChanTailType, v, v_dst, n);
  thread_local std::vector<float> tmp;
  tmp.assign(v, v + n);
  for (int64_t h = 0; h < n_head; ++h) hadamard_rotate(tmp.data() + h * head_dim, head_dim);
  ref::quantize_kv_row(kKvChanTailType, tmp.data(), v_dst, n);
}

void quantize_rotated_row(DType t, const float* x, void* y, int64_t n) {
  switch (t) {
    case DType::kQ4_0:
      return quantize_q4_0_fit(x, static_cast<BlockQ4_0*>(y), n / kQK);
    case DType::kQ8_0:
      return quantize_q8_0_fit(x, static_cast<BlockQ8_0*>(y), n / kQK);
    case DType::kIQ4_NL:
      return quantize_iq4_nl_fit(x, static_cast<BlockIQ4_NL*>(y), n / kQK);
    default:
      if (t == kKvIq4Nl64) return quantize_iq4_nl64_fit(x, static_cast<uint8_t*>(y), n / (2 * kQK));
      if (t == kKvQ8_0x64) return quantize_q8_0x64_fit(x, static_cast<uint8_t*>(y), n / (2 * kQK));
      return ref::quantize_kv_row(t, x, y, n);
  }
}

}  // namespace rill::cpu
