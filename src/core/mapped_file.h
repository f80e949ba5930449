#pragma once
// MappedFile: a read-only (or private copy-on-write) memory mapping of a
// whole file. RAII: the mapping lives exactly as long as the object.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/result.h"

namespace rill {

class MappedFile {
 public:
  // Maps `path` read-only. An empty file maps to data()==nullptr, size()==0.
  // populate: fault the whole mapping in now (MAP_POPULATE), for files that
  // are read whole (model weights): the page faults of the first pass over
  // the file (one per 4 KiB page or fault-around group; ~0.35 s for a 0.9 GB
  // GGUF, measured) move from the first forward pass to the load, as
  // llama.cpp's loader does. Without it pages are faulted in as touched.
  static Result<MappedFile> open(const std::string& path, bool populate = false);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace rill
