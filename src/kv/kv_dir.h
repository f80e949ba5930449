#pragma once
// A disk-tier directory seen from outside the tier (`rill cache ls|clear`)
// and its ownership lock. The directory holds KV files (`<hex key>.rkv`,
// kv/kv_file.h), `.tmp` files of writes in progress, and `LOCK`, which the
// owning process (DiskTier) holds with an exclusive flock for its lifetime.
#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"

namespace rill {

// The exclusive lock on `<dir>/LOCK`, released when destroyed.
class KvDirLock {
 public:
  // Creates the directory if needed. A lock held by another process is an
  // error naming the directory ("... is in use by another rill process").
  static Result<KvDirLock> acquire(const std::string& dir);
  KvDirLock(KvDirLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  KvDirLock& operator=(KvDirLock&& o) noexcept;
  KvDirLock(const KvDirLock&) = delete;
  KvDirLock& operator=(const KvDirLock&) = delete;
  ~KvDirLock();

 private:
  explicit KvDirLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// True when a process holds `<dir>/LOCK` (probes without keeping the lock).
bool kv_dir_locked(const std::string& dir);

struct KvDirEntry {
  std::string file;  // the file name inside the directory
  uint64_t bytes = 0;
  int64_t tokens = 0;
  int64_t created_at = 0;  // unix seconds, from the header
  std::string error;       // non-empty: the header is unreadable (the next open removes the file)
};

// Every `.rkv` file of `dir`, headers read (never mapped, no lock taken, so
// a running server's directory can be listed), sorted by file name.
Result<std::vector<KvDirEntry>> list_kv_dir(const std::string& dir);

// Removes every `.rkv` and `.tmp` file of `dir` under its lock; returns how
// many. Refuses (the lock's error) while another process owns the directory.
Result<int64_t> clear_kv_dir(const std::string& dir);

}  // namespace rill
