#pragma once
// Gemma 4's assistant (gemma4_assistant, transformers'
// Gemma4AssistantForCausalLM): a small Gemma 4 text model that drafts for a
// Gemma 4 target as a multi-token-prediction head (ModelOptions::
// gemma4_assistant; model/arch/gemma.cpp runs it, engine/
// assistant_speculator.h drives it). Google ships it beside the targets
// (google/gemma-4-E2B-it-assistant, ...-26B-A4B-it-assistant). Given the
// target's final-normed hidden state h at its last computed position p and
// the token t after it, one draft step is
//   x      = pre_projection([embed_target(t) * sqrt(E_target); h])   [E]
//   o      = its decoder layers over x: Gemma 4 layers without KV of their
//            own, each reading the target's KV of the last layer of its
//            kind that stores KV (transformers' shared_kv_states); the
//            query sits at position p + 1 and sees the target's keys
//            [0, p] (full layers) or [p - window, p] (sliding layers:
//            window + 1 keys, as transformers' bidirectional window mask
//            flipped to the past gives them)
//   logits = the tied lm_head over final_norm(o); with ordered embeddings
//            only the tokens of the top centroid_intermediate_top_k of
//            num_centroids centroids get a logit, the rest the row's
//            smallest minus 1 (Backend::ordered_logits)
//   h'     = post_projection(final_norm(o))                          [E_target]
// and the next step feeds (argmax, h') at the same position p + 1.
//
// This file reads and checks the checkpoint (config.json + safetensors)
// against the target; the graph is gemma.cpp's.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"
#include "loader/model_files.h"
#include "model/arch/gemma_config.h"

namespace rill {

struct Gemma4AssistantWeights {
  std::shared_ptr<ModelFiles> files;  // keeps the mapping alive
  GemmaParams params;                 // its text model's layers, read as an unshared Gemma 4's
  std::vector<GemmaLayerDims> layer_dims;
  std::vector<GemmaLayerWeights> layers;  // q, o, norms and MLP (no KV projections)
  std::vector<int64_t> target_layer;      // [n_layer]: the target layer whose KV it reads
  int64_t n_embd = 0, backbone_embd = 0, n_vocab = 0;
  int32_t n_head = 0;
  int32_t window = 0;  // its sliding layers' keys: sliding_window + 1
  float eps = 1e-6f;
  WeightView pre_projection;      // [E, 2 E_target]
  WeightView post_projection;     // [E_target, E]
  WeightView lm_head;             // [V, E]: model.embed_tokens when tied
  std::vector<float> final_norm;  // [E]
  // use_ordered_embeddings: centroids [C, E], token_ordering [V] (token ids
  // grouped by centroid: centroid c owns token_ordering[c V/C, (c+1) V/C)).
  bool ordered = false;
  int64_t n_centroids = 0, centroid_top_k = 0;
  WeightView centroids;
  std::vector<int32_t> token_ordering;
  GemmaRope rope;
};

// Opens the assistant at `path` and checks it against the target (its
// files and Gemma parameters). Errors name the file and the field, or both
// models where they do not fit (another hidden size or vocabulary, a
// target that is not Gemma 4, a layer kind the target lacks or whose heads
// differ). max_head_dim: the runtime's.
Result<Gemma4AssistantWeights> load_gemma4_assistant(const std::string& path, const ModelFiles& target,
                                                     const GemmaParams& target_params, int64_t max_head_dim);

}  // namespace rill
