#pragma once
// LazyBuffer: a large zero-initialised anonymous mapping whose pages cost
// memory only once touched. Used for KV caches sized for the full context,
// so resident memory follows the tokens actually cached. RAII.
#include <cstddef>
#include <cstdint>

#include "core/result.h"

namespace rill {

class LazyBuffer {
 public:
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
