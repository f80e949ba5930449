// AVX-512 version of attend_f16_rounded reproducing llama.cpp's arithmetic
// on an AVX-512 CPU bit for bit (its non-flash attention over an f16 cache):
//  - q.k: for a batch of >= 2 queries llama.cpp's mul_mat takes tinyBLAS
//    (one 16-lane f32 accumulator stepping 16 dims, then a horizontal add);
//    for a single query ggml_vec_dot_f16 (4 accumulators of 16 lanes over
//    64-dim steps, combined (x0 + x2) + (x1 + x3), then the horizontal add);
//  - softmax: score * scale, max, exp with ggml's AVX-512 expf in 16-key
//    chunks aligned at key 0, the chunk sums (horizontal adds) summed in
//    double, probabilities * (float)(1 / sum), rounded to f16;
//  - p.v: the same two dot structures over the keys (lane = key % 16, or
//    key % 64 for a single query), per output dim.
// The horizontal add is GCC's _mm512_reduce_add_ps order, written out.
#include "backend/cpu/attention_f16_avx512_impl.h"

namespace rill::cpu::detail {

bool attend_f16_exact_supported(int64_t head_dim) {
  return head_dim % 64 == 0 && head_dim <= 256;
}

void attend_f16_rounded_avx512(const F16AttendArgs& a) {
  const int64_t hd = a.head_dim;
  const int64_t n = a.j_end;  // keys [0, j_end); those before j_begin are masked
  // Scores for keys from j_begin's 16-key chunk to n-1 (masked: -inf),
  // chunked from key 0 like llama.cpp's padded rows (softmax_probs16 skips
  // the wholly masked chunks before).
  int64_t j = a.j_begin / 16 * 16;
  for (; j < a.j_begin; ++j) a.scores[j] = -INFINITY;
  {
    __m512 qf[16];  // head_dim <= 256
    for (int64_t d = 0; d < hd; d += 16) qf[d / 16] = load16(a.q16 + d);
    // Keys from j_begin on, 16 at a time (each key's dot is independent).
    for (; j + 16 <= n; j += 16) {
      if (a.single_query) {
        dot_qk16_single(qf, a, j, hd, a.scores + j);
      } else {
        dot_qk16_multi(qf, a, j, hd, a.scores + j);
      }
    }
  }
  const float max = finish_scores(a.q16, a.kv, hd, a.j_begin, j, n, a.scale, a.softcap, a.single_query, a.scores);
  softmax_probs16(a.scores, a.probs16, a.j_begin, n, max);

  // p.v: accumulator row (key % n_lanes) per key, each a vector over head dims.
  const int n_lanes = a.single_query ? 64 : 16;
  alignas(64) float acc[64][256];
  switch (hd / 16) {
    case 4:
      pv_lanes<4>(a, n_lanes, n, acc);
      break;
    case 8:
      pv_lanes<8>(a, n_lanes, n, acc);
      break;
    case 12:
      pv_lanes<12>(a, n_lanes, n, acc);
      break;
    default:
      pv_lanes<16>(a, n_lanes, n, acc);
      break;
  }
  reduce_lanes(&acc[0][0], 256, hd, a.single_query, a.out);
}

}  // namespace rill::cpu::detail
