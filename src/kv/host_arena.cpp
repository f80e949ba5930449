#include "kv/host_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <utility>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL
#endif

namespace rill {

HostBytes::HostBytes(HostBytes&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      extents_(std::move(o.extents_)),
      off_(o.off_),
      span_(o.span_),
      own_(std::move(o.own_)) {}

HostBytes& HostBytes::operator=(HostBytes&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    extents_ = std::move(o.extents_);
    off_ = o.off_;
    span_ = o.span_;
    own_ = std::move(o.own_);
  }
  return *this;
}

HostBytes::~HostBytes() {
  reset();
}

void HostBytes::reset() {
  if (extents_) extents_->give_back(off_, span_);
  extents_.reset();
  own_ = LazyBuffer();
  data_ = nullptr;
  size_ = 0;
}

Result<HostBytes> HostBytes::own(size_t bytes) {
  HostBytes b;
  RILL_ASSIGN_OR_RETURN(b.own_, LazyBuffer::allocate(bytes));
  b.data_ = b.own_.data();
  b.size_ = bytes;
  return b;
}

void HostBytes::Extents::give_back(size_t off, size_t len) {
  n_free += len;
  auto next = free.lower_bound(off);
  if (next != free.end() && off + len == next->first) {  // merge with the extent after
    len += next->second;
    next = free.erase(next);
  }
  if (next != free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {  // and with the one before
      prev->second += len;
      return;
    }
  }
  free.emplace(off, len);
}

Result<std::unique_ptr<HostArena>> HostArena::create(size_t bytes, bool prefault) {
  std::unique_ptr<HostArena> a(new HostArena());
  a->extents_ = std::make_shared<HostBytes::Extents>();
  const size_t size = (bytes + kAlign - 1) / kAlign * kAlign;
  RILL_ASSIGN_OR_RETURN(a->extents_->memory, LazyBuffer::allocate(size));
  if (size > 0) {
    a->extents_->free.emplace(0, size);
    a->extents_->n_free = size;
  }
  if (prefault && size > 0) {
    a->prefault_thread_ = std::thread([raw = a.get()] { raw->prefault(); });
  } else {
    a->prefault_done_.store(true, std::memory_order_release);
  }
  return a;
}

HostArena::~HostArena() {
  stop_.store(true, std::memory_order_relaxed);
  if (prefault_thread_.joinable()) prefault_thread_.join();
}

void HostArena::prefault() {
  // In slices, so the destructor need not wait for a whole large arena.
  constexpr size_t kSlice = size_t{32} << 20;
  uint8_t* base = extents_->memory.data();
  const size_t size = extents_->memory.size();
  for (size_t off = 0; off < size && !stop_.load(std::memory_order_relaxed); off += kSlice) {
    if (::madvise(base + off, std::min(kSlice, size - off), MADV_POPULATE_WRITE) != 0) break;
  }
  prefault_done_.store(true, std::memory_order_release);
}

HostBytes HostArena::allocate(size_t bytes) {
  HostBytes out;
  if (bytes == 0) return out;
  const size_t span = (bytes + kAlign - 1) / kAlign * kAlign;
  auto best = extents_->free.end();
  for (auto it = extents_->free.begin(); it != extents_->free.end(); ++it) {
    if (it->second >= span && (best == extents_->free.end() || it->second < best->second)) best = it;
  }
  if (best == extents_->free.end()) return out;
  const size_t off = best->first, len = best->second;
  extents_->free.erase(best);
  if (len > span) extents_->free.emplace(off + span, len - span);
  extents_->n_free -= span;
  out.data_ = extents_->memory.data() + off;
  out.size_ = bytes;
  out.extents_ = extents_;
  out.off_ = off;
  out.span_ = span;
  return out;
}

size_t HostArena::capacity() const {
  return extents_->memory.size();
}
size_t HostArena::free_bytes() const {
  return extents_->n_free;
}
size_t HostArena::largest_free() const {
  size_t best = 0;
  for (const auto& [off, len] : extents_->free) best = std::max(best, len);
  return best;
}

}  // namespace rill
