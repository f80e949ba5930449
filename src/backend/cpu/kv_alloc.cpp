#include "backend/cpu/kv_alloc.h"

#include <algorithm>
#include <cassert>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <queue>
#include <vector>

#include "core/e4m3.h"
#include "core/half.h"

namespace rill::cpu {
namespace {

double usable(double v) {
  return std::isfinite(v) && v > 0.0 ? v : 0.0;
}

uint32_t load_plane(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

void store_plane(uint32_t v, uint8_t* p) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace

int64_t rope_partner(int64_t c, int64_t head_dim, RopePairs pairs, int64_t rot_dim, int64_t rotated_pairs) {
  if (rot_dim == 0) rot_dim = head_dim;
  assert(head_dim > 0 && head_dim % 2 == 0 && rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= head_dim);
  const int64_t base = c - c % head_dim, i = c % head_dim, half = rot_dim / 2;
  if (i >= rot_dim) return c;
  const int64_t pair = pairs == RopePairs::kInterleaved ? i / 2 : i % half;
  if (rotated_pairs >= 0 && pair >= rotated_pairs) return c;
  if (pairs == RopePairs::kInterleaved) return base + (i ^ 1);
  return base + (i < half ? i + half : i - half);
}

void allocate_channel_bits(const double* query_energy, const double* mean_sq_range, int64_t width, int64_t head_dim,
                           RopePairs pairs, uint8_t* widths, bool one_bit, int64_t rot_dim, int64_t rotated_pairs) {
  assert(head_dim > 0 && head_dim % 2 == 0 && width % head_dim == 0);
  std::vector<double> w(static_cast<size_t>(width));
  bool any = false;
  for (int64_t c = 0; c < width; ++c) {
    const double q = 0.5 * (usable(query_energy[c]) +
                            usable(query_energy[rope_partner(c, head_dim, pairs, rot_dim, rotated_pairs)]));
    double v = q * usable(mean_sq_range[c]);
    if (!std::isfinite(v)) v = DBL_MAX;
    w[static_cast<size_t>(c)] = v;
    any = any || v > 0.0;
    widths[c] = 0;
  }
  if (!any) {
    for (int64_t c = 0; c < width; ++c) widths[c] = 4;
    return;
  }
  // A max-heap of (w_c 4^-b_c, -c): the top is the plain loop's choice
  // (the largest key, the lowest index among equal keys).
  struct Entry {
    double key;
    int64_t c;
    bool operator<(const Entry& o) const { return key < o.key || (key == o.key && c > o.c); }
  };
  std::vector<Entry> heap;
  heap.reserve(static_cast<size_t>(width));
  for (int64_t c = 0; c < width; ++c) heap.push_back({w[static_cast<size_t>(c)], c});
  if (!one_bit) {
    for (Entry& e : heap) e.key *= 0.625;  // every channel starts at 0: its move is 0 -> 2
  }
  std::priority_queue<Entry> pq(std::less<Entry>(), std::move(heap));
  for (int64_t left = 4 * width; left > 0;) {
    Entry top = pq.top();
    pq.pop();
    if (!one_bit && widths[top.c] == 0 && left == 1) {
      // One bit left: the best 1-bit move of a channel at 2..7 bits.
      std::vector<Entry> zeros{top};
      while (!pq.empty() && widths[pq.top().c] == 0) {
        zeros.push_back(pq.top());
        pq.pop();
      }
      if (!pq.empty()) {
        top = pq.top();
        pq.pop();
      } else {  // every other channel at 0 or 8: 1 bit to the best channel at 0
        top = zeros.front();
      }
    }
    const int step = !one_bit && widths[top.c] == 0 && left >= 2 ? 2 : 1;
    const int b = widths[top.c] += static_cast<uint8_t>(step);
    left -= step;
    if (b < kKvChanMaxBits) pq.push({std::ldexp(w[static_cast<size_t>(top.c)], -2 * b), top.c});
  }
}

void add_calibration_queries(double* query_energy, const float* q, int64_t n_head, int64_t n_head_kv, int64_t hd) {
  const int64_t group = n_head / n_head_kv;
  for (int64_t h = 0; h < n_head; ++h) {
    double* e = query_energy + (h / group) * hd;
    for (int64_t i = 0; i < hd; ++i) e[i] += double{q[h * hd + i]} * double{q[h * hd + i]};
  }
}

void add_calibration_token(double* query_energy, double* block_range_sq, float* block_min, float* block_max,
                           const float* q, const float* k, int32_t pos, int64_t n_head, int64_t n_head_kv, int64_t hd) {
  constexpr int32_t kT = kKvChanTokens;
  const int64_t W = n_head_kv * hd;
  add_calibration_queries(query_energy, q, n_head, n_head_kv, hd);
  if (pos % kT == 0) {
    std::fill(block_min, block_min + W, INFINITY);
    std::fill(block_max, block_max + W, -INFINITY);
  }
  if (pos != 0) {
    for (int64_t c = 0; c < W; ++c) {
      block_min[c] = std::min(block_min[c], k[c]);
      block_max[c] = std::max(block_max[c], k[c]);
    }
  }
  if (pos % kT == kT - 1) {
    for (int64_t c = 0; c < W; ++c) {
      const double r = double{block_max[c]} - double{block_min[c]};
      block_range_sq[c] += r * r;
    }
  }
}

int64_t alloc_block_bytes(const uint8_t* widths, int64_t width) {
  return alloc_plane_offset(widths, width, width);
}

int64_t alloc_plane_offset(const uint8_t* widths, int64_t width, int64_t c) {
  assert(c >= 0 && c <= width);
  int64_t bits = 0;
  for (int64_t i = 0; i < c; ++i) bits += widths[i];
  return 3 * width + 4 * bits;
}

void quantize_alloc_block(const float* rows, int64_t src_stride, int64_t width, const uint8_t* widths, uint8_t* dst,
                          bool sequence_start) {
  constexpr int kT = kKvChanTokens;
  uint8_t* d = dst + 2 * width;
  uint8_t* planes = dst + 3 * width;
  for (int64_t c = 0; c < width; ++c) {
    const int b = widths[c];
    assert(b >= 0 && b <= kKvChanMaxBits);
    float x[kT];
    for (int j = 0; j < kT; ++j) x[j] = rows[j * src_stride + c];
    ChanCodes codes;
    quantize_chan_values(x, b, sequence_start, &codes);
    std::memcpy(dst + 2 * c, &codes.z, 2);
    d[c] = codes.d;
    for (int k = 0; k < b; ++k, planes += 4) {
      uint32_t plane = 0;
      for (int j = 0; j < kT; ++j) plane |= uint32_t{(codes.q[j] >> k) & 1u} << j;
      store_plane(plane, planes);
    }
  }
}

void dequantize_alloc_block(const uint8_t* src, int64_t width, const uint8_t* widths, float* rows) {
  constexpr int kT = kKvChanTokens;
  const uint8_t* d = src + 2 * width;
  const uint8_t* planes = src + 3 * width;
  for (int64_t c = 0; c < width; ++c) {
    uint16_t zh;
    std::memcpy(&zh, src + 2 * c, 2);
    const float zf = f16_to_f32(zh), step = e4m3_value(d[c]) * (1.0f / 16.0f);
    int code[kT] = {};
    for (int k = 0; k < widths[c]; ++k, planes += 4) {
      const uint32_t plane = load_plane(planes);
      for (int j = 0; j < kT; ++j) code[j] |= static_cast<int>((plane >> j) & 1u) << k;
    }
    for (int j = 0; j < kT; ++j) rows[j * width + c] = zf + step * static_cast<float>(code[j]);
  }
}

AllocHead alloc_head(const uint8_t* block, int64_t width, const uint8_t* widths, int64_t plane_offset, int64_t head,
                     int64_t head_dim) {
  assert(plane_offset == alloc_plane_offset(widths, width, head * head_dim));
  AllocHead h;
  h.z = reinterpret_cast<const uint16_t*>(block) + head * head_dim;
  h.d = block + 2 * width + head * head_dim;
  h.planes = block + plane_offset;
  h.widths = widths + head * head_dim;
  h.head_dim = head_dim;
  return h;
}

void alloc_block_scores_ref(const AllocHead& h, const float* q, int n_rows, float* scores) {
  constexpr int kT = kKvChanTokens;
  for (int r = 0; r < n_rows; ++r) {
    const float* qr = q + r * h.head_dim;
    double s[kT];
    double qz = 0;
    for (int64_t c = 0; c < h.head_dim; ++c) qz += double{qr[c]} * double{f16_to_f32(h.z[c])};
    for (int j = 0; j < kT; ++j) s[j] = qz;
    const uint8_t* p = h.planes;
    for (int64_t c = 0; c < h.head_dim; ++c) {
      const double w = double{qr[c]} * double{e4m3_value(h.d[c]) * (1.0f / 16.0f)};
      for (int k = 0; k < h.widths[c]; ++k, p += 4) {
        const uint32_t plane = load_plane(p);
        const double wk = std::ldexp(w, k);
        for (int j = 0; j < kT; ++j) {
          if ((plane >> j) & 1u) s[j] += wk;
        }
      }
    }
    for (int j = 0; j < kT; ++j) scores[r * kT + j] = static_cast<float>(s[j]);
  }
}

}  // namespace rill::cpu
