#pragma once
// Attention over k4c and k4a KV on CUDA (model/kv_types.h "k4c", "k4a"; the
// CPU's contract in backend/cpu/attention_chan.h): K per channel over each
// KV block of 32 tokens (q4c groups or q4a's bit planes, kv_chan.h's
// encoders; a q4a code rebuilt from its channel's planes as the CPU's
// scalar group_sums_planes does), V in iq4_nlh64
// rows, each query's own block's keys and values from q8_0 rows (the
// sequence's tail before the step's first position c0, the step's rows
// from c0 on). The reference kernel: one thread per (query, head) doing
// the CPU baseline build's arithmetic in its order (a group's q.z and
// sum_c (q_c d_c) q_cj in channel order, an own key's dot in 8 partial
// sums, the softmax sum in double, out = sum_j p_j v_j in key order), so
// the same source built for the host (chan_attention_host) gives the CPU
// scalar build's bits and the device differs by expf / tanhf alone. Slow
// (a thread walks every key of its query): the device reference a fast
// kernel is held to (chan_attention_fast below), not a serving path; the
// CUDA backend runs k4c through chan_attention_fast, or through
// chan_attention_parallel with RILL_K4C_ATTENTION=ref (docs/perf.md,
// branches k4ccuda22, k4cwire22, k4cfast22).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace rill::cuda {

struct ChanAttentionArgs {
  const float* q = nullptr;  // [n_tokens, q_stride]: heads [n_head, head_dim] f32 (K is not rotated)
  int64_t q_stride = 0;
  float* out = nullptr;             // [n_tokens, n_head * head_dim] f32, in V's rotated basis (rotate back after)
  float* scores = nullptr;          // scratch [n_tokens * n_head, max_keys]
  int32_t max_keys = 0;             // >= every query's keys
  const int32_t* pos = nullptr;     // [n_tokens]
  const int32_t* seq_of = nullptr;  // [n_tokens]
  // Per sequence: its pool blocks of 32 tokens (block_tables + table_start[s]),
  // the step's first position c0[s], its first row in step_k / step_v.
  const int32_t* block_tables = nullptr;
  const int32_t* table_start = nullptr;
  const int32_t* c0 = nullptr;
  const int32_t* q_start = nullptr;
  // tail_k[s]: 32 q8_0 K rows, positions [c0 - c0 % 32, c0) at rows 0..;
  // tail_v[s] likewise (V rotated).
  const uint8_t* const* tail_k = nullptr;
  const uint8_t* const* tail_v = nullptr;
  const uint8_t* step_k = nullptr;  // [n_tokens] q8_0 rows of the step, as RopeKvArgs::k_rows
  const uint8_t* step_v = nullptr;
  // Physical block 0's K region (a q4c group: 19 * width bytes) and V
  // region (32 iq4_nlh64 rows, v_row_bytes apart); blocks block_stride
  // apart (V's v_block_stride apart where set: the CUDA pool's separate
  // planes; 0: block_stride, the CPU's blocks of both).
  const uint8_t* k_blocks = nullptr;
  const uint8_t* v_blocks = nullptr;
  size_t block_stride = 0, v_row_bytes = 0, v_block_stride = 0;
  // k4a: K's blocks are q4a's (kKvQ4Alloc, cpu::quantize_alloc_block's bit
  // planes, the same 19 * width bytes), this layer's widths table
  // (kv_chan.h alloc_table_bytes); null: q4c's groups.
  const uint8_t* k_widths = nullptr;
  int32_t n_tokens = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  int32_t window = 0;  // > 0: keys [pos - window + 1, pos]
  float scale = 1.0f, softcap = 0.0f;
  // chan_attention_fast's scratch (unused by the reference kernels):
  // chan_fast_partial_floats(n_tokens, n_head, head_dim) floats, each
  // split's unnormalized output, running max and sum.
  float* partials = nullptr;
  // chan_attention_fast: a thread block takes up to 32 query rows (a KV
  // head's query heads times the tokens of one sequence whose keys start in
  // the same KV block and end in the same own block), so each decoded block
  // serves them all: for steps of several tokens a sequence (prefill,
  // verify). The outputs' bits are the same either way (each row's
  // arithmetic is its own); false suits a decode step, a token a sequence.
  bool tile_tokens = false;
  // Untiled only: the block's scores, max, probabilities and sums in one
  // phase, a warp a row (attention_chan_fast.cu softmax_rows): two barriers
  // a block fewer; other bits (the sum's order), each row's own. The
  // backend's default for decode (2-3% faster on an H100, docs/perf.md);
  // RILL_K4C_ATTENTION=rows turns it off.
  bool warp_softmax = false;
  // The fast kernel only: when set, its combine writes each output head
  // rotated back (rotate_heads_back's bits, in rotated_dtype: f32, f16 or
  // bf16) to rotated_out, rows of n_head * head_dim, instead of f32 to out
  // (one kernel a layer fewer).
  void* rotated_out = nullptr;
  DType rotated_dtype = DType::kF32;
  // chan_attention_flash only, q4c K only (k_widths null): a pool block's
  // loads issued together before its shared stores (the same bits). On an
  // H100 the kernel took 15% less time for k4c and, had q4a's blocks gone
  // through the same instantiation, 4% more for k4a, so q4a never does.
  // The backend sets it unless RILL_K4C_FLASH_LOADS=plain.
  bool flash_batched_loads = false;
};

// head_dim a multiple of 64 (V's blocks) up to 1024; n_head_kv * head_dim a
// multiple of 32. Device pointers.
void chan_attention(const ChanAttentionArgs& a, cudaStream_t stream);
// The same code over host pointers, on the calling thread (tests).
void chan_attention_host(const ChanAttentionArgs& a);

// chan_attention's arithmetic with a thread block per (query, head): the
// keys' scores, exps and probabilities a key a thread, the max by a
// reduction (exact), the double sum by one thread in key order, the output
// a channel a thread in key order, each value computed as chan_attention
// computes it (a group's q.z recomputed per key: the same value), so its
// outputs are chan_attention's bits (not NaN-aware: a NaN score's max may
// differ). What the CUDA backend runs for k4c with RILL_K4C_ATTENTION=ref
// (branch k4cwire22): ~blockDim times the reference's parallelism, still a
// reference-speed kernel (scores in global memory, one thread's sum).
void chan_attention_parallel(const ChanAttentionArgs& a, cudaStream_t stream);
// Its phases one after the other over host pointers (tests).
void chan_attention_parallel_host(const ChanAttentionArgs& a);

// The fast kernel (attention_chan_fast.cu) for the same contract, held to
// chan_attention_parallel within f32 rounding (tests/cuda/
// attention_chan_fast_cuda_test.cpp: max |diff| <= 2e-3 of the output's
// scale), not its bits: a thread block per (query, KV head, key split),
// the KV head's query heads together (up to 8 a block, so a K group and a V
// row are decoded once for all of them), each KV block of 32 keys decoded
// into shared memory as f32 (K: z + d / 16 * code, q4c's nibbles or q4a's
// planes; V: iq4_nlh64's levels; the own block's q8_0 rows), scores as
// q.k, an online softmax in f32 per split, then a second kernel combining
// the splits in split order (attention_chan_split.h: the plan depends on
// the query's own key range alone, so the outputs are deterministic and
// batch invariant). Scratch: a.partials (a.scores unused). head_dim 64,
// 128 or 256 (chan_attention_fast_supported); any GQA ratio. The CUDA
// backend runs it for k4c / k4a (its tests passed on an H200, 2026-12-06:
// worst 1.5e-7 of the scale against the reference) unless
// RILL_K4C_ATTENTION=ref (read when the backend carves its scratch) or the
// head_dim is another; chan_attention_parallel then.
bool chan_attention_fast_supported(int32_t head_dim);
size_t chan_fast_partial_floats(int64_t n_tokens, int32_t n_head, int32_t head_dim);
void chan_attention_fast(const ChanAttentionArgs& a, cudaStream_t stream);
// The same code over host pointers, each thread block's phases run thread
// after thread on the calling thread (tests; no GPU needed).
void chan_attention_fast_host(const ChanAttentionArgs& a);

// Prefill on the tensor cores (attention_chan_flash.cu): a thread block
// per (KV head, tile of up to 32 tokens of one sequence inside one KV
// block), the group's query heads as 64 rows, each KV block decoded into
// f16 tiles (q4c / q4a K, iq4_nlh64 V, the own block's q8_0 rows) and
// mma.sync's FlashAttention-2 loop over them. Held to the reference
// within f16 rounding (q, K, V and the probabilities rounded to f16:
// tests/cuda/attention_chan_fast_cuda_test.cpp, 5e-3 of the output's
// scale), batch invariant (the tiles and each row's arithmetic depend on
// its own positions); writes a.out (f32, V's rotated basis) or, with
// a.rotated_out, the heads rotated back. No scratch, no splits (a.partials
// and a.scores unused). head_dim 64 or 128 and at most 64 query heads a KV
// head (chan_attention_flash_supported); a.n_tokens <= 65,535. The CUDA
// backend runs it where the fast kernel would take token tiles (several
// tokens a sequence on average) in models of 16-bit activations (f32
// checkpoints keep the fast kernel's f32), unless RILL_K4C_ATTENTION=tiles.
bool chan_attention_flash_supported(int32_t head_dim, int32_t group);
void chan_attention_flash(const ChanAttentionArgs& a, cudaStream_t stream);

// Each head of in's rows (f32, in_stride floats apart) Walsh-Hadamard
// rotated (cpu::hadamard_rotate's bits: the transform is its own inverse)
// into out [n_rows, n_heads * head_dim] in out_dtype (F32 / F16 / BF16);
// head_dim a power of two up to 512: what cuda::attention does to a rotated
// V's outputs (attention.cu's kernel), for chan_attention's.
void rotate_heads_back(const float* in, int64_t in_stride, int32_t n_rows, int32_t n_heads, int32_t head_dim,
                       DType out_dtype, void* out, cudaStream_t stream);

}  // namespace rill::cuda
