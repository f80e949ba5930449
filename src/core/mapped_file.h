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
  static Result<MappedFile> open(const std::string& path);

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
