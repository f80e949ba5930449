#include "core/lazy_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace rill {

Result<LazyBuffer> LazyBuffer::allocate(size_t bytes) {
  LazyBuffer b;
  if (bytes == 0) return b;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
  if (p == MAP_FAILED) {
    return Error{"cannot reserve " + std::to_string(bytes >> 20) + " MiB: " + std::strerror(errno)};
  }
  b.data_ = static_cast<uint8_t*>(p);
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
