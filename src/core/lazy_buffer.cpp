#include "core/lazy_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

namespace rill {

Result<LazyBuffer> LazyBuffer::allocate(size_t bytes) {
  LazyBuffer b;
  if (bytes == 0) return b;
  // Reserve one huge page more than asked and trim to a 2 MiB-aligned
  // region, so transparent huge pages can back all of it.
  size_t reserve = 0;
  if (__builtin_add_overflow(bytes, kHugePage, &reserve)) {
    return Error{"cannot reserve " + std::to_string(bytes >> 20) + " MiB: too large"};
  }
  void* p = ::mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return Error{"cannot reserve " + std::to_string(bytes >> 20) + " MiB: " + std::strerror(errno)};
  }
  auto* raw = static_cast<uint8_t*>(p);
  const uintptr_t addr = reinterpret_cast<uintptr_t>(raw);
  uint8_t* aligned = raw + ((kHugePage - addr % kHugePage) % kHugePage);
  if (aligned > raw) ::munmap(raw, static_cast<size_t>(aligned - raw));
  const size_t tail = static_cast<size_t>(raw + reserve - (aligned + bytes));
  if (tail > 0) ::munmap(aligned + bytes, tail);
  // Advice only: where THP is off the buffer simply stays in 4 KiB pages.
  ::madvise(aligned, bytes, MADV_HUGEPAGE);
  b.data_ = aligned;
  b.size_ = bytes;
  return b;
}

LazyBuffer::LazyBuffer(LazyBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

LazyBuffer& LazyBuffer::operator=(LazyBuffer&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(data_, size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

LazyBuffer::~LazyBuffer() {
  if (data_) ::munmap(data_, size_);
}

}  // namespace rill
