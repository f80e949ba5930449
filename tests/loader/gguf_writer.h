#pragma once
// Test utility: writes GGUF images in memory (or to a temp file) so tests can
// build valid files and, through the raw hooks, every kind of corrupt one.
// Independent of the reader on purpose: it encodes the format from the spec.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "loader/gguf.h"

namespace rill::testing {

// Little-endian byte buffer.
struct ByteSink {
  std::vector<uint8_t> bytes;

  template <typename T>
  ByteSink& put(T x) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &x, sizeof(T));
    bytes.insert(bytes.end(), b, b + sizeof(T));
    return *this;
  }
  ByteSink& put_type(GgufType t) { return put(static_cast<uint32_t>(t)); }
  ByteSink& put_str(std::string_view s) {
    put<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  ByteSink& append(const std::vector<uint8_t>& b) {
    bytes.insert(bytes.end(), b.begin(), b.end());
    return *this;
  }
};

class GgufWriter {
 public:
  uint32_t magic = 0x46554747;  // "GGUF"
  uint32_t version = 3;
  size_t alignment = 32;  // padding used; set_alignment() also writes the key

  // Scalars: `T` is the stored C type matching `type`.
  template <typename T>
  GgufWriter& add(std::string_view key, GgufType type, T value) {
    ByteSink v;
    v.put(value);
    return add_raw(key, type, v.bytes);
  }
  GgufWriter& add_u32(std::string_view key, uint32_t x) { return add(key, GgufType::kU32, x); }
  GgufWriter& add_f32(std::string_view key, float x) { return add(key, GgufType::kF32, x); }
  GgufWriter& add_bool(std::string_view key, bool x) { return add(key, GgufType::kBool, uint8_t(x)); }
  GgufWriter& add_string(std::string_view key, std::string_view s) {
    ByteSink v;
    v.put_str(s);
    return add_raw(key, GgufType::kString, v.bytes);
  }
  template <typename T>
  GgufWriter& add_array(std::string_view key, GgufType elem, const std::vector<T>& xs) {
    ByteSink v;
    v.put_type(elem).put<uint64_t>(xs.size());
    for (const T& x : xs) v.put(x);
    return add_raw(key, GgufType::kArray, v.bytes);
  }
  GgufWriter& add_string_array(std::string_view key, const std::vector<std::string>& xs) {
    ByteSink v;
    v.put_type(GgufType::kString).put<uint64_t>(xs.size());
    for (const auto& x : xs) v.put_str(x);
    return add_raw(key, GgufType::kArray, v.bytes);
  }
  // The encoded value (everything after the type id) is given verbatim.
  GgufWriter& add_raw(std::string_view key, GgufType type, const std::vector<uint8_t>& value) {
    kv_.put_str(key).put_type(type).append(value);
    ++n_kv_;
    return *this;
  }
  GgufWriter& set_alignment(uint32_t a) {
    alignment = a;
    return add_u32("general.alignment", a);
  }

  // A tensor whose data follows, at the next aligned offset of the data section.
  GgufWriter& add_tensor(std::string_view name, uint32_t type, const std::vector<int64_t>& ne,
                         const std::vector<uint8_t>& data) {
    while (data_.bytes.size() % alignment) data_.bytes.push_back(0);
    add_tensor_at(name, type, ne, data_.bytes.size());
    data_.append(data);
    return *this;
  }
  // A tensor info only, with an explicit offset (no data written).
  GgufWriter& add_tensor_at(std::string_view name, uint32_t type, const std::vector<int64_t>& ne, uint64_t offset) {
    infos_.put_str(name).put<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (int64_t d : ne) infos_.put(d);
    infos_.put(type).put(offset);
    ++n_tensors_;
    return *this;
  }

  std::vector<uint8_t> build() const {
    ByteSink out;
    out.put(magic).put(version).put<uint64_t>(n_tensors_).put<uint64_t>(n_kv_);
    out.append(kv_.bytes).append(infos_.bytes);
    if (!data_.bytes.empty()) {
      while (out.bytes.size() % alignment) out.bytes.push_back(0);
      out.append(data_.bytes);
    }
    return out.bytes;
  }

 private:
  ByteSink kv_, infos_, data_;
  uint64_t n_kv_ = 0, n_tensors_ = 0;
};

// Writes `bytes` to a fresh file under the temp directory and returns its path.
inline std::string write_temp_file(const std::vector<uint8_t>& bytes, const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("rill_gguf_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string path = (dir / name).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return path;
}

inline Result<std::shared_ptr<GgufFile>> parse_image(const std::vector<uint8_t>& bytes,
                                                     const std::string& name = "x.gguf") {
  return GgufFile::parse(bytes.data(), bytes.size(), name);
}

}  // namespace rill::testing
