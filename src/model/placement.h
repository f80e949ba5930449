#pragma once
// Placing a family's bound weights through a Backend: the pieces every
// family's placement pass shares (model/arch/*.cpp).
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/result.h"
#include "model/layers.h"

namespace rill {

// A mapped weight as the Backend takes it (a row_stride of 0 means dense rows).
HostMatrix host_matrix(const WeightView& w);

// q, k and v as one Weight (rows q, then k, then v: what rope_store_kv
// reads) named "<prefix>self_attn.{q,k,v}_proj", and their biases as one
// vector with zeros where a part has none; `bias` is left absent when no
// part has one. For a tensor-parallel shard the parts are its slices.
Status place_fused_qkv(Backend& b, const Linear& q, const Linear& k, const Linear& v, const std::string& prefix,
                       Weight& weight, Vec& bias);

// The token embedding ("embed_tokens.weight"), the LM head ("lm_head.weight";
// the embedding's placement itself when tied) and the final norm
// ("norm.weight", final_norm.size() wide).
Status place_embedding_and_head(Backend& b, const WeightView& embed, const WeightView& lm_head, bool tied,
                                const std::vector<float>& final_norm, Weight& embed_out, Weight& head_out,
                                Vec& final_norm_out);

}  // namespace rill
