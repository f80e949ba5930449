#pragma once
// FP8 checkpoints as Hugging Face writes them: config.json's
// quantization_config and the e4m3 weights with their scales.
//
// Two layouts are read (anything else in a quantization_config is an Error
// naming config.json and the field, never ignored):
//  - transformers' "fp8" (FineGrainedFP8Config): `<m>.weight` F8_E4M3
//    [rows, cols] and `<m>.weight_scale_inv` f32 [ceil(rows / br),
//    ceil(cols / bc)] for weight_block_size [br, bc] (default [128, 128]);
//    W[r, c] = q[r, c] x scale_inv[r / br, c / bc].
//  - compressed-tensors "float-quantized": `<m>.weight` F8_E4M3 and
//    `<m>.weight_scale` by the weights' strategy: "tensor" (one value),
//    "channel" ([rows, 1]) or "block" ([ceil(rows / br), ceil(cols / bc)]
//    for block_structure [br, bc]); W = q x scale likewise.
// Activations: only dynamic schemes (scales computed per token at run time)
// are accepted; static ones need input scales rill does not apply.
// Which weights are FP8 is read from the tensors' dtypes, so the configs'
// ignore lists (modules_to_not_convert, ignore: lm_head usually) need no
// matching: those weights are stored unquantized.
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"
#include "loader/safetensors.h"

namespace rill {

struct Fp8Scheme {
  enum class Layout { kNone, kFp8, kCompressedTensors };
  enum class Strategy { kTensor, kChannel, kBlock };
  Layout layout = Layout::kNone;
  Strategy strategy = Strategy::kBlock;
  int64_t block_rows = 0, block_cols = 0;  // kBlock only
  std::string scale_suffix;                // appended to "<m>.weight": "_scale_inv" or "_scale"
};

// Reads config["quantization_config"] (absent: Layout::kNone). `config_path`
// prefixes every error.
Result<Fp8Scheme> parse_fp8_scheme(const nlohmann::json& config, const std::string& config_path);

// One FP8 weight, dequantized: values[r * cols + c] = q[r, c] x scale as
// an f32 product (exact for BF16/F16 scales; numpy's and torch's f32
// dequantization give the same bits). F32 rather than BF16 so the CPU
// runs exactly the checkpoint's weights, at 4 bytes per weight. When every row has one scale
// (strategy tensor or channel, or blocks at least as wide as the rows) and
// the values are e4m3, `e4m3` points at the stored values in the mapped
// file and `row_scales` holds the scale of each row: backends that keep
// FP8 weights take them as they are.
struct Fp8Weight {
  std::string name;  // "<m>.weight"
  int64_t rows = 0, cols = 0;
  std::vector<float> values;  // [rows, cols]
  const uint8_t* e4m3 = nullptr;
  std::vector<float> row_scales;  // [rows] when e4m3 is set
};

struct Fp8Weights {
  std::vector<Fp8Weight> weights;
  std::set<std::string, std::less<>> scale_tensors;  // consumed: not model tensors
};

// Every F8 tensor of `ck` checked against `scheme` and dequantized. An F8
// tensor without a quantization_config, a missing scale, a scale of the
// wrong shape or dtype, a scale without its FP8 weight, or an input scale
// is an Error naming the file and the tensor.
Result<Fp8Weights> read_fp8_weights(const SafetensorsCheckpoint& ck, const Fp8Scheme& scheme,
                                    const std::string& config_path);

// The value of an e4m3 (fn: no infinities, 0x7f/0xff NaN) / e5m2 byte.
float e4m3_to_f32(uint8_t b);
float e5m2_to_f32(uint8_t b);

}  // namespace rill
