#include "engine/kv_tiers.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "kv/kv_manager.h"

namespace rill {

Result<std::unique_ptr<KvTiers>> KvTiers::open(const KvTierConfig& config, Model& model, BlockPool& pool,
                                               PrefixTree& tree, StatePool* states) {
  std::unique_ptr<KvTiers> t(new KvTiers(model, pool, tree));
  t->states_ = states;
  t->spec_ = model.kv_spec();
  t->layers_ = model.kv_layers();
  for (size_t g = 0; g < t->spec_.size(); ++g) {
    if (t->spec_[g].is_attention()) t->attention_groups_.push_back(static_cast<int32_t>(g));
  }
  const size_t n_recurrent = t->spec_.size() - t->attention_groups_.size();
  if (t->layers_.empty() || t->attention_groups_.empty()) {
    return Error{"--cache-ram-mb / --cache-dir: this model (" + model.config().architecture +
                 ") does not export its KV, so the prefix cache tiers are off"};
  }
  if (n_recurrent > 0) {
    t->state_layers_ = model.state_layers();
    if (n_recurrent > 1 || t->state_layers_.empty() || states == nullptr || states->n_checkpoints() == 0) {
      return Error{
          "--cache-ram-mb / --cache-dir: a model with recurrent layers needs one recurrent group, state "
          "export and recurrent checkpoint slots for the prefix cache tiers"};
    }
    t->key_group_ = t->attention_groups_.front();
    for (int32_t g : t->attention_groups_) {
      if (t->spec_[static_cast<size_t>(g)].kind == LayerKind::kFull) {
        t->key_group_ = g;
        break;
      }
    }
  }
  for (size_t il = 0; il < t->layers_.size(); ++il) {
    const Model::KvLayer& l = t->layers_[il];
    // K and V in different types: the model must export such a layer (a
    // tensor-parallel group does not); asked by copying no block.
    if (l.v_row_bytes != 0) {
      if (Status st = model.copy_kv_blocks_out(static_cast<int64_t>(il), {}, 0, nullptr, nullptr); !st.ok()) {
        return Error{"--cache-ram-mb / --cache-dir: KV layer " + std::to_string(il) +
                     " stores K and V in different types, which this model cannot export (" + st.error().message +
                     "); give --kv-type, or the same k= and v= types in --kv-config"};
      }
    }
    if (l.group < 0 || l.group >= static_cast<int32_t>(t->spec_.size()) || !t->spec_[l.group].is_attention()) {
      return Error{"--cache-ram-mb / --cache-dir: a KV layer names group " + std::to_string(l.group) +
                   ", which is not an attention group of the model"};
    }
  }
  if (config.ram_bytes > 0) t->ram_ = std::make_unique<RamTier>(static_cast<size_t>(config.ram_bytes));
  if (!config.disk_dir.empty()) {
    DiskTierOptions o;
    o.dir = config.disk_dir;
    o.cap_bytes = static_cast<size_t>(std::max<int64_t>(0, config.disk_bytes));
    o.verify_at_open = config.verify;
    o.identity = config.identity;
    o.block_size = pool.block_size();
    RILL_ASSIGN_OR_RETURN(t->disk_, DiskTier::open(o));
    t->writer_ = std::make_unique<DiskWriter>(*t->disk_, kMaxPendingDiskBytes);
    if (t->disk_->removed_at_open() > 0) {
      std::fprintf(stderr, "kv cache %s: removed %lld stale, corrupt or unfinished file(s)\n", o.dir.c_str(),
                   static_cast<long long>(t->disk_->removed_at_open()));
    }
  }
  t->write_behind_min_tokens_ = config.write_behind_min_tokens;
  KvTiers* raw = t.get();
  tree.set_spill_hook([raw](uint64_t ns, std::span<const int32_t> tokens, std::span<const int32_t> blocks) {
    raw->spill(ns, tokens, blocks);
  });
  return t;
}

KvTiers::~KvTiers() {
  tree_.set_spill_hook(nullptr);
  writer_.reset();  // finishes the queued writes
}

void KvTiers::poll() {
  if (!writer_) return;
  for (const Error& e : writer_->collect()) note_disk_error(e);
}

void KvTiers::note_disk_error(const Error& e) {
  ++spill_errors_;
  last_error_ = e.message;
  std::fprintf(stderr, "kv cache: %s\n", last_error_.c_str());
}

size_t KvTiers::state_layer_bytes(size_t layer) const {
  size_t total = 0;
  for (const Model::StateTensor& st : state_layers_[layer]) {
    size_t bytes = sizeof(float);
    for (int64_t d : st.shape) bytes *= static_cast<size_t>(d);
    total += bytes;
  }
  return total;
}

int32_t KvTiers::trim_to_checkpoint(std::span<const int32_t> key_blocks, size_t* n_blocks) const {
  for (; *n_blocks > 0; --*n_blocks) {
    if (auto c = states_->checkpoint_of(key_blocks[*n_blocks - 1])) return *c;
  }
  return -1;
}

void KvTiers::learn_ns(uint64_t ns) {
  for (int32_t g : attention_groups_) group_of_ns_[KvManager::group_ns(ns, g)] = {ns, g};
}

std::vector<PrefixMatch> KvTiers::match_groups(uint64_t ns, std::span<const int32_t> tokens) {
  std::vector<PrefixMatch> out(spec_.size());
  for (int32_t g : attention_groups_) out[static_cast<size_t>(g)] = tree_.match(KvManager::group_ns(ns, g), tokens);
  return out;
}

int32_t KvTiers::first_kept(int32_t group, int32_t n_blocks) const {
  return first_needed_block(spec_[static_cast<size_t>(group)], n_blocks * pool_.block_size(), pool_.block_size());
}

size_t KvTiers::deepest_storable(const std::vector<std::vector<int32_t>>& ids, size_t n) const {
  return static_cast<size_t>(
      deepest_resumable(spec_, static_cast<int32_t>(n), pool_.block_size(),
                        [&](size_t g, int32_t b) { return ids[g][static_cast<size_t>(b)] >= 0; }));
}

// Layers whose V is stored in another type than K (k4c) copy a block at a
// time: Model::copy_kv_blocks_* step K and V by one block size.
Status KvTiers::copy_blocks_out(size_t l, std::span<const int32_t> ids, uint8_t* k, uint8_t* v) const {
  const size_t kb = layers_[l].row_bytes * static_cast<size_t>(pool_.block_size());
  if (layers_[l].v_row_bytes == 0) return model_.copy_kv_blocks_out(static_cast<int64_t>(l), ids, kb, k, v);
  const size_t vb = layers_[l].v_row_bytes * static_cast<size_t>(pool_.block_size());
  for (size_t i = 0; i < ids.size(); ++i) {
    RILL_TRY(model_.copy_kv_blocks_out(static_cast<int64_t>(l), ids.subspan(i, 1), kb, k + i * kb, v + i * vb));
  }
  return {};
}

Status KvTiers::copy_blocks_in(size_t l, std::span<const int32_t> ids, const uint8_t* k, const uint8_t* v) {
  const size_t kb = layers_[l].row_bytes * static_cast<size_t>(pool_.block_size());
  if (layers_[l].v_row_bytes == 0) return model_.copy_kv_blocks_in(static_cast<int64_t>(l), ids, kb, k, v);
  const size_t vb = layers_[l].v_row_bytes * static_cast<size_t>(pool_.block_size());
  for (size_t i = 0; i < ids.size(); ++i) {
    RILL_TRY(model_.copy_kv_blocks_in(static_cast<int64_t>(l), ids.subspan(i, 1), kb, k + i * kb, v + i * vb));
  }
  return {};
}

size_t KvTiers::run_bytes(int32_t n_blocks, bool with_state) const {
  size_t total = 0;
  for (const Model::KvLayer& l : layers_) {
    const auto rows =
        static_cast<size_t>(n_blocks - first_kept(l.group, n_blocks)) * static_cast<size_t>(pool_.block_size());
    total += (l.row_bytes + v_row(l)) * rows;
  }
  if (with_state) {
    for (size_t sl = 0; sl < state_layers_.size(); ++sl) total += state_layer_bytes(sl);
  }
  return total;
}

Result<KvRunPtr> KvTiers::build_run(uint64_t ns, std::span<const int32_t> tokens,
                                    const std::vector<std::vector<int32_t>>& blocks, std::vector<uint64_t> keys,
                                    int32_t checkpoint, HostBytes memory) const {
  auto run = std::make_shared<KvRun>();
  const int32_t bs = pool_.block_size();
  const auto n_blocks = static_cast<int32_t>(keys.size());
  run->ns = ns;
  run->block_size = bs;
  run->tokens.assign(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(n_blocks) * bs);
  run->keys = std::move(keys);
  const size_t total = run_bytes(n_blocks, checkpoint >= 0);
  if (!memory || memory.size() < total) {
    RILL_ASSIGN_OR_RETURN(memory, HostBytes::own(total));
  }
  run->host = std::move(memory);
  uint8_t* p = run->host.data();
  for (size_t l = 0; l < layers_.size(); ++l) {
    const int32_t g = layers_[l].group;
    const int32_t first = first_kept(g, n_blocks);
    const size_t block_bytes = layers_[l].row_bytes * static_cast<size_t>(bs);
    const size_t v_block_bytes = v_row(layers_[l]) * static_cast<size_t>(bs);
    const size_t tensor = block_bytes * static_cast<size_t>(n_blocks - first);
    const size_t v_tensor = v_block_bytes * static_cast<size_t>(n_blocks - first);
    const std::vector<int32_t>& ids = blocks[static_cast<size_t>(g)];
    assert(static_cast<int32_t>(ids.size()) >= n_blocks);
    uint8_t* k = p;
    uint8_t* v = p + tensor;
    RILL_TRY(copy_blocks_out(
        l, std::span<const int32_t>(ids).subspan(static_cast<size_t>(first), static_cast<size_t>(n_blocks - first)), k,
        v));
    const LayerGroupSpec& spec = spec_[static_cast<size_t>(g)];
    run->kinds.push_back(spec.kind);
    run->windows.push_back(spec.kind == LayerKind::kSliding ? spec.window : 0);
    run->first_block.push_back(first);
    run->dtypes.push_back(layers_[l].dtype);
    run->row_bytes.push_back(layers_[l].row_bytes);
    run->v_dtypes.push_back(v_dtype(layers_[l]));
    run->v_row_bytes.push_back(v_row(layers_[l]));
    run->k.emplace_back(k, tensor);
    run->v.emplace_back(v, v_tensor);
    p += tensor + v_tensor;
  }
  if (checkpoint >= 0) {
    for (size_t sl = 0; sl < state_layers_.size(); ++sl) {
      RILL_TRY(model_.copy_state_out(checkpoint, static_cast<int64_t>(sl), p));
      KvLayerData layer{LayerKind::kRecurrent, {}};
      for (const Model::StateTensor& st : state_layers_[sl]) {
        size_t bytes = sizeof(float);
        for (int64_t d : st.shape) bytes *= static_cast<size_t>(d);
        layer.tensors.push_back({st.name, st.shape, DType::kF32, {p, bytes}});
        p += bytes;
      }
      run->state.push_back(std::move(layer));
    }
  }
  return KvRunPtr(std::move(run));
}

void KvTiers::to_disk(KvRunPtr run) {
  if (writer_) writer_->push(std::move(run));
}

size_t KvTiers::storable_prefix(std::vector<std::vector<int32_t>>& ids, size_t n, int32_t* checkpoint) const {
  *checkpoint = -1;
  for (;;) {
    const size_t resumable = deepest_storable(ids, n);
    n = resumable;
    if (!hybrid() || n == 0) return n;
    *checkpoint = trim_to_checkpoint(ids[static_cast<size_t>(key_group_)], &n);
    if (n == resumable) return n;
  }
}

void KvTiers::spill(uint64_t group_ns, std::span<const int32_t> tokens, std::span<const int32_t> blocks) {
  if (blocks.empty()) return;
  poll();
  auto owner = group_of_ns_.find(group_ns);
  if (owner == group_of_ns_.end()) return;  // a namespace no request of ours used
  const uint64_t ns = owner->second.ns;
  const int32_t bs = pool_.block_size();
  // The prefix every group's chain covers: the evicted group's chain, the
  // others as the tree holds them now (read without leases: no allocation
  // or pool change may happen inside the hook).
  std::vector<std::vector<int32_t>> ids(spec_.size());
  size_t n = blocks.size();
  for (int32_t g : attention_groups_) {
    auto& mine = ids[static_cast<size_t>(g)];
    if (g == owner->second.group) {
      mine.assign(blocks.begin(), blocks.end());
    } else {
      mine = tree_.find_chain(KvManager::group_ns(ns, g), tokens.first(n * static_cast<size_t>(bs)));
    }
    n = std::min(n, mine.size());
  }
  // Hollow nodes (-1) hold no KV: store the longest prefix whose kept
  // blocks are all there (and, hybrid, that ends at a checkpoint).
  int32_t checkpoint = -1;
  n = storable_prefix(ids, n, &checkpoint);
  if (n == 0) return;
  std::vector<uint64_t> keys = PrefixTree::chain_keys(ns, tokens.first(n * static_cast<size_t>(bs)), bs);
  if (keys.size() != n) return;
  // Already held below. A run holding this block but unable to resume here
  // counts too: otherwise a chain evicted tail first would be stored once
  // per block.
  const uint64_t last = keys.back();
  if ((ram_ && ram_->covers(last)) || (disk_ && (disk_->covers(last) || writer_->covers(last)))) return;
  // A run the RAM tier keeps is copied straight into arena bytes: make room
  // first (the runs it evicts go down, and their bytes come back), so the
  // copy needs no fresh memory.
  const size_t total = run_bytes(static_cast<int32_t>(n), checkpoint >= 0);
  const bool keep_in_ram = ram_ && total <= ram_->cap_bytes();
  HostBytes memory;
  if (keep_in_ram) {
    for (KvRunPtr& evicted : ram_->make_room(total)) to_disk(std::move(evicted));
    memory = ram_->allocate(total);
  }
  auto run = build_run(ns, tokens, ids, std::move(keys), checkpoint, std::move(memory));
  if (!run.ok()) {
    ++spill_errors_;
    last_error_ = run.error().message;
    return;
  }
  if (!keep_in_ram) {
    to_disk(std::move(*run));
    return;
  }
  for (KvRunPtr& evicted : ram_->put(std::move(*run))) to_disk(std::move(evicted));
}

bool KvTiers::run_fits_model(const KvRun& run) const {
  if (run.k.size() != layers_.size() || run.block_size != pool_.block_size()) return false;
  if (run.kinds.size() != layers_.size() || run.windows.size() != layers_.size() ||
      run.first_block.size() != layers_.size()) {
    return false;
  }
  if (run.state.size() != state_layers_.size()) return false;
  for (size_t sl = 0; sl < run.state.size(); ++sl) {
    const auto& want = state_layers_[sl];
    const auto& got = run.state[sl].tensors;
    if (run.state[sl].kind != LayerKind::kRecurrent || got.size() != want.size()) return false;
    for (size_t t = 0; t < got.size(); ++t) {
      size_t bytes = sizeof(float);
      for (int64_t d : want[t].shape) bytes *= static_cast<size_t>(d);
      if (got[t].name != want[t].name || got[t].shape != want[t].shape || got[t].dtype != DType::kF32 ||
          got[t].bytes.size() != bytes) {
        return false;
      }
    }
  }
  const int32_t n_blocks = run.n_blocks();
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerGroupSpec& spec = spec_[static_cast<size_t>(layers_[l].group)];
    const int32_t first = run.first_block[l];
    // A layer that dropped blocks must have dropped them by this model's window.
    if (first < 0 || first > n_blocks ||
        (first > 0 && (spec.kind != LayerKind::kSliding || run.windows[l] != spec.window))) {
      return false;
    }
    const size_t rows = static_cast<size_t>(n_blocks - first) * static_cast<size_t>(run.block_size);
    if (run.kinds[l] != spec.kind || run.dtypes[l] != layers_[l].dtype || run.row_bytes[l] != layers_[l].row_bytes ||
        run.v_dtype(l) != v_dtype(layers_[l]) || run.v_row(l) != v_row(layers_[l]) ||
        run.k[l].size() != layers_[l].row_bytes * rows || run.v[l].size() != v_row(layers_[l]) * rows) {
      return false;
    }
  }
  return true;
}

int32_t KvTiers::restore(uint64_t ns, std::span<const int32_t> prompt) {
  learn_ns(ns);
  poll();
  const int32_t bs = pool_.block_size();
  if (prompt.size() < 2) return 0;
  const auto n_full = static_cast<int32_t>((prompt.size() - 1) / static_cast<size_t>(bs));
  if (n_full == 0) return 0;
  const std::span<const int32_t> usable = prompt.first(static_cast<size_t>(n_full) * static_cast<size_t>(bs));
  // Every group's device match stays leased until the end, so the
  // allocation below cannot evict it.
  std::vector<PrefixMatch> device = match_groups(ns, usable);
  int32_t m = n_full;
  for (int32_t g : attention_groups_)
    m = std::min(m, static_cast<int32_t>(device[static_cast<size_t>(g)].blocks.size()));
  if (m >= n_full) return 0;
  const std::vector<uint64_t> keys = PrefixTree::chain_keys(ns, usable, bs);
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<std::pair<KvRunPtr, int32_t>> hit;
  bool from_disk = false;
  if (ram_) hit = ram_->find(keys);
  if (disk_ && (!hit || hit->second < n_full)) {
    // A run still on its way to disk that holds more of the prompt than
    // what we have is worth waiting for (a write, not a prefill).
    const int32_t have = hit ? hit->second : m;
    for (int32_t b = n_full - 1; b >= have; --b) {
      if (writer_->covers(keys[static_cast<size_t>(b)])) {
        for (const Error& e : writer_->flush()) note_disk_error(e);
        break;
      }
    }
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
  if (hybrid() && n != run.n_blocks()) return 0;  // the state is at the run's end only
  // Per group: the device keeps its blocks [0, first[g]); blocks [first[g], n)
  // come from the run into fresh blocks, except those resuming at n does not
  // read (first_kept), which a sliding layer's run may lack: hollow nodes.
  std::vector<int32_t> first(spec_.size(), n);
  int32_t need = 0;
  for (int32_t g : attention_groups_) {
    const auto gi = static_cast<size_t>(g);
    first[gi] = std::min(n, static_cast<int32_t>(device[gi].blocks.size()));
    need += n - std::max(first[gi], first_kept(g, n));
    // Resuming at n reads blocks [first_kept, n): the device's part of them
    // must hold KV, the run must hold the rest.
    for (int32_t b = first_kept(g, n); b < first[gi]; ++b) {
      if (!device[gi].blocks[static_cast<size_t>(b)].valid()) return 0;
    }
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    const int32_t g = layers_[l].group;
    if (run.first_block[l] > std::max(first[static_cast<size_t>(g)], first_kept(g, n))) return 0;
  }
  if (!pool_.can_allocate(need)) return 0;
  auto fresh = pool_.allocate(need);  // may evict (and spill) other cached blocks
  if (!fresh.ok()) return 0;
  // A fresh block id may still key a checkpoint of its previous contents.
  if (hybrid()) {
    for (const BlockLease& lease : *fresh) states_->drop_checkpoint(lease.block());
  }
  std::vector<std::vector<int32_t>> ids(spec_.size());
  size_t next = 0;
  for (int32_t g : attention_groups_) {
    const auto gi = static_cast<size_t>(g);
    ids[gi] = device[gi].block_ids();
    ids[gi].resize(static_cast<size_t>(first[gi]));
    for (int32_t b = first[gi]; b < n; ++b) ids[gi].push_back(b < first_kept(g, n) ? -1 : (*fresh)[next++].block());
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    const int32_t g = layers_[l].group;
    const auto gi = static_cast<size_t>(g);
    const size_t block_bytes = layers_[l].row_bytes * static_cast<size_t>(bs);
    const size_t v_block_bytes = v_row(layers_[l]) * static_cast<size_t>(bs);
    const int32_t b0 = std::max(first[gi], first_kept(g, n));
    if (b0 >= n) continue;
    const auto skip = static_cast<size_t>(b0 - run.first_block[l]);
    Status st = copy_blocks_in(
        l, std::span<const int32_t>(ids[gi]).subspan(static_cast<size_t>(b0), static_cast<size_t>(n - b0)),
        run.k[l].data() + skip * block_bytes, run.v[l].data() + skip * v_block_bytes);
    if (!st.ok()) {
      last_error_ = st.error().message;
      return 0;
    }
  }
  if (hybrid()) {
    // The state after the run's last token becomes that block's checkpoint.
    auto c = states_->take_checkpoint(ids[static_cast<size_t>(key_group_)][static_cast<size_t>(n - 1)]);
    if (!c.ok()) return 0;
    std::vector<uint8_t> layer_state;
    for (size_t sl = 0; sl < run.state.size(); ++sl) {
      layer_state.clear();
      for (const KvTensorData& t : run.state[sl].tensors)
        layer_state.insert(layer_state.end(), t.bytes.begin(), t.bytes.end());
      Status st = model_.copy_state_in(*c, static_cast<int64_t>(sl), layer_state.data());
      if (!st.ok()) {
        states_->drop_checkpoint(ids[static_cast<size_t>(key_group_)][static_cast<size_t>(n - 1)]);
        last_error_ = st.error().message;
        return 0;
      }
    }
  }
  for (int32_t g : attention_groups_) {
    if (first[static_cast<size_t>(g)] < n) {
      tree_.insert(KvManager::group_ns(ns, g), usable.first(static_cast<size_t>(n) * static_cast<size_t>(bs)),
                   ids[static_cast<size_t>(g)]);
    }
  }
  // Leases go back tail first: the restored blocks stay cached (LRU) for
  // the admission that follows.
  for (int32_t g : attention_groups_) {
    std::vector<BlockLease> all = std::move(device[static_cast<size_t>(g)].blocks);
    release_tail_first(all);
  }
  release_tail_first(*fresh);
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

KvTiers::DevicePrefix KvTiers::device_prefix(uint64_t ns, std::span<const int32_t> tokens) {
  DevicePrefix p;
  p.matches = match_groups(ns, tokens);
  p.ids.resize(spec_.size());
  size_t n = SIZE_MAX;
  for (int32_t g : attention_groups_) {
    p.ids[static_cast<size_t>(g)] = p.matches[static_cast<size_t>(g)].block_ids();
    n = std::min(n, p.ids[static_cast<size_t>(g)].size());
  }
  p.n_blocks = storable_prefix(p.ids, n, &p.checkpoint);
  return p;
}

int32_t KvTiers::write_behind(uint64_t ns, std::span<const int32_t> tokens) {
  if (!disk_ || write_behind_min_tokens_ <= 0 || static_cast<int64_t>(tokens.size()) < write_behind_min_tokens_) {
    return 0;
  }
  learn_ns(ns);
  poll();
  const int32_t bs = pool_.block_size();
  DevicePrefix prefix = device_prefix(ns, tokens);
  std::vector<PrefixMatch>& device = prefix.matches;
  std::vector<std::vector<int32_t>>& ids = prefix.ids;
  const size_t n = prefix.n_blocks;
  const int32_t checkpoint = prefix.checkpoint;
  if (n == 0 || static_cast<int64_t>(n) * bs < write_behind_min_tokens_) return 0;
  std::vector<uint64_t> keys = PrefixTree::chain_keys(ns, tokens.first(n * static_cast<size_t>(bs)), bs);
  const uint64_t last = keys.back();
  if (disk_->covers(last) || writer_->covers(last)) return 0;  // on disk or on its way: written once
  // Dropped before anything is copied when the queue has no room.
  if (!writer_->has_room(run_bytes(static_cast<int32_t>(n), checkpoint >= 0), kMaxWriteBehindBytes)) {
    ++write_behind_dropped_;
    return 0;
  }
  auto run = build_run(ns, tokens, ids, std::move(keys), checkpoint);
  if (!run.ok()) {
    note_disk_error(run.error());
    return 0;
  }
  if (!writer_->try_push(std::move(*run), kMaxWriteBehindBytes)) {
    ++write_behind_dropped_;
    return 0;
  }
  ++write_behind_queued_;
  for (PrefixMatch& d : device) release_tail_first(d.blocks);
  return static_cast<int32_t>(n) * bs;
}

int64_t KvTiers::close_disk_queue(std::chrono::steady_clock::time_point deadline) {
  return writer_ ? writer_->close(deadline) : 0;
}

Result<int32_t> KvTiers::persist(uint64_t ns, std::span<const int32_t> tokens) {
  if (!disk_) return Error{"cache warm: no disk tier (--cache-dir) is configured"};
  learn_ns(ns);
  const int32_t bs = pool_.block_size();
  DevicePrefix prefix = device_prefix(ns, tokens);
  std::vector<PrefixMatch>& device = prefix.matches;
  std::vector<std::vector<int32_t>>& ids = prefix.ids;
  const size_t n = prefix.n_blocks;
  const int32_t checkpoint = prefix.checkpoint;
  if (n == 0) {
    return Error{"cache warm: the prompt has no full block of " + std::to_string(bs) + " tokens cached" +
                 (hybrid() ? " with a recurrent-state checkpoint" : "")};
  }
  std::vector<uint64_t> keys = PrefixTree::chain_keys(ns, tokens.first(n * static_cast<size_t>(bs)), bs);
  RILL_ASSIGN_OR_RETURN(KvRunPtr run, build_run(ns, tokens, ids, std::move(keys), checkpoint));
  for (const Error& e : writer_->flush()) note_disk_error(e);  // one writer per file name at a time
  RILL_TRY(disk_->put(*run));
  for (PrefixMatch& d : device) release_tail_first(d.blocks);
  return static_cast<int32_t>(n) * bs;
}

}  // namespace rill
