#include "kv/disk_writer.h"

#include <utility>

namespace rill {

DiskWriter::DiskWriter(DiskTier& disk, size_t max_pending_bytes)
    : disk_(disk), max_pending_bytes_(max_pending_bytes), thread_([this] { loop(); }) {}

DiskWriter::~DiskWriter() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();  // the loop drains the queue first
}

void DiskWriter::loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    work_cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    KvRunPtr run = std::move(queue_.front());
    queue_.pop_front();
    n_writing_ = 1;
    lk.unlock();
    Result<DiskTier::Written> w = disk_.write_file(*run);
    lk.lock();
    n_writing_ = 0;
    if (w.ok() && !w->path.empty()) ++n_written_;
    // The run goes back to the engine thread with the result: its last
    // reference must not die here (arena bytes are the engine thread's).
    done_.push_back({std::move(run), std::move(w)});
    done_cv_.notify_all();
  }
}

void DiskWriter::push(KvRunPtr run) {
  const size_t bytes = run->bytes();
  for (uint64_t key : run->keys) ++pending_keys_[key];
  std::unique_lock lk(mu_);
  if (closed_) {  // handed back unwritten, so the run dies on the engine thread
    pending_bytes_ += bytes;
    ++n_dropped_;
    done_.push_back({std::move(run), DiskTier::Written{}, /*dropped=*/true});
    return;
  }
  // Backpressure: let older writes finish first (one run always fits).
  if (pending_bytes_ > 0 && pending_bytes_ + bytes > max_pending_bytes_) {
    done_cv_.wait(lk, [&] { return queue_.empty() && n_writing_ == 0; });
  }
  pending_bytes_ += bytes;
  queue_.push_back(std::move(run));
  lk.unlock();
  work_cv_.notify_one();
}

bool DiskWriter::has_room(size_t bytes, size_t limit_bytes) const {
  std::lock_guard lk(mu_);
  return !closed_ && (pending_bytes_ == 0 || pending_bytes_ + bytes <= limit_bytes);
}

bool DiskWriter::try_push(KvRunPtr run, size_t limit_bytes) {
  const size_t bytes = run->bytes();
  {
    std::lock_guard lk(mu_);
    if (closed_ || (pending_bytes_ > 0 && pending_bytes_ + bytes > limit_bytes)) return false;
    pending_bytes_ += bytes;
    queue_.push_back(run);
  }
  for (uint64_t key : run->keys) ++pending_keys_[key];
  work_cv_.notify_one();
  return true;
}

int64_t DiskWriter::close(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lk(mu_);
  done_cv_.wait_until(lk, deadline, [&] { return queue_.empty() && n_writing_ == 0; });
  closed_ = true;
  const auto n = static_cast<int64_t>(queue_.size());
  for (KvRunPtr& run : queue_) done_.push_back({std::move(run), DiskTier::Written{}, /*dropped=*/true});
  queue_.clear();
  n_dropped_ += n;
  return n;
}

int64_t DiskWriter::queue_depth() const {
  std::lock_guard lk(mu_);
  return static_cast<int64_t>(queue_.size() + n_writing_);
}

int64_t DiskWriter::n_written() const {
  std::lock_guard lk(mu_);
  return n_written_;
}

int64_t DiskWriter::n_dropped() const {
  std::lock_guard lk(mu_);
  return n_dropped_;
}

std::vector<Error> DiskWriter::collect() {
  std::vector<Done> done;
  {
    std::lock_guard lk(mu_);
    done.swap(done_);
    for (const Done& d : done) pending_bytes_ -= d.run->bytes();
  }
  std::vector<Error> errors;
  for (Done& d : done) {
    if (d.dropped) {
      // counted in n_dropped_ already
    } else if (d.written.ok()) {
      disk_.add_written(*d.run, *d.written);
    } else {
      errors.push_back(d.written.error());
    }
    forget_keys(*d.run);
  }
  return errors;  // `done` drops the runs here, on the engine thread
}

std::vector<Error> DiskWriter::flush() {
  {
    std::unique_lock lk(mu_);
    done_cv_.wait(lk, [&] { return queue_.empty() && n_writing_ == 0; });
  }
  return collect();
}

void DiskWriter::forget_keys(const KvRun& run) {
  for (uint64_t key : run.keys) {
    auto it = pending_keys_.find(key);
    if (it != pending_keys_.end() && --it->second == 0) pending_keys_.erase(it);
  }
}

bool DiskWriter::covers(uint64_t key) const {
  return pending_keys_.count(key) != 0;
}

size_t DiskWriter::pending_bytes() const {
  std::lock_guard lk(mu_);
  return pending_bytes_;
}

}  // namespace rill
