#pragma once
// KV storage types (issue 22): what one cache side (K or V) of one KV layer
// is stored in. The plain kinds are f32 / f16 / bf16; the quantized ones are
// GGML's classic blocks of 32 (q8_0, q4_0, q4_1, q5_0, q5_1, byte-for-byte
// as backend/cpu/quants.h lays them out), quantized where K/V are stored
// (Backend::rope_store_kv) and read block by block by attention. q4_0h /
// q8_0h: q4_0 / q8_0 over a Walsh-Hadamard rotated head (rill's own encoder,
// cpu::quantize_rotated_row): each head times the orthonormal H/sqrt(d)
// before it is quantized spreads K's outlier channels (what limits plain
// q8_0, docs/perf.md) over the head. For K the query is rotated the same
// way (q.k is unchanged, H being orthonormal); for V attention's output is
// rotated back (H is its own inverse). iq4_nlh: the same rotation and
// encoder over GGML's IQ4_NL blocks (f16 d, 32 nibbles; x = d *
// kIq4nlValues[q], 16 non-uniform levels spaced for near-Gaussian values),
// the same 18 bytes per 32 values as q4_0h and less error on a rotated head
// (docs/perf.md, "the rotated 4-bit type's levels"); on the CPU and CUDA
// (backend/cuda/kv_types.cuh KvIq4Nl: the CPU encoder's bytes, so tiers and
// KV files move between the devices). fp8: each element one e4m3 byte
// with no scale (core/e4m3.h kF8E4M3; vLLM's fp8 KV without calibrated
// scales; backend/cuda/kv_types.cuh KvFp8 says why), rounded to nearest
// even and saturating at +-448, the same bytes on both devices.
//
// q8_0h64: q8_0h's rotated heads and encoder in blocks of 64 values with
// one f16 scale (core/e4m3.h kKvQ8_0x64: 66 bytes, 8.25 bits a value,
// 1.939x f16's tokens per GiB where q8_0 / q8_0h's 34 bytes per 32 reach
// 1.882x; issue 22 asks 1.9x of an 8-bit type). Named as iq4_nlh64 is: the
// block's base type, h for the rotation, the block size. head_dim must be
// a multiple of 64 (a block never spans two heads) and, as for every
// rotated type, a power of two: so 64 to 1024 (CUDA: to 512,
// backend/cuda/kv_types.cuh KvQ8_0x64, the CPU encoder's bytes, so tiers
// and KV files move between the devices).
//
// iq4_nlh64 alone (both sides, no tail) also has CUDA kernels
// (backend/cuda/kv_types.cuh KvIq4Nl64, the CPU encoder's bytes).
//
// k4c (k=q4c v=iq4_nlh64; docs/perf.md "k4c"): K quantized
// per channel over each KV block of 32 tokens (KIVI's asymmetric z + d q:
// K's outlier channels sit far from zero, so a zero point per channel
// beats any per-token grid), 4.75 bits per value; V per token, each head
// rotated, IQ4_NL levels in blocks of 64 with one e4m3 scale (4.125 bits).
// A block's K can only be encoded once its 32 tokens exist, so the group
// being filled lives in a per-sequence KV tail (model/kv_tails.h), its
// keys and values in q8_0 (cpu::kKvChanTailType), and a query reads its own
// group's keys and values from there: earlier groups from the pool (K per
// channel, V iq4_nlh64), its own group's at 8 bits, by position alone, so
// results do not depend on chunking or batching. Pools holding q4c have
// blocks of 32. Bytes per token at context C on the default model: 6,390 in
// blocks + 393,600 / C of tail (3.500x f16's at 2k, 3.552x at 4k).
//
// k4a (k=q4a v=iq4_nlh64; CUDA as k4c): k4c with each K channel at its
// own width, 0..8 bits summing to 4 per channel in a layer
// (backend/cpu/kv_alloc.h: the same bytes as q4c), the widths calibrated
// at load (CpuPagedModel::calibrate_kv, on calibration_tokens below).
//
// Types are chosen per side and per KV layer: --kv-type / --kv-type-k /
// --kv-type-v for every layer, and a --kv-config file for single layers:
//
//   # KV layer  types (k and v, or k=T v=T)
//   0           q8_0
//   -1          q8_0          # negative: from the end (-1 the last layer)
//   4-7         k=q8_0 v=q4_0h
//
// Layers count the model's KV layers (Model::kv_layers()), so a hybrid
// model's first attention layer is 0. Later lines override earlier ones;
// the file overrides the flags.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/result.h"

namespace rill {

struct KvType {
  DType dtype = DType::kF16;
  bool rotated = false;  // Walsh-Hadamard rotated per head (q4_0h, q8_0h, iq4_nlh)

  bool operator==(const KvType&) const = default;
  bool quantized() const { return dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16; }
  // Elements per block (1 for plain floats); a head must hold whole blocks.
  int group_size() const;
};

// One KV layer's types.
struct KvLayerTypes {
  KvType k, v;
  bool operator==(const KvLayerTypes&) const = default;
};

// "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_0h", "q8_0h",
// "iq4_nlh", "fp8", "q4c" (K only), "iq4_nlh64", "q8_0h64", "q4a" (K only).
std::string kv_type_name(KvType t);
std::optional<KvType> parse_kv_type(std::string_view name);
// A name for both sides of a layer: a type (the same on both) or a pair's
// name ("k4c": k=q4c v=iq4_nlh64; "k4a": k=q4a v=iq4_nlh64).
std::optional<KvLayerTypes> parse_kv_pair(std::string_view name);
// The accepted names, for error messages: "f16, bf16, ...".
std::string kv_type_names();

// The KV type options of a model (ModelOptions::kv_types).
struct KvTypeOptions {
  std::optional<KvType> k, v;  // every layer (--kv-type-k / --kv-type-v / --kv-type)
  struct Entry {
    int64_t first = 0, last = 0;  // layers [first, last]; negative: from the end
    std::optional<KvType> k, v;
    std::string where;  // "file:line" for errors
  };
  std::vector<Entry> layers;  // --kv-config, in file order
  std::string config_path;
  // q4a (k4a): the tokens of the text its widths are calibrated on
  // (engine/kv_calibration.h fills them; a model with a q4a layer refuses
  // to load without).
  std::vector<int32_t> calibration_tokens;
  std::string calibration_path;  // --kv-calibration FILE; empty: the built-in text

  // Whether any layer's side may be stored in t (the flags or the file).
  bool mentions(DType t) const;
  bool empty() const { return !k && !v && layers.empty(); }
  // Per-layer types for a model of n_layer KV layers whose own KV dtype is
  // `base` (f16, f32 for f32 checkpoints). Errors name the config file and
  // line of a layer outside the model.
  Result<std::vector<KvLayerTypes>> resolve(int64_t n_layer, DType base) const;
};

// How RoPE pairs one KV layer's K channels (cpu::rope_partner's pairs,
// rot_dim and rotated_pairs), for q4a's width allocation
// (cpu::allocate_channel_bits), which gives a pair's channels alike.
struct KvRopePairs {
  bool interleaved = false;
  int64_t rot_dim = 0;         // 0: the whole head
  int64_t rotated_pairs = -1;  // -1: every pair of rot_dim
};

// Reads a --kv-config file into opts.layers (errors name the file and line).
Status load_kv_config(const std::string& path, KvTypeOptions& opts);
// The same for a file's text; path only names it in errors.
Status parse_kv_config(const std::string& text, const std::string& path, KvTypeOptions& opts);

// Checks that rows of n_head_kv heads of head_dim elements can be stored in
// each type of `types`: a row of whole blocks (a head of whole blocks reads
// fastest; smaller heads share blocks, and attention then dequantizes whole
// rows), a power-of-two head_dim for rotated types. Errors name the layer,
// side and type.
Status check_kv_types(const std::vector<KvLayerTypes>& types, int64_t n_head_kv, int64_t head_dim);
// The same for KV layer `layer` alone (layers of their own shape: Gemma 4's
// full layers are wider than its sliding ones).
Status check_kv_layer_types(int64_t layer, const KvLayerTypes& types, int64_t n_head_kv, int64_t head_dim);

// A short description of non-default types for Model::kv_numerics() and
// /stats: "" when every layer is `base` on both sides, else e.g.
// "kv=q8_0" (all alike) or "kv=k:q8_0/v:q4_0h#2,q8_0,..." (#: encoder).
std::string describe_kv_types(const std::vector<KvLayerTypes>& types, DType base);

}  // namespace rill
