#pragma once
// TensorSplit: which part of a model one rank of a tensor-parallel group
// holds, and the weight slicing that gives it that part from the same files
// (views into the mapped tensors; nothing is copied).
//
// The cut (Megatron-style, one all-reduce after each row-parallel matmul):
//  - attention: query heads split evenly, rank r holds [r*H/N, (r+1)*H/N).
//    KV heads split evenly when N divides n_head_kv; when n_head_kv divides
//    N instead (more ranks than KV heads), each rank holds the one KV head
//    its query heads read, replicated over N/n_head_kv ranks. A rank's KV
//    blocks hold only its KV heads;
//  - q/k/v and gate/up are column-parallel (a rank's output rows), o and
//    down row-parallel (the matching input columns); the partial sums of o
//    and down are added by an all-reduce;
//  - a MoE layer (model/moe.h) splits inside every expert: the router is
//    replicated (every rank routes every token the same way, its inputs
//    being the same bits on all ranks), each expert's gate/up rows and down
//    columns are cut like a dense FFN's, and the layer's output, a weighted
//    sum of the experts' down projections, is completed by the same
//    all-reduce. Every rank runs every chosen expert on a 1/N slice, so the
//    work stays balanced whatever the routing (whole experts per rank would
//    leave a rank idle when its experts are not chosen) at the cost of one
//    all-reduce per MoE layer, which a dense layer pays too;
//  - the LM head is vocabulary-parallel: rank r holds rows
//    [r*Vp, min(V, (r+1)*Vp)) with Vp = ceil(V / N), so any vocabulary size
//    splits (the last ranks' shares may be short or empty), and the ranks'
//    logits are all-gathered. The runtimes keep the embedding whole on
//    every rank (a step reads only its tokens' rows; slicing it would cost
//    an all-reduce of the step's [n, E] rows).
#include <cstdint>
#include <string>

#include "core/result.h"
#include "loader/model_config.h"
#include "model/layers.h"
#include "model/moe.h"

namespace rill {

struct SplitRange {
  int64_t begin = 0;
  int64_t n = 0;
};

struct TensorSplit {
  int rank = 0, size = 1;
  SplitRange heads;          // query heads of this rank
  SplitRange kv_heads;       // KV heads this rank stores and attends with
  SplitRange vocab;          // LM head rows of this rank
  int64_t vocab_stride = 0;  // Vp: rank r's rows start at r * Vp (gathered logits are [N, rows, Vp])
};

// The split of cfg's heads and vocabulary for `rank` of `size`. Errors (naming
// `where`, e.g. the model path) when the heads do not divide as above.
Result<TensorSplit> plan_tensor_split(const ModelConfig& cfg, int rank, int size, const std::string& where);

// [begin, begin + n) of `total` split evenly; errors when size does not divide
// total (`what` names the dimension, e.g. "intermediate_size").
Result<SplitRange> split_evenly(int64_t total, int rank, int size, const std::string& what, const std::string& where);

// Rows [r.begin, r.begin + r.n) of w (column-parallel: a slice of the outputs).
WeightView slice_rows(const WeightView& w, SplitRange r);
// slice_rows for a Linear: the weight's rows and the bias's entries.
Linear slice_rows(const Linear& l, SplitRange r);
// Input columns [c.begin, c.begin + c.n) of l's weight (row-parallel). The
// result has no bias: a row-parallel bias is added once, after the
// all-reduce, by the caller. Errors when the slice does not fall on whole
// quantization blocks of the weight's dtype.
Result<Linear> slice_cols(const Linear& l, SplitRange c, const std::string& name);

// Rank `rank` of `size`'s share of a MoE layer: every expert's (and the
// shared expert's) n_ff split as a dense FFN's; router and shared-expert gate
// replicated. Errors when an intermediate size does not divide.
Result<MoeFfn> slice_moe(const MoeFfn& full, int rank, int size, const std::string& where);

}  // namespace rill
