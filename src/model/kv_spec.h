#pragma once
// Layer-kind specs: a model declares its KV layout as a list of layer groups
// (e.g. {full()} for Llama, {sliding(4096), full()} for Gemma-like models,
// {recurrent(), full()} for hybrids). Every layer of a group shares one block
// table per sequence (attention groups) or one state slot per sequence
// (recurrent groups). The KvManager only looks at these specs; it never
// special-cases a model.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace rill {

enum class LayerKind : uint8_t {
  kFull,       // attends to every earlier position: keeps every block
  kSliding,    // attends to the last `window` positions (itself included)
  kRecurrent,  // fixed-size per-sequence state (SSM / linear attention)
};

// A group's KV layers may store rows of their own width (row_width: the
// elements of one token's K or V row in each of them; 0 where the model has
// one width for every layer, as most do): Gemma 4's full layers have wider
// heads and their own KV-head count. A layer that shares another layer's KV
// (Gemma 4's last num_kv_shared_layers) belongs to no group's storage: it
// reads its donor's blocks through the donor's group, and the model lists
// only the layers that store KV in Model::kv_layers(), so the KV manager
// allocates nothing and the cache tiers save nothing for it.
struct LayerGroupSpec {
  LayerKind kind = LayerKind::kFull;
  int32_t window = 0;  // tokens, >= 1; kSliding only
  int64_t row_width = 0;

  bool is_attention() const { return kind != LayerKind::kRecurrent; }
};

inline LayerGroupSpec full(int64_t row_width = 0) {
  return {LayerKind::kFull, 0, row_width};
}
inline LayerGroupSpec sliding(int32_t window, int64_t row_width = 0) {
  return {LayerKind::kSliding, window, row_width};
}
inline LayerGroupSpec recurrent() {
  return {LayerKind::kRecurrent, 0, 0};
}

using KvSpec = std::vector<LayerGroupSpec>;

// What one token keeps per layer of multi-head latent attention (MLA:
// DeepSeek-V3, MiniCPM3, GLM-5), instead of per-head K and V: the normed
// latent c_kv (kv_lora_rank elements, which kv_b_proj would expand into
// every head's K and V), the rotated key shared by all heads (rope_dim) and,
// with DeepSeek sparse attention (GLM-5), the lightning indexer's key
// (index_dim; every layer keeps the columns, a layer that reuses another
// layer's selection leaves them zero). MLA
// layers are ordinary full-attention layers of their group; only the row
// differs. The row goes into the paged cache's K and V planes, plane_width()
// elements each: its first plane_width() elements in K, the rest in V
// (padded with zeros to plane_width()), so the block pool, the tiers and the
// KV files keep their two-plane layout while a token costs row_width()
// elements per layer (DeepSeek-V3: 512 + 64 = 576, against 128 heads x
// (192 + 128) = 40,960 for its heads' K and V).
struct LatentKvRow {
  int32_t kv_lora_rank = 0;
  int32_t rope_dim = 0;
  int32_t index_dim = 0;  // 0: no indexer
  int32_t index_col() const { return kv_lora_rank + rope_dim; }
  int32_t row_width() const { return kv_lora_rank + rope_dim + index_dim; }
  int32_t plane_width() const { return (row_width() + 1) / 2; }
};

// The first block a sequence of n_tokens tokens still reads in a group of
// this spec when it goes on (computes position n_tokens next): that token
// attends to [n_tokens - window + 1, n_tokens] in a sliding group, so every
// block wholly before that position is dead; a full group reads from 0. The
// one rule for what resuming needs: the KV manager gives dead blocks back by
// it, and the cache tiers store, match and restore a sliding group's blocks
// by it (a prefix of m blocks resumes only where every group holds its
// blocks [first_needed_block(g, m * block_size), m)).
inline int32_t first_needed_block(const LayerGroupSpec& g, int32_t n_tokens, int32_t block_size) {
  if (g.kind != LayerKind::kSliding) return 0;
  return std::max(0, (n_tokens - g.window + 1) / block_size);
}

// The deepest m <= k at which a chain of blocks can resume: every attention
// group g holds its blocks [first_needed_block(g, m * block_size), m), where
// has(g, b) says whether group g holds block b (b < k). Blocks before that
// may be missing (dropped from a sliding group). O(groups * k).
template <typename Has>
int32_t deepest_resumable(const KvSpec& spec, int32_t k, int32_t block_size, Has&& has) {
  // Per group with a missing block: last_missing[m] = the last missing block
  // among [0, m), -1 if none. Groups trim in turn until none has to (a lower
  // m may need blocks another group lacks).
  std::vector<std::pair<size_t, std::vector<int32_t>>> gaps;
  for (size_t g = 0; g < spec.size(); ++g) {
    if (!spec[g].is_attention()) continue;
    std::vector<int32_t> last_missing(static_cast<size_t>(std::max(k, 0)) + 1, -1);
    bool any = false;
    for (int32_t b = 0; b < k; ++b) {
      const bool missing = !has(g, b);
      any = any || missing;
      last_missing[static_cast<size_t>(b) + 1] = missing ? b : last_missing[static_cast<size_t>(b)];
    }
    if (any) gaps.emplace_back(g, std::move(last_missing));
  }
  for (bool changed = !gaps.empty(); changed;) {
    changed = false;
    for (const auto& [g, last_missing] : gaps) {
      while (k > 0 && last_missing[static_cast<size_t>(k)] >= first_needed_block(spec[g], k * block_size, block_size)) {
        --k;
        changed = true;
      }
    }
  }
  return k;
}

}  // namespace rill
