#pragma once
// HostArena: the host-RAM tier's memory, one mapping of the tier's byte cap
// carved into runs. Why: a spill copies a whole chain (tens of MiB) on the
// path of the request whose allocation evicted it; into fresh heap memory
// that copy also pays a zero fill and a page fault per 4 KiB page, several
// times the copy itself. The arena is advised for transparent huge pages and
// its pages are made resident once, ahead of use, by a background thread
// (MADV_POPULATE_WRITE, which maps pages without touching their bytes, so it
// may run while runs are written; on a kernel without it pages fault in on
// first use, 2 MiB at a time where THP allows). Runs freed by the tier are
// reused as they are: no fill, no fault.
//
// HostBytes is the RAII handle of one allocation: an extent of an arena
// (given back when the handle dies, so a run that a restore still holds keeps
// its bytes after the tier dropped it) or, where no arena extent fits, a
// mapping of its own (HostBytes::own). Not thread-safe: allocate and free on
// one thread (the engine's); only the prefault thread runs beside it.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <thread>

#include "core/lazy_buffer.h"
#include "core/result.h"

namespace rill {

class HostArena;

class HostBytes {
 public:
  HostBytes() = default;
  HostBytes(HostBytes&& o) noexcept;
  HostBytes& operator=(HostBytes&& o) noexcept;
  HostBytes(const HostBytes&) = delete;
  HostBytes& operator=(const HostBytes&) = delete;
  ~HostBytes();

  // `bytes` in a mapping of its own (THP-advised, zero pages until touched).
  static Result<HostBytes> own(size_t bytes);

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  explicit operator bool() const { return data_ != nullptr; }
  bool in_arena() const { return extents_ != nullptr; }

 private:
  friend class HostArena;
  struct Extents;  // an arena's free list, shared with its live allocations
  void reset();

  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<Extents> extents_;  // arena allocations
  size_t off_ = 0, span_ = 0;         // the extent (span_ >= size_, aligned)
  LazyBuffer own_;                    // own mappings
};

class HostArena {
 public:
  // Extents are multiples of this (page size), so runs stay page aligned.
  static constexpr size_t kAlign = 4096;

  // Reserves `bytes` (rounded up to kAlign); with `prefault`, a background
  // thread makes every page resident (see above).
  static Result<std::unique_ptr<HostArena>> create(size_t bytes, bool prefault);
  ~HostArena();  // stops and joins the prefault thread
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  // `bytes` (> 0) from the smallest free extent that holds them; an empty
  // handle when none does.
  HostBytes allocate(size_t bytes);

  size_t capacity() const;
  size_t free_bytes() const;
  size_t largest_free() const;
  // Whether the prefault thread has finished (tests, diagnostics).
  bool prefault_done() const { return prefault_done_.load(std::memory_order_acquire); }

 private:
  HostArena() = default;
  void prefault();

  std::shared_ptr<HostBytes::Extents> extents_;
  std::thread prefault_thread_;
  std::atomic<bool> stop_{false}, prefault_done_{false};
};

// The arena's mapping and free extents (offset -> length, coalesced). Owned
// jointly by the arena and its allocations, so an allocation may outlive the
// HostArena object safely.
struct HostBytes::Extents {
  LazyBuffer memory;
  std::map<size_t, size_t> free;
  size_t n_free = 0;

  void give_back(size_t off, size_t len);
};

}  // namespace rill
