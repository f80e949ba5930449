#pragma once
// MiniCPM's muP scales, shared by the dense MiniCPM 1/2/4 (`minicpm`, on the
// Llama graph: model/arch/llama.cpp) and MiniCPM3 (`minicpm3`, on the MLA
// graph: model/arch/deepseek.cpp). transformers' MiniCPM modeling:
//   h      = embed(ids) * scale_emb
//   h      = h + sublayer(norm(h)) * scale_depth / sqrt(num_hidden_layers)
//   logits = lm_head(norm(h) / (hidden_size / dim_model_base))
// llama.cpp's GGUF keys hold the same three numbers as
// `<arch>.embedding_scale`, `.residual_scale` and `.logit_scale` (the
// divisor hidden_size / dim_model_base); loader/gguf_names.cpp writes them
// back under the config.json names, so each family reads them here.
#include <string>

#include "backend/backend.h"
#include "core/result.h"
#include "loader/model_config.h"

namespace rill {

struct MupScales {
  float embed = 1.0f;     // scale_emb: times the embedding rows
  float residual = 1.0f;  // scale_depth / sqrt(n_layer): times each sublayer's output
  float logit = 1.0f;     // dim_model_base / hidden_size: times the final normed rows (a factor, not a divisor)

  bool any() const { return embed != 1.0f || residual != 1.0f || logit != 1.0f; }
};

// Reads scale_emb, scale_depth and dim_model_base from cfg.raw. required:
// each must be present (MiniCPM's own config defaults are not transformers'
// to rely on); otherwise an absent field leaves its scale at 1 (MiniCPM3's
// rule: dim_model_base defaults to hidden_size). Each must be a finite
// positive number; errors name `file` and the field.
Result<MupScales> read_mup_scales(const ModelConfig& cfg, const std::string& file, bool required);

// How a scaled F32 intermediate feeds a matmul whose input is in the
// Backend's act dtype: x (F32, dense) times s unless s is 1, then converted
// into out when out is another tensor (its rows and cols x's). Scaling a
// linear sublayer's input instead of its output (o_proj, down_proj, the LM
// head) moves the product by rounding only.
void scale_into(Backend& b, Tensor x, float s, Tensor out);

}  // namespace rill
