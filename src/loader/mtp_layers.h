#pragma once
// MtpLayers: the multi-token-prediction (MTP) layers a checkpoint carries
// after its decoder layers, which a speculator runs to draft (`--spec mtp`).
// Two namings:
//   kNextn    DeepSeek-V3, GLM-4.5+ and GLM-5 (config num_nextn_predict_layers):
//             layer n_layer + i, "model.layers.{n_layer + i}." + embed_tokens,
//             enorm, hnorm, eh_proj, a whole decoder layer and
//             shared_head.{norm,head}. llama.cpp's GGUF names them
//             blk.N.nextn.* for every family, Qwen3.5 included
//             (loader/gguf_names.cpp maps them to these names; GGUF key
//             <arch>.nextn_predict_layers).
//   kQwenMtp  Qwen3-Next / Qwen3.5 (config mtp_num_hidden_layers): mtp.fc
//             (eh_proj), mtp.pre_fc_norm_embedding (enorm),
//             mtp.pre_fc_norm_hidden (hnorm), mtp.norm (shared_head.norm),
//             "mtp.layers.{i}." the decoder layer; the model's embedding and
//             head are shared.
// The head's arithmetic (one MTP layer, k = 1): h'_i = eh_proj([enorm(emb(
// t_{i+1})); hnorm(h_i)]) with h_i the model's final-normed hidden state,
// then the decoder layer over h'_0..h'_i, then shared_head norm and head
// (tools/make_mtp_golden.py, the numpy reference).
#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"
#include "loader/model_files.h"

namespace rill {

struct MtpLayers {
  enum class Naming { kNextn, kQwenMtp };
  Naming naming = Naming::kNextn;
  // Per MTP layer, the prefix of its decoder tensors: "model.layers.61."
  // (kNextn; its MTP tensors share it) or "mtp.layers.0." (kQwenMtp).
  std::vector<std::string> prefixes;
  int32_t n_layers() const { return static_cast<int32_t>(prefixes.size()); }
};

// The MTP layers the config of `files` declares; none when it declares
// none. A declared layer whose tensors the files do not hold (a conversion
// that dropped them, as the transformers-saved goldens do) is an error
// naming the files, the config key and the first missing tensor.
Result<MtpLayers> find_mtp_layers(const ModelFiles& files);

}  // namespace rill
