#pragma once
// DiskTier: the disk tier of the prefix cache, one KV file (format v2,
// kv/kv_file.h) per run in a directory, under a byte cap, least recently
// used first out. It survives restarts: open() scans the directory,
// removes `.tmp` orphans (a writer killed mid-write) and every file that is
// corrupt (bad magic, lengths or header hash) or belongs to another model,
// config or tokenizer, and indexes the rest. Files are opened (mapped) only
// when a lookup hits them; a file that then fails (identity, namespace,
// tensor hash with verify on, shape) is removed and the lookup is a miss.
// The directory is owned by one process: open() takes an exclusive lock on
// `<dir>/LOCK` and a second process gets an error naming the directory.
// Not thread-safe (the engine thread owns it).
#include <cstddef>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/result.h"
#include "kv/kv_dir.h"
#include "kv/kv_run.h"

namespace rill {

struct DiskTierOptions {
  std::string dir;
  size_t cap_bytes = 0;
  // --kv-verify: at open, also check every tensor hash of every file (reads
  // the whole directory) and remove the files that fail. Loads always check.
  bool verify_at_open = false;
  KvFileIdentity identity;  // model, config, tokenizer (ns is per run)
  int32_t block_size = 16;
};

class DiskTier {
 public:
  static Result<std::unique_ptr<DiskTier>> open(const DiskTierOptions& options);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  bool covers(uint64_t key) const { return index_.contains(key); }
  // Writes `run` as a file (atomically) and evicts least recently used files
  // beyond the cap. A run larger than the cap is not written.
  Status put(const KvRun& run);
  // put() in two halves, so the write can leave the engine thread
  // (DiskWriter): write_file touches only the file system and the tier's
  // options, so another thread may run it while the engine thread uses the
  // tier (one write per file name at a time); add_written (engine thread)
  // then indexes the file and evicts beyond the cap. An empty path: the run
  // was not written (larger than the cap).
  struct Written {
    std::string path;
    uint64_t bytes = 0;
    int64_t created_at = 0;
  };
  Result<Written> write_file(const KvRun& run) const;
  void add_written(const KvRun& run, const Written& w);
  // The run (mapped from its file) holding the longest prefix of `keys` in
  // namespace ns that it can resume at (KvRun::min_resume_blocks), and how
  // many blocks match; nullopt on a miss or when the
  // file fails (then it is removed and counted as an error).
  std::optional<std::pair<KvRunPtr, int32_t>> find(std::span<const uint64_t> keys, uint64_t ns);

  struct Listing {
    std::string path;
    uint64_t bytes = 0;
    int64_t tokens = 0;
    int64_t created_at = 0;
  };
  std::vector<Listing> list() const;
  // Removes every file.
  void clear();
  const TierStats& stats() const { return stats_; }
  // A restore served from this tier took `seconds` (TierStats::loads).
  void count_load(double seconds) {
    ++stats_.loads;
    stats_.load_seconds += seconds;
  }
  // Files removed by open() (orphans, corrupt, other identity).
  int64_t removed_at_open() const { return removed_at_open_; }
  // The reason the last file was dropped at a load ("" if none was).
  const std::string& last_error() const { return last_error_; }
  const std::string& dir() const { return options_.dir; }

 private:
  struct Entry {
    std::string path;
    uint64_t bytes = 0;
    int64_t tokens = 0, created_at = 0;
    std::vector<uint64_t> keys;
    int32_t min_resume = 1;  // KvRun::min_resume_blocks of the file's run
    std::list<uint64_t>::iterator lru;
  };
  explicit DiskTier(DiskTierOptions options) : options_(std::move(options)) {}
  Status scan();
  void add(Entry e);
  void remove(uint64_t id, bool unlink_file);
  // Drops a file that failed at a load: logged, counted, removed.
  void drop_failed(uint64_t id, const std::string& reason);

  DiskTierOptions options_;
  std::optional<KvDirLock> lock_;  // held for the tier's lifetime
  uint64_t bytes_ = 0, next_id_ = 1;
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;  // front: least recently used
  TierIndex index_;
  std::unordered_map<uint64_t, uint64_t> by_last_key_;  // an entry's last chain key -> its id
  TierStats stats_;
  int64_t removed_at_open_ = 0;
  std::string last_error_;
};

// The file name of a run: the hex chain key of its last block.
std::string kv_run_file_name(uint64_t last_key);

}  // namespace rill
