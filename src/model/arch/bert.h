#pragma once
// BERT family (encoder): BertModel checkpoints in sentence-transformers
// layout, e.g. all-MiniLM-L6-v2. Word + absolute position + token-type
// embeddings, LayerNorm (with bias), then per layer: fused q/k/v with bias,
// attention in both directions within the sequence, output dense + residual
// + LayerNorm, an erf-GELU FFN + residual + LayerNorm (post-norm). The last
// hidden states are pooled as the model's modules.json declares (model/
// pooling.h). An encoder computes a sequence whole in one step and keeps no
// KV; it has no LM head (forward() returns no logits).
//
// The graph is written once over the Backend (backend/backend.h); it needs
// the encoder ops (Backend::has_encoder_ops()), which the CPU Backend has.
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "loader/model_files.h"

namespace rill {

struct BertLayer {
  Weight wqkv;  // [3 E, E] q, k, v
  Vec bqkv;     // [3 E]
  Weight wo;    // [E, E]
  Vec bo, ln1_w, ln1_b;
  Weight w_in;   // [F, E]
  Vec b_in;      // [F]
  Weight w_out;  // [E, F]
  Vec b_out, ln2_w, ln2_b;
};

struct BertGraph {
  int64_t E = 0, F = 0, n_layer = 0;
  int32_t n_head = 0, head_dim = 0;
  float eps = 1e-12f;
  Weight word, position;  // [n_vocab, E], [max_position, E]
  Vec token_type0;        // [E]: row 0 of token_type_embeddings (one sequence, type 0)
  Vec ln_w, ln_b;         // embeddings LayerNorm
  std::vector<BertLayer> layers;
};

// Activations for steps of up to max_tokens tokens, in Backend memory.
struct BertActivations {
  Tensor x, tmp, qkv, attn, ff;  // [T, E], [T, E], [T, 3 E], [T, E], [T, F]
};

// Places the checkpoint's weights (names with or without the "bert."
// prefix); errors name the tensor.
Result<BertGraph> place_bert(Backend& b, const ModelFiles& files);
// The last hidden states of the step's tokens into a.x: [n_tokens, E].
// Graph-capturable: Backend ops only.
Status bert_forward(Backend& b, const BertGraph& g, const StepMetadata& md, const BertActivations& a);

}  // namespace rill
