#pragma once
// ModelFiles: a model's weights and metadata as found on disk, before any
// model implementation is chosen. Tensors stay in the mmapped files.
//
// Tensor names are canonical Hugging Face names ("model.layers.3.self_attn.q_proj.weight")
// whatever the format; GGUF names are mapped in gguf_names.cpp, the one place
// that knows both. Shapes are outermost-first as in PyTorch: a Linear weight is
// [out_features, in_features] and its rows are contiguous.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/result.h"
#include "loader/fp8_checkpoint.h"
#include "loader/model_config.h"
#include "loader/mxfp4_checkpoint.h"

namespace rill {

class GgufFile;

struct TensorRef {
  std::string name;  // canonical name
  std::string file;  // the file that holds it (for error messages)
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // outermost first
  const uint8_t* data = nullptr;
  size_t n_bytes = 0;
  // A weight of an FP8 checkpoint (loader/fp8_checkpoint.h): `data` is its
  // F32 dequantization; e4m3 / e4m3_scales the values as stored when each
  // row has one scale (W[r, c] = e4m3[r * cols + c] x e4m3_scales[r]), else null.
  bool fp8 = false;
  const uint8_t* e4m3 = nullptr;
  const float* e4m3_scales = nullptr;
  // A tensor of an MXFP4 checkpoint (loader/mxfp4_checkpoint.h): dtype
  // kMXFP4, `data` its blocks re-laid for GGML, shape [n_expert, rows, cols]
  // rows first; `file` holds its "<name>_blocks" and "<name>_scales".

  int64_t n_elements() const;
  std::string shape_string() const;  // "[576, 49152]"
};

enum class ModelFormat { kGguf, kHuggingFace };

struct ModelFiles {
  ModelFormat format = ModelFormat::kGguf;
  std::string path;  // the .gguf file or the model directory
  ModelConfig config;

  // Tokenizer and chat template sources. For GGUF: `gguf` is set and the
  // tokenizer reads its metadata. For HF: tokenizer.json / tokenizer_config.json
  // paths when present (empty otherwise).
  std::shared_ptr<const GgufFile> gguf;
  std::string tokenizer_json_path;
  std::string tokenizer_config_path;
  std::string chat_template;  // empty if none

  std::vector<MappedFile> mappings;  // keep the tensor data alive
  Fp8Weights fp8;                    // an FP8 checkpoint's dequantized weights (TensorRef::fp8 point here)
  Mxfp4Weights mxfp4;                // an MXFP4 checkpoint's re-laid blocks (its kMXFP4 TensorRefs point here)
  std::map<std::string, TensorRef, std::less<>> tensors;

  // nullptr when absent.
  const TensorRef* find(std::string_view name) const;
  // Error naming the file and the tensor when absent or when its shape differs.
  Result<const TensorRef*> require(std::string_view name, const std::vector<int64_t>& shape) const;
};

// Opens a .gguf file or a Hugging Face model directory (config.json +
// model.safetensors or sharded *.safetensors with model.safetensors.index.json).
// Every failure (missing file, corrupt header, offsets past the end, bad
// config) is an Error naming the file and the item.
Result<std::shared_ptr<ModelFiles>> open_model_files(const std::string& path);

}  // namespace rill
