#pragma once
// Golden families in ../shared/goldens/hf whose config.json uses a feature
// the loader does not implement yet, with the words its error must contain.
// Tests that walk every golden directory hold these to a clear refusal
// (naming the file and the field) instead of skipping them; a family leaves
// this list when its feature lands.
#include <map>
#include <string>

namespace rill::testing {

inline const std::map<std::string, std::string>& refused_golden_configs() {
  static const std::map<std::string, std::string> refused = {
      // Gemma 4: per-layer-type "proportional" RoPE (issue: newer families).
      {"gemma4", "config.json: field 'rope_parameters.full_attention.rope_type' 'proportional' is not supported"},
      {"gemma4-moe", "config.json: field 'rope_parameters.full_attention.rope_type' 'proportional' is not supported"},
  };
  return refused;
}

}  // namespace rill::testing
