#pragma once
// Attention over a KV cache stored in the KV types of model/kv_types.h:
// plain (F32 / F16 / BF16) or GGML blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1),
// K and V each in their own type, optionally Hadamard-rotated per head.
// Attention reads the blocks where they lie: each key's head is dequantized
// into a head_dim register-sized buffer as it is read, never the context
// into a copy.
//
// Arithmetic (the same for every call, so a (query, head)'s bits depend only
// on its position and its KV, not on its batch; as written here for the
// scalar/AVX2 kernels, the AVX-512 kernel below within rounding): the query in f32 (rotated
// by the same transform when K is rotated: H orthonormal keeps q.k);
// score = scale * q.k in f32 (8 partial sums), softcap as cpu::attention;
// f32 softmax with max subtraction, the sum in double; out = sum_j p_j v_j
// in f32, rotated back when V is rotated. One unit is one query and one KV
// head with all its query heads, so a K/V row is dequantized once for the
// whole group (GQA).
#include <cstdint>

#include "backend/cpu/ops.h"

namespace rill::cpu {

struct KvSideTypes {
  DType k = DType::kF16, v = DType::kF16;
  bool k_rotated = false, v_rotated = false;
};

// seqs[s].kv: K rows of row_bytes(t.k, n_head_kv * head_dim) bytes, V rows
// of kv.v_row_bytes (or row_bytes) = row_bytes(t.v, ...). p.kv_dtype is
// not read. head_dim <= 1024 and a multiple of the types' blocks.
void attention_quant_batch(const AttentionSeq* seqs, int n_seqs, const AttentionParams& p, const KvSideTypes& t,
                           ThreadPool& pool);

namespace detail {
// Dequantizes n elements (whole blocks) of a KV row of type t.
using KvDequant = void (*)(const uint8_t* src, float* dst, int64_t n);
struct QuantAttendArgs {
  const float* q;  // [n_heads, head_dim] f32, rotated where K is
  PagedKv kv;      // k / v at this KV head's first byte of physical block 0
  KvDequant k_dequant, v_dequant;
  int64_t head_dim, j_begin, j_end;
  int n_heads;
  float scale, softcap;
  float* scores;  // scratch [n_heads, j_end - j_begin]
  float* out;     // [n_heads, head_dim] f32
  // Heads smaller than a block (blocks span heads): k_row_elems > 0, kv.k
  // points at the rows' first byte, each row's first k_row_elems elements
  // are dequantized and the head read at element k_head_elem (V likewise).
  int64_t k_row_elems = 0, v_row_elems = 0, k_head_elem = 0, v_head_elem = 0;
};
KvDequant kv_dequant_scalar(DType t);
KvDequant kv_dequant_avx2(DType t);
void attend_quant_scalar(const QuantAttendArgs& a);
void attend_quant_avx2(const QuantAttendArgs& a);
// The AVX-512 kernel (attention_quant_avx512.cpp) takes a tile of n_q
// queries of one sequence for one KV head: each K/V row is dequantized once
// for all n_q * n_heads query heads whose key ranges hold it. A (query,
// head)'s arithmetic is the same whatever else the tile holds (bit-identical
// to a tile of that query alone), so tiles keep results batch invariant.
struct QuantTileArgs {
  const float* q;  // [n_q * n_heads, head_dim] f32, rotated where K is
  PagedKv kv;      // at this KV head's first byte of physical block 0
  int64_t head_dim;
  const int64_t *j_begin, *j_end;  // [n_q]: query i reads keys [j_begin[i], j_end[i])
  int n_q, n_heads;
  float scale, softcap;
  float* scores;         // scratch [n_q * n_heads, score_stride]
  int64_t score_stride;  // >= the longest range
  float* out;            // query i, head g at out + i * out_stride + g * head_dim
  int64_t out_stride;
};
// For K type k and V type v: heads of whole blocks only (k_row_elems ==
// v_row_elems == 0), head_dim 32, 64, 96, 128 or 256 (64, 128 or 256 where
// a side is q8_0h64's kKvQ8_0x64, blocks of 64); nullptr for any other
// case (the caller takes AVX2). Same contract as attend_quant_avx2 within
// rounding (exp is ggml's AVX-512 expf, the q.k and p.v sums associate
// differently); a query with no keys gets zeros.
using QuantTileAttend = void (*)(const QuantTileArgs&);
QuantTileAttend attend_quant_avx512_for(DType k, DType v, int64_t head_dim);
// The same tiles on AVX2 + FMA + F16C (attention_quant_tile_avx2.cpp), for
// the same types and head_dims: eight lanes, exp by Cephes' polynomial
// (exp_nonpositive), sums per 8 keys; the same contract within rounding.
QuantTileAttend attend_quant_tile_avx2_for(DType k, DType v, int64_t head_dim);
}  // namespace detail

}  // namespace rill::cpu
