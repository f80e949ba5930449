#pragma once
// MXFP4 checkpoints as OpenAI ships gpt-oss on Hugging Face: config.json's
// quantization_config {"quant_method": "mxfp4", "modules_to_not_convert":
// [...]} and, for each experts module M ("model.layers.N.mlp.experts") that
// the list does not exclude, in place of the dense M.<p> (p = gate_up_proj,
// down_proj):
//   M.<p>_blocks  U8 [n_expert, rows, cols / 32, 16]: 32 e2m1 codes per
//                 group, element 2k in the low nibble of byte k, 2k + 1 in
//                 its high nibble
//   M.<p>_scales  U8 [n_expert, rows, cols / 32]: e8m0, the group's 2^(s - 127)
// Rows are the outputs of the expert's x W^T: gate_up_proj [n_expert, 2 F,
// E] (gate in the even rows, up in the odd ones), down_proj [n_expert, E,
// F] (transformers' Mxfp4GptOssExperts; its convert_moe_packed_tensors
// dequantizes W[e, r, 32 g + j] = FP4[code j of group g] x 2^(s - 127)).
//
// At load each pair is re-laid into GGML's MXFP4 blocks (DType::kMXFP4,
// backend/cpu/quants.h: the scale byte, then 16 bytes holding element j in
// the low nibble and j + 16 in the high one): the same codes and the same
// scale byte (ggml doubles the code values and halves the scale, so each
// weight keeps its value), 17 bytes per 32 weights, held by Mxfp4Weights
// and never dequantized. ModelFiles names the result M.<p>: dtype kMXFP4,
// shape [n_expert, rows, cols], rows first (a dense checkpoint's M.<p> is
// stored transposed, [n_expert, cols, rows]). The family binds the rows
// against its config (model/arch/gpt_oss.cpp).
//
// Refused with an Error naming the file, the tensor or the field: another
// quant_method (loader/fp8_checkpoint.h reads FP8; GGUF carries the rest),
// unknown quantization_config fields, `dequantize: true`, a model_type other
// than gpt_oss (transformers converts only GptOssMLP's experts), MXFP4
// tensors on anything but M.gate_up_proj / M.down_proj, blocks or scales of
// the wrong dtype, rank or shape, a missing half of a pair, MXFP4 tensors
// without the config, and a contradiction with modules_to_not_convert
// (experts it excludes stored as MXFP4, or experts it converts stored dense).
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"
#include "loader/safetensors.h"

namespace rill {

// A modules_to_not_convert pattern compiled once by PCRE2 (Python's re
// syntax for what configs hold) and matched anchored at the start, as
// re.match, with bounded work (module_pattern.cpp's limits): a hostile
// pattern gives an error, never a hang or a deep recursion.
class ModulePattern;

struct Mxfp4Scheme {
  bool enabled = false;                                               // quant_method "mxfp4"
  std::vector<std::string> modules_to_not_convert;                    // transformers' patterns
  std::vector<std::shared_ptr<const ModulePattern>> not_convert_res;  // the same, compiled (parse_mxfp4_scheme)
};

// Reads config["quantization_config"] when its quant_method is "mxfp4"
// (otherwise enabled stays false: loader/fp8_checkpoint.h reads or refuses
// it). `config_path` prefixes every error.
Result<Mxfp4Scheme> parse_mxfp4_scheme(const nlohmann::json& config, const std::string& config_path);

// transformers' should_convert_module: false when a pattern of
// modules_to_not_convert matches a prefix of `module` as a regular
// expression (Python's re.match: "model.layers.*.self_attn" matches
// "model.layers.3.self_attn.q_proj"; with no module boundary, so "layer.1"
// also matches "layer.11.attn", as in transformers) or is its suffix.
// `module` is at most kMaxMxfp4ModuleChars long (read_mxfp4_weights refuses
// longer names first). An error names the pattern whose match ran past
// PCRE2's work limits (catastrophic backtracking).
inline constexpr size_t kMaxMxfp4ModuleChars = 1024;
Result<bool> mxfp4_converts(const Mxfp4Scheme& scheme, const std::string& module);

// One re-laid tensor.
struct Mxfp4Tensor {
  std::string name;                   // "M.gate_up_proj": the blocks' name without "_blocks"
  size_t file = 0;                    // index into the checkpoint's files (the blocks' file)
  std::vector<int64_t> shape;         // [n_expert, rows, cols]
  std::unique_ptr<uint8_t[]> blocks;  // [n_expert, rows, cols / 32] GGML block_mxfp4 (17 bytes)
  size_t n_bytes = 0;
};

struct Mxfp4Weights {
  std::vector<Mxfp4Tensor> tensors;
  std::set<std::string, std::less<>> stored;  // the *_blocks / *_scales names: not model tensors
};

// Every MXFP4 pair of `ck` checked against `scheme` and re-laid (on the
// machine's cores). `model_type` is config.json's.
Result<Mxfp4Weights> read_mxfp4_weights(const SafetensorsCheckpoint& ck, const Mxfp4Scheme& scheme,
                                        const std::string& model_type, const std::string& config_path);

// One group of 32 weights from transformers' layout (`codes`: 16 bytes,
// element 2k low / 2k + 1 high; `scale`: e8m0) into a GGML block_mxfp4 at
// `out` (17 bytes).
void mxfp4_group_to_ggml(const uint8_t* codes, uint8_t scale, uint8_t* out);

}  // namespace rill
