#pragma once
// DiskWriter: writes spilled runs to the disk tier on a thread of its own.
// Why: a run reaches disk when the RAM tier evicts it (or, without a RAM
// tier, when the device cache does), and both happen inside a block
// allocation, on the path of the request that allocated; writing tens of
// MiB and an fsync there would stall that request by far more than its own
// work. Runs are immutable and shared by pointer, so the writer only reads
// them (DiskTier::write_file); the engine thread indexes each finished file
// (DiskTier::add_written) when it next calls collect(), and drops its run
// there, so a run's arena bytes are only ever given back on the engine
// thread. A queued run is not yet a disk hit (its chain may still be
// restored from the RAM tier if it is there, else it is computed), but it
// counts as held for the spill hook (covers), so it is not copied again.
//
// Backpressure: beyond max_pending_bytes of queued runs, push() waits for
// older writes (the synchronous behaviour, only under sustained overflow).
// try_push() is for writes that may be skipped (write-behind of finished
// requests, KvTiers::write_behind): it queues only while the pending bytes
// stay within its limit, and never waits.
// Writes into one directory come from this thread only; flush() waits until
// the queue is empty, for writers that bypass it (a warm-up's put).
// The destructor finishes every queued write (so a restart finds them);
// close(deadline) bounds that for shutdown.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kv/disk_tier.h"

namespace rill {

class DiskWriter {
 public:
  DiskWriter(DiskTier& disk, size_t max_pending_bytes);
  ~DiskWriter();
  DiskWriter(const DiskWriter&) = delete;
  DiskWriter& operator=(const DiskWriter&) = delete;

  // Queues `run` (engine thread). After close(): dropped (counted).
  void push(KvRunPtr run);
  // Whether try_push would queue a run of `bytes` now: the queue is empty,
  // or its pending bytes plus these stay within limit_bytes (and not closed).
  bool has_room(size_t bytes, size_t limit_bytes) const;
  // Queues `run` if has_room(run->bytes(), limit_bytes) (engine thread);
  // never waits. False: not queued.
  bool try_push(KvRunPtr run, size_t limit_bytes);
  // Any thread: waits until every queued write has reached the disk (file
  // renamed into place, fsynced) or `deadline` passes, then closes the
  // queue: runs still queued at the deadline and every run pushed later
  // are dropped, not written (counted in n_dropped). The write in progress
  // at the deadline finishes (the destructor waits for it). Returns the
  // runs dropped at the deadline (0: everything queued is on disk).
  int64_t close(std::chrono::steady_clock::time_point deadline);
  // Indexes finished writes in the disk tier (engine thread); returns the
  // errors of failed ones.
  std::vector<Error> collect();
  // Waits until every queued write has finished (engine thread), then
  // collect()s.
  std::vector<Error> flush();
  // Whether a queued or unindexed run holds the block with this chain key.
  bool covers(uint64_t key) const;
  size_t pending_bytes() const;
  int64_t queue_depth() const;
  // Any thread: runs queued or being written now, files written (on disk,
  // indexed or not yet), runs dropped unwritten (close).
  int64_t n_written() const;
  int64_t n_dropped() const;

 private:
  struct Done {
    KvRunPtr run;
    Result<DiskTier::Written> written;
    bool dropped = false;  // never written (close)
  };
  void loop();
  void forget_keys(const KvRun& run);  // engine thread

  DiskTier& disk_;
  const size_t max_pending_bytes_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<KvRunPtr> queue_;  // not yet written
  size_t n_writing_ = 0;        // 0 or 1: popped, being written
  std::vector<Done> done_;      // written (or failed), not yet indexed
  size_t pending_bytes_ = 0;    // queued + being written + not yet indexed
  bool stop_ = false;
  bool closed_ = false;    // close(): nothing more is written
  int64_t n_dropped_ = 0;  // guarded by mu_
  int64_t n_written_ = 0;  // guarded by mu_
  // Engine thread only: chain keys of every pending run (count per key).
  std::unordered_map<uint64_t, int32_t> pending_keys_;
  std::thread thread_;
};

}  // namespace rill
