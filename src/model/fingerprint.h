#pragma once
// Fingerprints that key caches and pin exact artifacts.
#include <string>

#include "core/result.h"
#include "loader/model_config.h"
#include "loader/model_files.h"
#include "model/model.h"

namespace rill {

// Hash of every graph-shaping config field (not generation defaults). Two
// configs with the same fingerprint build the same graph; part of every KV
// cache namespace, so a changed config never reuses stale KV.
std::string config_fingerprint(const ModelConfig& config);

// The settings, beyond the config, that change a model's arithmetic, as a
// readable string (Model::numerics()): the implementation id (and so the
// device), ModelOptions::tensor_parallel (the all-reduce order), on CUDA
// ModelOptions::batch_invariant (other kernels), on the CPU the kernel ISA
// in use (cpu::best_isa(): the scalar, AVX2 and AVX-512 tables sum in
// different orders, so KV from another host's disk tier may differ). Not
// the options that leave numerics alone: threads, batch limits, KV pool
// size, cuda_graphs, cuda_device_sampling.
std::string numerics_fingerprint(const std::string& implementation_id, Device device, const ModelOptions& options);

// The fingerprint that keys KV caches: config_fingerprint(config) when
// `numerics` is empty (a model made outside the registry), else a hash of
// both, so KV written under one numerics setting is never restored under
// another.
std::string kv_fingerprint(const ModelConfig& config, const std::string& numerics);

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
