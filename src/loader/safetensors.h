#pragma once
// Safetensors files (single and sharded) read over mmap.
//
// Layout: u64 little-endian header length N, N bytes of JSON
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the data section; offsets are relative to its start. Every offset and
// size is checked against the file before any pointer into it is formed.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/result.h"

namespace rill {

// One-byte float element types (safetensors F8_E4M3 / F8_E5M2, as torch's
// float8_e4m3fn / float8_e5m2). They have no DType: FP8 checkpoints
// (loader/fp8_checkpoint.h) turn them into weights with their scales.
enum class Float8 : uint8_t { kNone, kE4M3, kE5M2 };

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;      // F32, F16 or BF16; unused when float8 or u8 is set
  Float8 float8 = Float8::kNone;  // an F8 tensor: one byte per element
  // A U8 tensor: MXFP4 blocks and scales (loader/mxfp4_checkpoint.h) are
  // U8; other integer tensors (I64, I32, I16, I8, BOOL) are index buffers
  // that no graph reads, left out of the parse.
  bool u8 = false;
  std::vector<int64_t> shape;     // outermost first; [] is a scalar
  const uint8_t* data = nullptr;  // into the parsed buffer; null when n_bytes == 0
  size_t n_bytes = 0;
};

// Parses an in-memory safetensors image. Tensors point into `data` and are
// sorted by name. `name` (the file name) prefixes every error message.
// Never throws; any malformed input is an Error.
Result<std::vector<SafetensorsTensor>> parse_safetensors(const uint8_t* data, size_t size, const std::string& name);

struct SafetensorsFile {
  MappedFile mapping;  // owns the bytes the tensors point into
  std::vector<SafetensorsTensor> tensors;
};

// Maps and parses `path`. Errors name the path.
Result<SafetensorsFile> open_safetensors(const std::string& path);

// model.safetensors.index.json: {"weight_map": {tensor: shard file name}}.
struct SafetensorsIndex {
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::vector<std::string> shards;                // distinct shard names, sorted
};

// Parses the index text. Shard names must be plain file names (no '/', not
// "." or ".."): a checkpoint never points outside its directory.
Result<SafetensorsIndex> parse_safetensors_index(const std::string& text, const std::string& name);

// A whole checkpoint: every tensor of every shard, each shard mapped once.
struct SafetensorsCheckpoint {
  std::vector<SafetensorsFile> files;
  std::vector<std::string> file_paths;  // parallel to `files`
  // tensor name -> (index into files, index into files[i].tensors)
  std::map<std::string, std::pair<size_t, size_t>, std::less<>> tensors;
};

// Opens `dir/model.safetensors.index.json` and its shards when the index
// exists, else `dir/model.safetensors`. A tensor listed in the index but absent
// from its shard, a shard that is missing, or a tensor present in two shards is
// an Error naming the files and the tensor.
Result<SafetensorsCheckpoint> open_safetensors_checkpoint(const std::string& dir);

}  // namespace rill
