#pragma once
// Fingerprints that key caches and pin exact artifacts.
#include <string>

#include "loader/model_config.h"
#include "loader/model_files.h"

namespace rill {

// Hash of every graph-shaping config field (not generation defaults). Two
// configs with the same fingerprint build the same graph; part of every KV
// cache namespace, so a changed config never reuses stale KV.
std::string config_fingerprint(const ModelConfig& config);

// Hash of the artifact's tensor table: names, dtypes, shapes and the first
// and last bytes of every tensor. Cheap (no full read) yet changes when any
// tensor is re-quantized, reshaped, renamed or replaced by another file.
std::string artifact_fingerprint(const ModelFiles& files);

}  // namespace rill
