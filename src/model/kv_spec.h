#pragma once
// Layer-kind specs: a model declares its KV layout as a list of layer groups
// (e.g. {full()} for Llama, {sliding(4096), full()} for Gemma-like models,
// {recurrent(), full()} for hybrids). Every layer of a group shares one block
// table per sequence (attention groups) or one state slot per sequence
// (recurrent groups). The KvManager only looks at these specs; it never
// special-cases a model.
#include <cstdint>
#include <vector>

namespace rill {

enum class LayerKind : uint8_t {
  kFull,       // attends to every earlier position: keeps every block
  kSliding,    // attends to the last `window` positions (itself included)
  kRecurrent,  // fixed-size per-sequence state (SSM / linear attention)
};

struct LayerGroupSpec {
  LayerKind kind = LayerKind::kFull;
  int32_t window = 0;  // tokens, >= 1; kSliding only

  bool is_attention() const { return kind != LayerKind::kRecurrent; }
};

inline LayerGroupSpec full() { return {LayerKind::kFull, 0}; }
inline LayerGroupSpec sliding(int32_t window) { return {LayerKind::kSliding, window}; }
inline LayerGroupSpec recurrent() { return {LayerKind::kRecurrent, 0}; }

using KvSpec = std::vector<LayerGroupSpec>;

}  // namespace rill
