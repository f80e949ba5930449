#include "loader/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace rill {
namespace {

// The reference implementation refuses headers over 100 MB; so do we, which
// also bounds the JSON parser's work on hostile input.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr size_t kMaxRank = 8;

Error err(const std::string& name, const std::string& what) {
  return Error{name + ": " + what};
}

// Supported dtypes; others get an error naming the dtype and the tensor.
bool parse_dtype(const std::string& s, DType* out) {
  if (s == "F32") {
    *out = DType::kF32;
    return true;
  }
  if (s == "F16") {
    *out = DType::kF16;
    return true;
  }
  if (s == "BF16") {
    *out = DType::kBF16;
    return true;
  }
  return false;
}

// Reads a non-negative JSON integer; false when it is not one.
bool read_u64(const nlohmann::json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = static_cast<uint64_t>(v);
    return true;
  }
  return false;
}

// Integer tensors other than U8 are index buffers that transformers saves
// beside the weights (BERT's embeddings.position_ids: 0, 1, 2, ...); no graph
// reads them, so they are left out rather than refused. U8 tensors are kept:
// MXFP4 checkpoints store their blocks and scales as U8.
bool is_index_buffer(const nlohmann::json& info) {
  if (!info.is_object()) return false;
  auto dt = info.find("dtype");
  if (dt == info.end() || !dt->is_string()) return false;
  const std::string d = dt->get<std::string>();
  return d == "I64" || d == "I32" || d == "I16" || d == "I8" || d == "BOOL";
}

Result<SafetensorsTensor> parse_entry(const std::string& tensor, const nlohmann::json& info,
                                      const uint8_t* data_section, uint64_t data_size, const std::string& name,
                                      uint64_t* begin_out) {
  auto bad = [&](const std::string& what) { return err(name, "tensor '" + tensor + "' " + what); };
  if (!info.is_object()) return bad("entry is not an object");
  auto dt = info.find("dtype");
  if (dt == info.end() || !dt->is_string()) return bad("has no string 'dtype'");
  SafetensorsTensor t;
  t.name = tensor;
  const std::string dtype = dt->get<std::string>();
  if (dtype == "F8_E4M3") {
    t.float8 = Float8::kE4M3;
  } else if (dtype == "F8_E5M2") {
    t.float8 = Float8::kE5M2;
  } else if (dtype == "U8") {
    t.u8 = true;
  } else if (!parse_dtype(dtype, &t.dtype)) {
    return bad("has unsupported dtype '" + dtype + "' (supported: F32, F16, BF16, F8_E4M3, F8_E5M2, U8)");
  }

  auto sh = info.find("shape");
  if (sh == info.end() || !sh->is_array()) return bad("has no array 'shape'");
  if (sh->size() > kMaxRank) return bad("has rank " + std::to_string(sh->size()) + " (max 8)");
  // Element count with overflow checks: the product must fit in int64 and,
  // times the element size, in uint64.
  uint64_t n_elements = 1;
  for (const auto& d : *sh) {
    uint64_t v = 0;
    if (!read_u64(d, &v) || v > uint64_t(std::numeric_limits<int64_t>::max()))
      return bad("has a shape entry that is not a non-negative integer");
    t.shape.push_back(static_cast<int64_t>(v));
    if (v != 0 && n_elements > uint64_t(std::numeric_limits<int64_t>::max()) / v)
      return bad("has a shape whose element count overflows");
    n_elements *= v;
  }
  const uint64_t elem_bytes =
      t.float8 != Float8::kNone || t.u8 ? 1 : static_cast<uint64_t>(dtype_info(t.dtype).block_bytes);
  if (n_elements > std::numeric_limits<uint64_t>::max() / elem_bytes)
    return bad("has a shape whose byte size overflows");
  const uint64_t expected_bytes = n_elements * elem_bytes;

  auto off = info.find("data_offsets");
  if (off == info.end() || !off->is_array() || off->size() != 2) return bad("has no [begin, end] 'data_offsets'");
  uint64_t begin = 0, end = 0;
  if (!read_u64((*off)[0], &begin) || !read_u64((*off)[1], &end))
    return bad("has data_offsets that are not non-negative integers");
  if (end < begin) return bad("has data_offsets end < begin");
  if (end > data_size)
    return bad("has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
               "] past the end of the data section (" + std::to_string(data_size) + " bytes)");
  if (end - begin != expected_bytes)
    return bad("has " + std::to_string(end - begin) + " bytes but its shape and dtype need " +
               std::to_string(expected_bytes));
  t.n_bytes = static_cast<size_t>(expected_bytes);
  t.data = expected_bytes ? data_section + begin : nullptr;
  *begin_out = begin;
  return t;
}

}  // namespace

Result<std::vector<SafetensorsTensor>> parse_safetensors(const uint8_t* data, size_t size, const std::string& name) {
  if (size < 8) return err(name, "file too short for a safetensors header (" + std::to_string(size) + " bytes)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];  // little-endian
  if (header_len > kMaxHeaderBytes)
    return err(name, "header length " + std::to_string(header_len) + " exceeds the 100 MB limit");
  if (header_len > size - 8)
    return err(name, "header length " + std::to_string(header_len) + " runs past the end of the file (" +
                         std::to_string(size) + " bytes)");
  const char* header = reinterpret_cast<const char*>(data + 8);
  const uint8_t* data_section = data + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;

  nlohmann::json j = nlohmann::json::parse(header, header + header_len, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return err(name, "header is not valid JSON");
  if (!j.is_object()) return err(name, "header is not a JSON object");

  std::vector<SafetensorsTensor> tensors;
  std::vector<std::pair<uint64_t, size_t>> spans;  // (begin, index) for the overlap check
  try {
    tensors.reserve(j.size());
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "__metadata__") continue;
      if (is_index_buffer(it.value())) continue;
      uint64_t begin = 0;
      auto t = parse_entry(it.key(), it.value(), data_section, data_size, name, &begin);
      if (!t.ok()) return t.error();
      spans.emplace_back(begin, tensors.size());
      tensors.push_back(std::move(t).value());
    }
  } catch (const std::exception& e) {  // defensive: accessors above check types first
    return err(name, std::string("malformed header: ") + e.what());
  }

  // Tensors must not overlap: a writer bug or a crafted file could alias two
  // weights. Empty tensors occupy nothing.
  std::sort(spans.begin(), spans.end());
  uint64_t prev_end = 0;
  const SafetensorsTensor* prev = nullptr;
  for (const auto& [begin, idx] : spans) {
    const SafetensorsTensor& t = tensors[idx];
    if (t.n_bytes == 0) continue;
    if (prev && begin < prev_end)
      return err(name, "tensors '" + prev->name + "' and '" + t.name + "' overlap in the data section");
    prev_end = begin + t.n_bytes;
    prev = &t;
  }
  // nlohmann's object is a std::map, so iteration already gave sorted names.
  return tensors;
}

Result<SafetensorsFile> open_safetensors(const std::string& path) {
  auto mapped = MappedFile::open(path);
  if (!mapped.ok()) return mapped.error();
  SafetensorsFile file;
  file.mapping = std::move(mapped).value();
  auto tensors = parse_safetensors(file.mapping.data(), file.mapping.size(), path);
  if (!tensors.ok()) return tensors.error();
  file.tensors = std::move(tensors).value();
  return file;
}

Result<SafetensorsIndex> parse_safetensors_index(const std::string& text, const std::string& name) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return err(name, "not valid JSON");
  if (!j.is_object()) return err(name, "not a JSON object");
  auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object()) return err(name, "field 'weight_map' missing or not an object");
  SafetensorsIndex index;
  std::set<std::string> shards;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string()) return err(name, "weight_map entry for tensor '" + it.key() + "' is not a string");
    std::string shard = it.value().get<std::string>();
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
        shard.find('\\') != std::string::npos || shard.find('\0') != std::string::npos)
      return err(name, "tensor '" + it.key() + "' maps to invalid shard name '" + shard + "'");
    index.weight_map.emplace(it.key(), shard);
    shards.insert(shard);
  }
  if (index.weight_map.empty()) return err(name, "weight_map is empty");
  index.shards.assign(shards.begin(), shards.end());
  return index;
}

namespace {

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error{path + ": cannot open"};
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Error{path + ": read error"};
  return ss.str();
}

// Adds every tensor of files.back() to the name table; a name seen in an
// earlier file is an error naming both files.
Status add_tensors(SafetensorsCheckpoint& ck) {
  const size_t fi = ck.files.size() - 1;
  const auto& tensors = ck.files[fi].tensors;
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    auto [it, inserted] = ck.tensors.emplace(tensors[ti].name, std::make_pair(fi, ti));
    if (!inserted)
      return Error{ck.file_paths[fi] + ": tensor '" + tensors[ti].name + "' is also in " +
                   ck.file_paths[it->second.first]};
  }
  return Status::Ok();
}

}  // namespace

Result<SafetensorsCheckpoint> open_safetensors_checkpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  SafetensorsCheckpoint ck;
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  std::error_code ec;
  if (!fs::exists(index_path, ec)) {
    const std::string single = (fs::path(dir) / "model.safetensors").string();
    if (!fs::exists(single, ec)) return Error{dir + ": no model.safetensors or model.safetensors.index.json"};
    auto file = open_safetensors(single);
    if (!file.ok()) return file.error();
    ck.files.push_back(std::move(file).value());
    ck.file_paths.push_back(single);
    RILL_TRY(add_tensors(ck));
    return ck;
  }

  auto text = read_text_file(index_path);
  if (!text.ok()) return text.error();
  auto index = parse_safetensors_index(text.value(), index_path);
  if (!index.ok()) return index.error();
  std::map<std::string, size_t> shard_file;  // shard name -> index into ck.files
  for (const std::string& shard : index->shards) {
    const std::string path = (fs::path(dir) / shard).string();
    if (!fs::exists(path, ec)) return Error{index_path + ": shard '" + shard + "' does not exist in " + dir};
    auto file = open_safetensors(path);
    if (!file.ok()) return file.error();
    shard_file[shard] = ck.files.size();
    ck.files.push_back(std::move(file).value());
    ck.file_paths.push_back(path);
    RILL_TRY(add_tensors(ck));
  }
  for (const auto& [tensor, shard] : index->weight_map) {
    auto it = ck.tensors.find(tensor);
    const size_t want = shard_file.at(shard);
    if (it == ck.tensors.end() || it->second.first != want)
      return Error{index_path + ": tensor '" + tensor + "' is missing from its shard " + ck.file_paths[want]};
  }
  return ck;
}

}  // namespace rill
