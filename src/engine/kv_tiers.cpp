#include "engine/kv_tiers.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

namespace rill {

Result<std::unique_ptr<KvTiers>> KvTiers::open(const KvTierConfig& config, Model& model, BlockPool& pool,
                                               PrefixTree& tree) {
  std::unique_ptr<KvTiers> t(new KvTiers(model, pool, tree));
  const KvSpec& spec = model.kv_spec();
  t->layers_ = model.kv_layers();
  if (spec.size() != 1 || !spec[0].is_attention() || t->layers_.empty()) {
    return Error{"--cache-ram-mb / --cache-dir: the prefix cache tiers support models with one attention layer "
                 "group and KV export; this model has " +
                 std::to_string(spec.size()) + " layer group(s)"};
  }
  t->kind_ = spec[0].kind;
  if (config.ram_bytes > 0) t->ram_ = std::make_unique<RamTier>(static_cast<size_t>(config.ram_bytes));
  if (!config.disk_dir.empty()) {
    DiskTierOptions o;
    o.dir = config.disk_dir;
    o.cap_bytes = static_cast<size_t>(std::max<int64_t>(0, config.disk_bytes));
    o.verify_tensors = config.verify;
    o.identity = config.identity;
    o.block_size = pool.block_size();
    RILL_ASSIGN_OR_RETURN(t->disk_, DiskTier::open(o));
    if (t->disk_->removed_at_open() > 0) {
      std::fprintf(stderr, "kv cache %s: removed %lld stale, corrupt or unfinished file(s)\n", o.dir.c_str(),
                   static_cast<long long>(t->disk_->removed_at_open()));
    }
  }
  KvTiers* raw = t.get();
  tree.set_spill_hook([raw](uint64_t ns, std::span<const int32_t> tokens, std::span<const int32_t> blocks) {
    raw->spill(ns, tokens, blocks);
  });
  return t;
}

KvTiers::~KvTiers() { tree_.set_spill_hook(nullptr); }

Result<KvRunPtr> KvTiers::build_run(uint64_t ns, std::span<const int32_t> tokens, std::span<const int32_t> blocks,
                                    std::vector<uint64_t> keys) const {
  auto run = std::make_shared<KvRun>();
  const int32_t bs = pool_.block_size();
  run->ns = ns;
  run->block_size = bs;
  run->tokens.assign(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(blocks.size()) * bs);
  run->keys = std::move(keys);
  size_t total = 0;
  for (const Model::KvLayer& l : layers_) total += 2 * l.row_bytes * run->tokens.size();
  run->storage.resize(total);
  uint8_t* p = run->storage.data();
  for (size_t l = 0; l < layers_.size(); ++l) {
    const size_t tensor = layers_[l].row_bytes * run->tokens.size();
    const size_t block_bytes = layers_[l].row_bytes * static_cast<size_t>(bs);
    uint8_t* k = p;
    uint8_t* v = p + tensor;
    for (size_t b = 0; b < blocks.size(); ++b) {
      RILL_TRY(model_.copy_kv_out(static_cast<int64_t>(l), blocks[b], k + b * block_bytes, v + b * block_bytes));
    }
    run->kinds.push_back(kind_);
    run->dtypes.push_back(layers_[l].dtype);
    run->row_bytes.push_back(layers_[l].row_bytes);
    run->k.emplace_back(k, tensor);
    run->v.emplace_back(v, tensor);
    p += 2 * tensor;
  }
  return KvRunPtr(std::move(run));
}

void KvTiers::to_disk(const KvRun& run) {
  if (!disk_) return;
  Status st = disk_->put(run);
  if (!st.ok()) {
    ++spill_errors_;
    last_error_ = st.error().message;
    std::fprintf(stderr, "kv cache: %s\n", last_error_.c_str());
  }
}

void KvTiers::spill(uint64_t ns, std::span<const int32_t> tokens, std::span<const int32_t> blocks) {
  if (blocks.empty()) return;
  std::vector<uint64_t> keys = PrefixTree::chain_keys(ns, tokens, pool_.block_size());
  if (keys.size() != blocks.size()) return;
  const uint64_t last = keys.back();
  if ((ram_ && ram_->covers(last)) || (disk_ && disk_->covers(last))) return;  // already held below
  auto run = build_run(ns, tokens, blocks, std::move(keys));
  if (!run.ok()) {
    ++spill_errors_;
    last_error_ = run.error().message;
    return;
  }
  if (!ram_) {
    to_disk(**run);
    return;
  }
  for (const KvRunPtr& evicted : ram_->put(std::move(*run))) to_disk(*evicted);
}

bool KvTiers::run_fits_model(const KvRun& run) const {
  if (run.k.size() != layers_.size() || run.block_size != pool_.block_size()) return false;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const size_t tensor = layers_[l].row_bytes * run.tokens.size();
    if (run.dtypes[l] != layers_[l].dtype || run.row_bytes[l] != layers_[l].row_bytes || run.k[l].size() != tensor ||
        run.v[l].size() != tensor) {
      return false;
    }
  }
  return true;
}

int32_t KvTiers::restore(uint64_t ns, std::span<const int32_t> prompt) {
  const int32_t bs = pool_.block_size();
  if (prompt.size() < 2) return 0;
  const auto n_full = static_cast<int32_t>((prompt.size() - 1) / static_cast<size_t>(bs));
  if (n_full == 0) return 0;
  const std::span<const int32_t> usable = prompt.first(static_cast<size_t>(n_full) * static_cast<size_t>(bs));
  PrefixMatch device = tree_.match(ns, usable);
  const int32_t m = static_cast<int32_t>(device.blocks.size());
  if (m >= n_full) return 0;
  const std::vector<uint64_t> keys = PrefixTree::chain_keys(ns, usable, bs);
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<std::pair<KvRunPtr, int32_t>> hit;
  bool from_disk = false;
  if (ram_) hit = ram_->find(keys);
  if (disk_ && (!hit || hit->second < n_full)) {
    auto disk_hit = disk_->find(keys, ns);
    if (disk_hit && (!hit || disk_hit->second > hit->second)) {
      hit = std::move(disk_hit);
      from_disk = true;
    }
  }
  if (!hit || hit->second <= m) return 0;
  const KvRun& run = *hit->first;
  const int32_t n = hit->second;
  // A hash collision or a run of another shape is a miss, never wrong KV.
  if (run.ns != ns || static_cast<int32_t>(run.keys.size()) < n ||
      !std::equal(usable.begin(), usable.begin() + static_cast<ptrdiff_t>(n) * bs, run.tokens.begin()) ||
      !run_fits_model(run)) {
    return 0;
  }
  if (!pool_.can_allocate(n - m)) return 0;
  auto fresh = pool_.allocate(n - m);  // may evict (and spill) other cached blocks
  if (!fresh.ok()) return 0;
  for (int32_t b = m; b < n; ++b) {
    const int32_t block = (*fresh)[static_cast<size_t>(b - m)].block();
    for (size_t l = 0; l < layers_.size(); ++l) {
      const size_t block_bytes = layers_[l].row_bytes * static_cast<size_t>(bs);
      const size_t off = static_cast<size_t>(b) * block_bytes;
      Status st = model_.copy_kv_in(static_cast<int64_t>(l), block, run.k[l].data() + off, run.v[l].data() + off);
      if (!st.ok()) {
        last_error_ = st.error().message;
        return 0;
      }
    }
  }
  std::vector<int32_t> ids = device.block_ids();
  for (const BlockLease& lease : *fresh) ids.push_back(lease.block());
  tree_.insert(ns, usable.first(static_cast<size_t>(n) * static_cast<size_t>(bs)), ids);
  // Leases go back tail first: the restored blocks stay cached (LRU) for
  // the admission that follows.
  std::vector<BlockLease> all = std::move(device.blocks);
  for (BlockLease& lease : *fresh) all.push_back(std::move(lease));
  release_tail_first(all);
  const int32_t tokens = (n - m) * bs;
  restored_tokens_ += tokens;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (from_disk) {
    disk_->count_load(seconds);
  } else {
    ram_->count_load(seconds);
  }
  return tokens;
}

Result<int32_t> KvTiers::persist(uint64_t ns, std::span<const int32_t> tokens) {
  if (!disk_) return Error{"cache warm: no disk tier (--cache-dir) is configured"};
  const int32_t bs = pool_.block_size();
  PrefixMatch device = tree_.match(ns, tokens);
  if (device.blocks.empty()) return Error{"cache warm: the prompt has no full block of " + std::to_string(bs) + " tokens cached"};
  const std::vector<int32_t> ids = device.block_ids();
  std::vector<uint64_t> keys = PrefixTree::chain_keys(ns, tokens.first(ids.size() * static_cast<size_t>(bs)), bs);
  RILL_ASSIGN_OR_RETURN(KvRunPtr run, build_run(ns, tokens, ids, std::move(keys)));
  RILL_TRY(disk_->put(*run));
  release_tail_first(device.blocks);
  return device.n_tokens;
}

}  // namespace rill
