#include "kv/disk_tier.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "core/hash.h"
#include "kv/prefix_tree.h"

namespace rill {
namespace fs = std::filesystem;

namespace {
constexpr const char* kSuffix = ".rkv";

// This tier's identity for a run of namespace ns.
KvFileIdentity with_ns(KvFileIdentity id, uint64_t ns) {
  id.ns = ns;
  return id;
}

// Elements of a row of row_bytes bytes of t (GGML blocks included).
int64_t row_elements(DType t, size_t row_bytes) {
  const DTypeInfo info = dtype_info(t);
  return static_cast<int64_t>(row_bytes / static_cast<size_t>(info.block_bytes)) * info.block_size;
}

// The run's resume rule (kv_min_resume_blocks) from a file's header; 0 when
// a layer's firstToken is not on a block boundary (not a file we wrote).
int32_t header_min_resume(const KvFileHeader& h, int32_t block_size) {
  std::vector<LayerKind> kinds;
  std::vector<int32_t> windows, first_block;
  bool has_state = false;
  for (const KvLayerDesc& l : h.layers) {
    if (l.kind == LayerKind::kRecurrent) {
      has_state = true;
      continue;
    }
    if (l.first_token % block_size != 0) return 0;
    kinds.push_back(l.kind);
    windows.push_back(l.window);
    first_block.push_back(static_cast<int32_t>(l.first_token / block_size));
  }
  const auto n_blocks = static_cast<int32_t>(h.tokens.size() / static_cast<size_t>(block_size));
  return kv_min_resume_blocks(n_blocks, block_size, has_state, kinds, windows, first_block);
}
}  // namespace

std::string kv_run_file_name(uint64_t last_key) {
  return hex64(last_key) + kSuffix;
}

Result<std::unique_ptr<DiskTier>> DiskTier::open(const DiskTierOptions& options) {
  std::unique_ptr<DiskTier> t(new DiskTier(options));
  RILL_ASSIGN_OR_RETURN(KvDirLock lock, KvDirLock::acquire(options.dir));
  t->lock_.emplace(std::move(lock));
  RILL_TRY(t->scan());
  return t;
}

DiskTier::~DiskTier() = default;

Status DiskTier::scan() {
  struct Found {
    Entry e;
    fs::file_time_type mtime;
  };
  std::vector<Found> found;
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(options_.dir, ec)) {
    const fs::path p = de.path();
    const std::string name = p.filename().string();
    if (name.size() > 4 && name.ends_with(".tmp")) {  // a writer died mid-write
      fs::remove(p, ec);
      ++removed_at_open_;
      continue;
    }
    if (!name.ends_with(kSuffix) || !de.is_regular_file(ec)) continue;
    auto header = read_kv_header(p.string());
    if (header.ok() && options_.verify_at_open) {
      auto whole = KvFile::open(p.string(), nullptr, /*verify_tensors=*/true);
      if (!whole.ok()) {
        std::fprintf(stderr, "kv cache %s: %s; removed\n", options_.dir.c_str(), whole.error().message.c_str());
        header = whole.error();
      }
    }
    bool ok =
        header.ok() && kv_identity_mismatch(with_ns(options_.identity, header->identity.ns), header->identity).empty();
    Entry e;
    if (ok) {
      const auto n_tok = static_cast<int64_t>(header->tokens.size());
      ok = n_tok >= options_.block_size && n_tok % options_.block_size == 0;
      if (ok) {
        e.keys = PrefixTree::chain_keys(header->identity.ns, header->tokens, options_.block_size);
        ok = name == kv_run_file_name(e.keys.back());  // a renamed or foreign file is not trusted
        e.min_resume = header_min_resume(*header, options_.block_size);
        ok = ok && e.min_resume >= 1 && e.min_resume <= static_cast<int32_t>(e.keys.size());  // it can resume somewhere
      }
      e.tokens = n_tok;
      e.created_at = header->created_at;
    }
    if (!ok) {
      fs::remove(p, ec);
      ++removed_at_open_;
      continue;
    }
    e.path = p.string();
    e.bytes = static_cast<uint64_t>(de.file_size(ec));
    found.push_back({std::move(e), de.last_write_time(ec)});
  }
  if (ec) return Error{options_.dir + ": cannot scan the cache directory: " + ec.message()};
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  for (Found& f : found) add(std::move(f.e));
  while (bytes_ > options_.cap_bytes && !lru_.empty()) {  // the cap may have shrunk since
    remove(lru_.front(), /*unlink_file=*/true);
    ++stats_.evictions;
  }
  return Status::Ok();
}

void DiskTier::add(Entry e) {
  // A file for the same chain replaces the old entry (same name: the file
  // itself was replaced). A file whose whole chain the new one holds, and
  // which resumes nowhere the new one cannot, is redundant: removed, so a
  // conversation written behind turn after turn keeps one file.
  for (size_t i = 0; i < e.keys.size(); ++i) {
    auto it = by_last_key_.find(e.keys[i]);
    if (it == by_last_key_.end()) continue;
    const uint64_t old = it->second;
    const Entry& o = entries_.at(old);
    if (i + 1 == e.keys.size()) {
      remove(old, /*unlink_file=*/o.path != e.path);
    } else if (e.min_resume <= o.min_resume && o.keys.size() == i + 1) {
      remove(old, /*unlink_file=*/true);
      ++stats_.replaced;
    }
  }
  const uint64_t id = next_id_++;
  by_last_key_[e.keys.back()] = id;
  lru_.push_back(id);
  e.lru = std::prev(lru_.end());
  index_.add(id, e.keys, e.min_resume);
  bytes_ += e.bytes;
  entries_.emplace(id, std::move(e));
  stats_.bytes = static_cast<int64_t>(bytes_);
  stats_.entries = static_cast<int64_t>(entries_.size());
}

void DiskTier::drop_failed(uint64_t id, const std::string& reason) {
  last_error_ = reason;
  std::fprintf(stderr, "kv cache %s: %s; entry removed, its prefix is recomputed\n", options_.dir.c_str(),
               reason.c_str());
  remove(id, /*unlink_file=*/true);
  ++stats_.errors;
  ++stats_.misses;
}

void DiskTier::remove(uint64_t id, bool unlink_file) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  index_.remove(id, it->second.keys);
  if (auto last = by_last_key_.find(it->second.keys.back()); last != by_last_key_.end() && last->second == id) {
    by_last_key_.erase(last);
  }
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  if (unlink_file) ::unlink(it->second.path.c_str());
  entries_.erase(it);
  stats_.bytes = static_cast<int64_t>(bytes_);
  stats_.entries = static_cast<int64_t>(entries_.size());
}

Result<DiskTier::Written> DiskTier::write_file(const KvRun& run) const {
  Written w;
  if (run.bytes() > options_.cap_bytes || run.keys.empty()) return w;  // not kept: nothing to write
  std::vector<KvLayerData> layers(run.k.size());
  const auto n_tok = static_cast<int64_t>(run.tokens.size());
  for (size_t l = 0; l < run.k.size(); ++l) {
    const int64_t width = row_elements(run.dtypes[l], run.row_bytes[l]);
    const int64_t v_width = row_elements(run.v_dtype(l), run.v_row(l));
    const int64_t first = static_cast<int64_t>(run.first_block[l]) * run.block_size;
    layers[l].kind = run.kinds[l];
    layers[l].window = run.windows[l];
    layers[l].first_token = first;
    layers[l].tensors.push_back({"k", {n_tok - first, width}, run.dtypes[l], run.k[l]});
    layers[l].tensors.push_back({"v", {n_tok - first, v_width}, run.v_dtype(l), run.v[l]});
  }
  layers.insert(layers.end(), run.state.begin(), run.state.end());
  KvFileIdentity id = options_.identity;
  id.ns = run.ns;
  w.path = (fs::path(options_.dir) / kv_run_file_name(run.keys.back())).string();
  RILL_TRY(write_kv_file(w.path, id, run.tokens, layers));
  std::error_code ec;
  w.bytes = static_cast<uint64_t>(fs::file_size(w.path, ec));
  w.created_at = static_cast<int64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  return w;
}

void DiskTier::add_written(const KvRun& run, const Written& w) {
  if (w.path.empty()) return;
  Entry e;
  e.path = w.path;
  e.bytes = w.bytes;
  e.tokens = static_cast<int64_t>(run.tokens.size());
  e.created_at = w.created_at;
  e.keys = run.keys;
  e.min_resume = run.min_resume_blocks();
  add(std::move(e));
  while (bytes_ > options_.cap_bytes && lru_.size() > 1) {
    remove(lru_.front(), /*unlink_file=*/true);
    ++stats_.evictions;
  }
}

Status DiskTier::put(const KvRun& run) {
  RILL_ASSIGN_OR_RETURN(Written w, write_file(run));
  add_written(run, w);
  return Status::Ok();
}

std::optional<std::pair<KvRunPtr, int32_t>> DiskTier::find(std::span<const uint64_t> keys, uint64_t ns) {
  const auto hit = index_.longest(keys);
  if (!hit) {
    ++stats_.misses;
    return std::nullopt;
  }
  Entry& e = entries_.at(hit->entry);
  KvFileIdentity want = options_.identity;
  want.ns = ns;
  // Every tensor's hash, always: corrupt KV must be a miss, never an answer.
  auto file = KvFile::open(e.path, &want, /*verify_tensors=*/true);
  if (!file.ok()) {
    drop_failed(hit->entry, file.error().message);
    return std::nullopt;
  }
  bool ok = true;
  auto run = std::make_shared<KvRun>();
  if (ok) {
    const KvFileHeader& h = file->header();
    run->ns = ns;
    run->block_size = options_.block_size;
    run->tokens = h.tokens;
    run->keys = PrefixTree::chain_keys(ns, h.tokens, options_.block_size);
    ok = run->keys.size() > static_cast<size_t>(hit->n_blocks - 1) && run->keys == e.keys;
  }
  if (ok) {
    auto shared = std::make_shared<const KvFile>(std::move(*file));
    run->file = shared;
    for (size_t l = 0; ok && l < shared->header().layers.size(); ++l) {
      const KvLayerDesc& d = shared->header().layers[l];
      if (d.kind == LayerKind::kRecurrent) {  // a state: its tensors as they are
        KvLayerData st{d.kind, {}};
        for (size_t t = 0; t < d.tensors.size(); ++t) {
          st.tensors.push_back({d.tensors[t].name, d.tensors[t].shape, d.tensors[t].dtype, shared->tensor(l, t)});
        }
        run->state.push_back(std::move(st));
        continue;
      }
      // K and V may differ in type (k4c), not in shape.
      ok = d.tensors.size() == 2 && d.tensors[0].name == "k" && d.tensors[1].name == "v" &&
           d.tensors[0].shape.size() == 2 && d.tensors[0].shape == d.tensors[1].shape &&
           d.first_token % options_.block_size == 0 &&
           d.tensors[0].shape[1] % dtype_info(d.tensors[0].dtype).block_size == 0 &&
           d.tensors[1].shape[1] % dtype_info(d.tensors[1].dtype).block_size == 0 &&
           d.tensors[0].shape[0] + d.first_token == static_cast<int64_t>(run->tokens.size());
      if (!ok) break;
      run->kinds.push_back(d.kind);
      run->windows.push_back(d.window);
      run->first_block.push_back(static_cast<int32_t>(d.first_token / options_.block_size));
      run->dtypes.push_back(d.tensors[0].dtype);
      run->row_bytes.push_back(row_bytes(d.tensors[0].dtype, d.tensors[0].shape[1]));
      run->v_dtypes.push_back(d.tensors[1].dtype);
      run->v_row_bytes.push_back(row_bytes(d.tensors[1].dtype, d.tensors[1].shape[1]));
      run->k.push_back(shared->tensor(l, 0));
      run->v.push_back(shared->tensor(l, 1));
    }
  }
  if (!ok) {
    drop_failed(hit->entry, e.path + ": KV file does not match its name or the model's KV layout");
    return std::nullopt;
  }
  lru_.splice(lru_.end(), lru_, e.lru);
  ++stats_.hits;
  return std::make_pair(KvRunPtr(std::move(run)), hit->n_blocks);
}

std::vector<DiskTier::Listing> DiskTier::list() const {
  std::vector<Listing> out;
  for (uint64_t id : lru_) {
    const Entry& e = entries_.at(id);
    out.push_back({e.path, e.bytes, e.tokens, e.created_at});
  }
  return out;
}

void DiskTier::clear() {
  while (!lru_.empty()) remove(lru_.front(), /*unlink_file=*/true);
}

}  // namespace rill
