#include "model/tensor_split.h"

#include <algorithm>

namespace rill {
namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

}  // namespace

Result<SplitRange> split_evenly(int64_t total, int rank, int size, const std::string& what, const std::string& where) {
  if (size < 1 || rank < 0 || rank >= size) {
    return Error{where + ": rank " + str(rank) + " of a tensor-parallel group of " + str(size)};
  }
  if (total % size != 0) {
    return Error{where + ": " + what + " " + str(total) + " does not divide over " + str(size) +
                 " tensor-parallel ranks; use a rank count that divides it"};
  }
  const int64_t n = total / size;
  return SplitRange{rank * n, n};
}

Result<TensorSplit> plan_tensor_split(const ModelConfig& cfg, int rank, int size, const std::string& where) {
  TensorSplit s;
  s.rank = rank;
  s.size = size;
  RILL_ASSIGN_OR_RETURN(s.heads, split_evenly(cfg.n_head, rank, size, "num_attention_heads", where));
  const int64_t n_kv = cfg.n_head_kv;
  if (n_kv <= 0 || cfg.n_head % n_kv != 0) {
    return Error{where + ": " + str(cfg.n_head) + " query heads do not group over " + str(n_kv) + " KV heads"};
  }
  if (n_kv % size == 0) {
    s.kv_heads = {rank * (n_kv / size), n_kv / size};
  } else if (size % n_kv == 0) {
    // More ranks than KV heads: the group of query heads this rank holds
    // lies within one KV head's group (group size H/n_kv is a multiple of H/N).
    const int64_t group = cfg.n_head / n_kv;
    s.kv_heads = {s.heads.begin / group, 1};
  } else {
    return Error{where + ": num_key_value_heads " + str(n_kv) + " and " + str(size) +
                 " tensor-parallel ranks: one must divide the other"};
  }
  const int64_t V = cfg.n_vocab;
  s.vocab_stride = (V + size - 1) / size;
  const int64_t v0 = std::min(V, rank * s.vocab_stride);
  s.vocab = {v0, std::min(V, v0 + s.vocab_stride) - v0};
  return s;
}

WeightView slice_rows(const WeightView& w, SplitRange r) {
  WeightView v = w;
  v.n_rows = r.n;
  v.data = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r.begin) * w.row_stride;
  if (v.e4m3) {
    v.e4m3 += r.begin * w.n_cols;
    v.e4m3_scales += r.begin;
  }
  return v;
}

Linear slice_rows(const Linear& l, SplitRange r) {
  Linear s;
  s.w = slice_rows(l.w, r);
  if (!l.bias.empty()) s.bias.assign(l.bias.begin() + r.begin, l.bias.begin() + r.begin + r.n);
  return s;
}

Result<Linear> slice_cols(const Linear& l, SplitRange c, const std::string& name) {
  const DTypeInfo info = dtype_info(l.w.dtype);
  if (c.begin % info.block_size != 0 || c.n % info.block_size != 0) {
    return Error{"'" + name + "': columns [" + str(c.begin) + ", " + str(c.begin + c.n) + ") of a " +
                 std::string(info.name) + " weight do not fall on its blocks of " + str(info.block_size) +
                 "; this tensor-parallel size cannot split it"};
  }
  Linear s;
  s.w = l.w;
  s.w.n_cols = c.n;
  s.w.data = static_cast<const uint8_t*>(l.w.data) + row_bytes(l.w.dtype, c.begin);
  s.w.e4m3 = nullptr;  // a row's scale covers all its columns: the slice is requantized
  s.w.e4m3_scales = nullptr;
  return s;  // row_stride stays the full row's
}

Result<MoeFfn> slice_moe(const MoeFfn& full, int rank, int size, const std::string& where) {
  MoeParams p = full.params();
  const MoeWeights& w = full.weights();
  auto slice_ffn = [&](const GluFfnWeights& f, SplitRange ff, const std::string& what) -> Result<GluFfnWeights> {
    GluFfnWeights s;
    s.gate = slice_rows(f.gate, ff);
    s.up = slice_rows(f.up, ff);
    RILL_ASSIGN_OR_RETURN(s.down, slice_cols(f.down, ff, where + ": " + what + " down"));
    return s;
  };
  MoeWeights local;
  local.router = w.router;
  local.score_bias = w.score_bias;
  RILL_ASSIGN_OR_RETURN(const SplitRange ff, split_evenly(p.n_ff, rank, size, "the experts' intermediate size", where));
  for (size_t e = 0; e < w.experts.size(); ++e) {
    RILL_ASSIGN_OR_RETURN(GluFfnWeights f, slice_ffn(w.experts[e], ff, "expert " + std::to_string(e)));
    local.experts.push_back(std::move(f));
  }
  p.n_ff = ff.n;
  if (w.shared) {
    RILL_ASSIGN_OR_RETURN(const SplitRange sff,
                          split_evenly(p.n_ff_shared, rank, size, "the shared expert's intermediate size", where));
    RILL_ASSIGN_OR_RETURN(local.shared, slice_ffn(*w.shared, sff, "shared expert"));
    local.shared_gate = w.shared_gate;
    p.n_ff_shared = sff.n;
  }
  auto m = MoeFfn::create(p, std::move(local));
  if (!m.ok()) return Error{where + ": " + m.error().message};
  return m;
}

}  // namespace rill
