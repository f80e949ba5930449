#pragma once
// The parts of a multi-token-prediction (MTP) layer around its decoder
// layer, shared by the families that run one (ModelOptions::mtp; names in
// loader/mtp_layers.h): the input h' = eh_proj([enorm(emb(t_{p+1}));
// hnorm(h_p)]) and the head logits = head(head_norm(o_p)). A family binds
// its decoder layer under MtpLayers::prefixes[0] itself and runs it
// between mtp_head_input and mtp_head_logits.
//   kNextn (DeepSeek-V3, GLM-4.5): "<prefix>"{eh_proj, enorm, hnorm,
//     shared_head.norm}.weight, with optional own copies of the embedding
//     ("<prefix>embed_tokens.weight") and head ("<prefix>shared_head.head.weight");
//   kQwenMtp (Qwen3-Next, Qwen3.5): mtp.{fc, pre_fc_norm_embedding,
//     pre_fc_norm_hidden, norm}.weight; the model's embedding and head.
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/result.h"
#include "loader/model_files.h"
#include "loader/mtp_layers.h"
#include "model/layers.h"

namespace rill {

// Host views of the head's tensors (the embedding and head: the files' own
// copies, else the model's).
struct MtpHeadWeights {
  std::vector<float> enorm, hnorm, head_norm;  // [E]
  WeightView embed, head;                      // [V, E]
  WeightView eh;                               // [E, 2E]: [embedding | hidden] columns
};

// Binds the head of found's first layer. embed / lm_head: the model's.
// Errors name the files and tensor: a missing one, and eh_proj in a block
// format (placed as two column halves, so F32, F16 or BF16 only).
Result<MtpHeadWeights> bind_mtp_head(const ModelFiles& files, const MtpLayers& found, const WeightView& embed,
                                     const WeightView& lm_head);

// The head as a Backend placed it. w_offset: the norms' weight offset (1 for
// Qwen3-Next's zero-centred RMSNorm, else 0).
struct MtpHead {
  Weight embed, head;
  Weight eh_e, eh_h;  // eh_proj's column halves [E, E]
  Vec enorm, hnorm, head_norm;
  float eps = 1e-6f, w_offset = 0.0f;
  // What a chained draft feeds back (Model::forward_mtp's mtp_hidden): the
  // layer's output before the head's norm (DeepSeek, GLM, as vLLM's
  // deepseek_mtp), or after it (Qwen3-Next, as vLLM's qwen3_next_mtp).
  bool feed_back_normed = false;
};

// embed_placed / head_placed: the model's placements, reused when the
// head's tensors are the model's own.
Status place_mtp_head(Backend& b, const MtpHeadWeights& w, const WeightView& model_embed, const Weight& embed_placed,
                      const WeightView& model_head, const Weight& head_placed, MtpHead& out);

// x = eh_e enorm(emb(ids)) + eh_h hnorm(hidden) for n rows; h and hnormed
// are [n, E] scratch, hidden [n, E] F32.
Status mtp_head_input(Backend& b, const MtpHead& m, const int32_t* ids, int64_t n, Tensor hidden, Tensor x, Tensor h,
                      Tensor hnormed);

// After the decoder layer: `out` (when set) receives every row of x, or of
// head_norm(x) when m.feed_back_normed (Model::forward_mtp's mtp_hidden);
// then logits [n_sample, V] = head(head_norm(x[sample_rows])), final_rows
// [n_sample, E] scratch.
Status mtp_head_logits(Backend& b, const MtpHead& m, Tensor x, const int32_t* sample_rows, Tensor final_rows,
                       Tensor logits, const Tensor* out);

}  // namespace rill
