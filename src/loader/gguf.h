#pragma once
// GgufFile: a GGUF v2/v3 file read over mmap. Parses the header, every
// metadata value type (including nested arrays) and the tensor infos, checks
// every offset and size against the file, and leaves tensor data in place.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/result.h"

namespace rill {

// Limits a file must respect (anything beyond is an Error, never a crash):
constexpr int kGgufMaxDims = 4;
constexpr int kGgufMaxArrayDepth = 8;                   // nesting of array values
constexpr uint64_t kGgufMaxArrayElements = 1ull << 24;  // all arrays of a file together (~1 GiB of GgufValue)

// GGUF metadata value types, numbered as in the file format.
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

struct GgufValue;
using GgufArray = std::vector<GgufValue>;

struct GgufValue {
  GgufType type = GgufType::kU8;
  // Integers of every width are held as int64/uint64, floats as double.
  std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<GgufArray>> v;
  GgufType array_type = GgufType::kU8;  // element type when type == kArray

  std::optional<int64_t> as_int() const;   // any integer type (or bool)
  std::optional<double> as_float() const;  // any numeric type
  const std::string* as_string() const;    // nullptr unless kString
  const GgufArray* as_array() const;       // nullptr unless kArray
};

struct GgufTensorInfo {
  std::string name;               // the GGUF name ("blk.0.attn_q.weight")
  uint32_t type = 0;              // raw GGML type id
  std::vector<int64_t> ne;        // GGML order: ne[0] is the innermost (row length)
  uint64_t offset = 0;            // relative to data_start
  const uint8_t* data = nullptr;  // into the mapping; null if the type is unsupported
  size_t n_bytes = 0;             // 0 if the type is unsupported

  int64_t n_elements() const;
};

class GgufFile {
 public:
  // Opens and validates `path`. Unsupported tensor types are not an error
  // here (inspect may list them); using such a tensor is (see model_files).
  static Result<std::shared_ptr<GgufFile>> open(const std::string& path);
  // Parses an in-memory image (used by the fuzz target and tests). `name` is
  // used in errors. The image is not copied: tensor `data` pointers point
  // into it, so it must outlive the returned file.
  static Result<std::shared_ptr<GgufFile>> parse(const uint8_t* data, size_t size, const std::string& name);

  uint32_t version() const { return version_; }
  const std::string& path() const { return path_; }
  size_t alignment() const { return alignment_; }
  size_t data_start() const { return data_start_; }
  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // nullptr when there is no tensor of that name.
  const GgufTensorInfo* find_tensor(std::string_view name) const;

  const GgufValue* find(std::string_view key) const;
  // Convenience lookups; nullopt when absent or of another type.
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  // Elements of a string array (e.g. tokenizer.ggml.tokens); nullptr when absent.
  const GgufArray* get_array(std::string_view key) const;

  // Moves the mapping out (ModelFiles keeps it alive).
  MappedFile& mapping() { return file_; }
  // Empty (data() == nullptr) for a file made by parse().
  const MappedFile& mapping() const { return file_; }

 private:
  MappedFile file_;
  std::string path_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  size_t data_start_ = 0;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;  // name -> index in tensors_

  friend class GgufParser;
};

}  // namespace rill
