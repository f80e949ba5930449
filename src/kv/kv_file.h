#pragma once
// KV file format v2: one run of cached prefix KV on disk (the cold tier).
//
//   bytes 0..7    magic "RILLKV2\n"
//   u32           header length (bytes of JSON)
//   u32           data start (first tensor byte; a multiple of 16 KiB)
//   u64           XXH3-64 of the header JSON
//   header JSON   {formatVersion: 2, modelId, configFingerprint, numerics?,
//                  ns, tokenizerHash, createdAt, tokens: [ids],
//                  layers: [{kind, window?, firstToken?, tensors: [{name,
//                  off, bytes, shape, dtype, groupSize?, hash}]}]}
//   tensor data   each tensor at an absolute offset that is a multiple of
//                 16 KiB (so the mapping can be handed to a device as is)
//
// A layer may hold fewer rows than `tokens`: a sliding-window layer keeps
// only what resuming after the last token reads. Such a layer says so with
// "window" (its sliding window in tokens) and "firstToken" (the position of
// its tensors' first row; its K / V have tokens.length - firstToken rows).
// Both are optional members of a layer object (absent: 0, every row), so a
// file without them is the same v2 file as before.
//
// "numerics" (Model::kv_numerics(): the device and arithmetic that computed
// the KV, e.g. "cpu avx512", "cuda sm_90 act=bf16") is optional too: files
// written before it existed read as "", which matches no model, so they are
// refused (and the disk tier removes them at open) rather than resumed by a
// device whose numbers may differ.
//
// A tensor's dtype is F32, F16, BF16 or one of GGML's block types of the
// quantized KV cache (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: shape in elements, rows
// of whole blocks, bytes as GGML lays them out), F8_E4M3 (fp8 KV: a
// byte per element, no scale), or k4c's Q4_CHAN (a block's K per channel,
// groupSize 32) and IQ4_NL64 (groupSize 64), q8_0h64's Q8_0_64 (groupSize
// 64), backend/cpu/kv_quant.h's
// layouts; a block type's tensor says
// its block ("groupSize": 32), and a file whose groupSize differs from its
// dtype's is refused. A rotated type (q4_0h, q8_0h) is stored as its dtype;
// "numerics" names the KV types and rotated ones' encoder ("kv=q4_0h#2"), so
// a file is never resumed under other types or another encoder revision.
//
// All integers little-endian. ns, tokenizerHash and every tensor hash are
// 16 hex digits (XXH3-64; JSON numbers would lose bits in many readers).
// Writes are atomic: `<path>.tmp`, fsync, rename, fsync of the directory.
// Reading always verifies the magic, the bounds and the header hash; tensor
// hashes on request (verify_tensors reads every byte). The disk tier asks
// for them on every load (a restore reads every byte anyway) and, with
// --kv-verify, for every file at open. A file whose identity (model, config
// fingerprint, numerics, namespace, tokenizer) differs from the expected one
// is refused with an error naming the file and the field.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/result.h"
#include "model/kv_spec.h"

namespace rill {

inline constexpr uint32_t kKvFileFormatVersion = 2;
inline constexpr uint64_t kKvFileAlignment = 16 * 1024;

// What a file must match to be used.
struct KvFileIdentity {
  std::string model_id;            // the model's artifact fingerprint
  std::string config_fingerprint;  // model/fingerprint.h
  uint64_t ns = 0;                 // prefix-tree namespace of the run
  uint64_t tokenizer_hash = 0;
  std::string numerics;  // Model::kv_numerics() of the model that computed the KV

  bool operator==(const KvFileIdentity&) const = default;
};

struct KvTensorDesc {
  std::string name;             // "k", "v", or a state tensor's name
  uint64_t off = 0, bytes = 0;  // absolute file offset, size
  std::vector<int64_t> shape;   // e.g. [tokens, kv_width]
  DType dtype = DType::kF16;
  uint64_t hash = 0;  // XXH3-64 of the bytes
};

struct KvLayerDesc {
  LayerKind kind = LayerKind::kFull;
  int32_t window = 0;       // "window": sliding layers, tokens
  int64_t first_token = 0;  // "firstToken": position of the first row held
  std::vector<KvTensorDesc> tensors;
};

struct KvFileHeader {
  KvFileIdentity identity;
  int64_t created_at = 0;  // unix seconds
  std::vector<int32_t> tokens;
  std::vector<KvLayerDesc> layers;
};

// A tensor to write: its bytes (any alignment) and description.
struct KvTensorData {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kF16;
  std::span<const uint8_t> bytes;
};
struct KvLayerData {
  LayerKind kind = LayerKind::kFull;
  std::vector<KvTensorData> tensors;
  int32_t window = 0;       // written when > 0
  int64_t first_token = 0;  // written when > 0
};

// Writes the file atomically (see above). Errors name the path.
Status write_kv_file(const std::string& path, const KvFileIdentity& identity, std::span<const int32_t> tokens,
                     std::span<const KvLayerData> layers);

// Parses and validates a header from the first bytes of a file of
// `file_size` bytes (`prefix` may be the whole file). Checks the magic,
// lengths, the header hash, the JSON schema, and that every tensor lies
// inside the file at an aligned offset with bytes == its shape's size.
// `name` is used in error messages.
Result<KvFileHeader> parse_kv_header(std::span<const uint8_t> prefix, uint64_t file_size, const std::string& name);

// An open, validated file with its tensors mapped in place.
class KvFile {
 public:
  // Maps and validates `path`; with `expect`, refuses a different identity;
  // with verify_tensors, also checks every tensor's hash.
  static Result<KvFile> open(const std::string& path, const KvFileIdentity* expect, bool verify_tensors);

  const KvFileHeader& header() const { return header_; }
  const std::string& path() const { return map_.path(); }
  // Requires layer < header().layers.size(), t < that layer's tensors.
  std::span<const uint8_t> tensor(size_t layer, size_t t) const;

 private:
  MappedFile map_;
  KvFileHeader header_;
};

// Reads only the header of `path` (for directory scans): validated as in
// parse_kv_header, tensors not touched.
Result<KvFileHeader> read_kv_header(const std::string& path);

// "" when `got` matches `want`, else the first differing field's name.
std::string kv_identity_mismatch(const KvFileIdentity& want, const KvFileIdentity& got);

}  // namespace rill
