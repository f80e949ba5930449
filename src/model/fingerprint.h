#pragma once
// Fingerprints that key caches and pin exact artifacts.
#include <string>

#include "core/result.h"
#include "loader/model_config.h"
#include "loader/model_files.h"

namespace rill {

// Hash of every graph-shaping config field (not generation defaults). Two
// configs with the same fingerprint build the same graph; part of every KV
// cache namespace, so a changed config never reuses stale KV.
std::string config_fingerprint(const ModelConfig& config);

// Hash of the artifact's tensor table (names, dtypes, shapes) and of every
// byte of every tensor (XXH3), so it changes when any weight byte changes.
// It keys the disk tier's files (KvFileIdentity::model_id): two checkpoints
// that differ anywhere inside a tensor never share cached KV. Reads every
// weight once: pages of the mapping are faulted in (they are read by the
// first forward anyway), the tensors hashed on up to `n_threads` threads
// (0: the hardware's, at most 8). Measured: docs/limits.md.
std::string artifact_fingerprint(const ModelFiles& files, unsigned n_threads = 0);

// artifact_fingerprint, remembered in the sidecar file `sidecar_path` (JSON,
// written atomically) under a key made of every model file's path, device,
// inode, size, mtime and ctime (nanoseconds): a restart on unchanged files
// does not rehash; a file that was replaced, rewritten or touched is hashed
// again. A missing or unreadable sidecar is a rehash, never an error; a
// failure to write it only costs the next start a rehash.
std::string artifact_fingerprint_cached(const ModelFiles& files, const std::string& sidecar_path,
                                        bool* rehashed = nullptr);

}  // namespace rill
