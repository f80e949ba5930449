#pragma once
// LazyBuffer: a large zero-initialised anonymous mapping whose pages cost
// memory only once touched. Used for KV caches sized for the full context,
// so resident memory follows the tokens actually cached. The region is 2 MiB
// aligned and advised for transparent huge pages (MADV_HUGEPAGE): pages
// become resident 2 MiB at a time where the kernel allows it. RAII.
#include <cstddef>
#include <cstdint>

#include "core/result.h"

namespace rill {

class LazyBuffer {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;
  static Result<LazyBuffer> allocate(size_t bytes);
  LazyBuffer() = default;
  LazyBuffer(LazyBuffer&& o) noexcept;
  LazyBuffer& operator=(LazyBuffer&& o) noexcept;
  LazyBuffer(const LazyBuffer&) = delete;
  LazyBuffer& operator=(const LazyBuffer&) = delete;
  ~LazyBuffer();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace rill
