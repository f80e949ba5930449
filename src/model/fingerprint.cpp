#include "model/fingerprint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "core/hash.h"

namespace rill {

std::string config_fingerprint(const ModelConfig& c) {
  nlohmann::json j = {
      {"architecture", c.architecture},
      {"n_vocab", c.n_vocab},
      {"n_embd", c.n_embd},
      {"n_layer", c.n_layer},
      {"n_head", c.n_head},
      {"n_head_kv", c.n_head_kv},
      {"head_dim", c.head_dim},
      {"n_ff", c.n_ff},
      {"max_position", c.max_position},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"rope_dim", c.rope_dim},
      {"rope_style", static_cast<int>(c.rope_style)},
      {"rope_scaling",
       {static_cast<int>(c.rope_scaling.type), c.rope_scaling.factor, c.rope_scaling.low_freq_factor,
        c.rope_scaling.high_freq_factor, c.rope_scaling.original_max_position, c.rope_scaling.beta_fast,
        c.rope_scaling.beta_slow, c.rope_scaling.attention_factor.value_or(-1.0f)}},
      {"sliding_window", c.sliding_window},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"hidden_act", c.hidden_act},
  };
  if (c.rope_scaling.type == RopeScaling::Type::kLongRope) {  // only then (GGUF files hold them as tensors)
    j["longrope"] = {c.rope_scaling.short_factor, c.rope_scaling.long_factor};
  }
  if (c.n_expert > 0) {  // only then, so dense models keep their fingerprints
    j["moe"] = {c.n_expert,       c.n_expert_used,  c.n_ff_expert, c.n_ff_shared_expert,
                c.norm_topk_prob, c.moe_layer_step, c.dense_layers};
  }
  // Family-specific graph fields of later architectures live in `raw`;
  // generation settings and tokenizer keys do not shape the graph.
  nlohmann::json raw = c.raw.is_object() ? c.raw : nlohmann::json::object();
  for (const char* k : {"generation_config", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
                        "bos_token_id", "eos_token_id", "pad_token_id"}) {
    raw.erase(k);
  }
  j["raw"] = raw;
  return hex64(hash64(j.dump()));
}

std::string artifact_fingerprint(const ModelFiles& files, unsigned n_threads) {
  // Each tensor's bytes are hashed on their own (in parallel: XXH3 runs at
  // memory speed on one core, and a large model spans many), then the table
  // entries and per-tensor hashes are folded in name order.
  std::vector<const TensorRef*> refs;
  refs.reserve(files.tensors.size());
  for (const auto& [name, t] : files.tensors) refs.push_back(&t);
  std::vector<uint64_t> tensor_hash(refs.size(), 0);
  if (n_threads == 0) n_threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  n_threads = std::min<unsigned>(n_threads, static_cast<unsigned>(std::max<size_t>(1, refs.size())));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < refs.size();) {
      tensor_hash[i] = refs[i]->n_bytes > 0 ? hash64(refs[i]->data, refs[i]->n_bytes) : 0;
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < n_threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  uint64_t h = 0;
  for (size_t i = 0; i < refs.size(); ++i) {
    const TensorRef& t = *refs[i];
    const std::string entry = t.name + "|" + std::string(dtype_name(t.dtype)) + "|" + t.shape_string() + "|" +
                              std::to_string(t.n_bytes) + "|" + hex64(tensor_hash[i]);
    h = hash64(entry, h);
  }
  return hex64(h);
}

namespace {

// The identity of the files behind `files` as the file system reports it;
// empty when one cannot be stat'ed (then nothing is cached).
std::string file_identity_key(const ModelFiles& files) {
  std::set<std::string> paths;
  for (const auto& [name, t] : files.tensors) paths.insert(t.file);
  std::string key = "v1";  // bump with artifact_fingerprint's definition
  for (const std::string& p : paths) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) return "";
    char buf[256];
    std::snprintf(buf, sizeof buf, "|%llu:%llu:%lld:%lld.%09ld:%lld.%09ld", static_cast<unsigned long long>(st.st_dev),
                  static_cast<unsigned long long>(st.st_ino), static_cast<long long>(st.st_size),
                  static_cast<long long>(st.st_mtim.tv_sec), st.st_mtim.tv_nsec,
                  static_cast<long long>(st.st_ctim.tv_sec), st.st_ctim.tv_nsec);
    key += "|" + p + buf;
  }
  return hex64(hash64(key));
}

// Entries kept in the sidecar (one per model file set seen; oldest out).
constexpr size_t kMaxSidecarEntries = 32;

}  // namespace

std::string artifact_fingerprint_cached(const ModelFiles& files, const std::string& sidecar_path, bool* rehashed) {
  const std::string key = file_identity_key(files);
  nlohmann::json side = nlohmann::json::object();
  {
    std::ifstream in(sidecar_path);
    if (in) {
      side = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (!side.is_object() || !side.contains("entries") || !side["entries"].is_array())
        side = nlohmann::json::object();
    }
  }
  if (!side.contains("entries")) side["entries"] = nlohmann::json::array();
  nlohmann::json& entries = side["entries"];
  if (!key.empty()) {
    for (const auto& e : entries) {
      if (e.is_object() && e.value("key", "") == key && e.contains("fingerprint") && e["fingerprint"].is_string()) {
        if (rehashed) *rehashed = false;
        return e["fingerprint"].get<std::string>();
      }
    }
  }
  const std::string fp = artifact_fingerprint(files);
  if (rehashed) *rehashed = true;
  if (key.empty()) return fp;
  entries.push_back({{"key", key}, {"fingerprint", fp}, {"path", files.path}});
  while (entries.size() > kMaxSidecarEntries) entries.erase(entries.begin());
  const std::string tmp = sidecar_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << side.dump();
    if (!out) {
      ::unlink(tmp.c_str());
      return fp;
    }
  }
  if (std::rename(tmp.c_str(), sidecar_path.c_str()) != 0) ::unlink(tmp.c_str());
  return fp;
}

}  // namespace rill
