#pragma once
// A tiny random Gemma-4-shaped checkpoint whose full layers have the public
// checkpoints' head_dim 512 (the HF gemma4 golden's are 32): written once
// per process from ../shared/goldens/hf/gemma4 (f32 weights) into a temp
// folder. config.json as the golden's, except 8 query heads, sliding layers
// of 2 KV heads of 64, full layers of global_head_dim 512 with one KV head
// (8 q heads per KV head, as Gemma-4 26B-A4B / 31B) and attention_k_eq_v
// (K reused as V; no v_proj on full layers); KV sharing (the last 2 layers:
// full layer 5 reads layer 2's KV), per-layer embeddings, proportional
// partial RoPE (0.25 of 512) and the final softcap stay the golden's.
// Tensors whose shape depends on the heads are redrawn: element i of a new
// projection is element (i * 7919 + 13) mod n of the golden's tensor of that
// name (the same value distribution, scrambled; deterministic); the q and k
// norms' weights (the golden's are 1) become (0.25 / head_dim)^(1/4), so
// that q.k (Gemma 4's attention scale is 1) spreads about 0.5 over random
// directions at every width. At weight 1 a 512-wide head's scores spread
// 22.6: so peaked a softmax that roundings decide which key wins, and two
// correct engines differ by whole logits (measured on the H200: CUDA's
// q8_0 KV 2.4 from the CPU's; on the CPU, q8_0 KV 2.9 from f32 KV, 0.14
// with these weights). Every other tensor is copied as it is.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "../engine/golden_util.h"

namespace rill::test {

inline constexpr int64_t kHd512Heads = 8, kHd512SlidingKv = 2, kHd512SlidingDim = 64, kHd512FullDim = 512;

// The model folder ("" when the gemma4 golden is missing).
inline std::string gemma4_hd512_model_dir() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    const std::string src = hf_golden_dir("gemma4");
    if (!has_hf_golden(src)) return std::string();
    const fs::path out = fs::temp_directory_path() / ("rill_gemma4_hd512_" + std::to_string(::getpid()));
    fs::create_directories(out);
    std::ifstream cfg_in(src + "/config.json");
    nlohmann::json cfg = nlohmann::json::parse(cfg_in);
    cfg.erase("per_layer_config");
    cfg["num_attention_heads"] = kHd512Heads;
    cfg["num_key_value_heads"] = kHd512SlidingKv;
    cfg["head_dim"] = kHd512SlidingDim;
    cfg["global_head_dim"] = kHd512FullDim;
    cfg["num_global_key_value_heads"] = 1;
    cfg["attention_k_eq_v"] = true;
    std::ofstream(out / "config.json") << cfg.dump(1);
    for (const char* f : {"generation_config.json"}) {
      if (fs::exists(src + "/" + f)) fs::copy_file(src + "/" + f, out / f, fs::copy_options::overwrite_existing);
    }
    const auto types = cfg["layer_types"].get<std::vector<std::string>>();
    const int64_t E = cfg["hidden_size"].get<int64_t>();

    std::ifstream in(src + "/model.safetensors", std::ios::binary);
    uint64_t header_len = 0;
    in.read(reinterpret_cast<char*>(&header_len), 8);
    std::string header(header_len, '\0');
    in.read(header.data(), static_cast<std::streamsize>(header_len));
    const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto h = nlohmann::json::parse(header);
    const std::regex attn(R"(model\.layers\.(\d+)\.self_attn\.(q_proj|k_proj|v_proj|o_proj|q_norm|k_norm)\.weight)");
    nlohmann::json out_h = nlohmann::json::object();
    std::string out_data;
    for (const auto& [name, t] : h.items()) {
      if (name == "__metadata__") continue;
      EXPECT_EQ(t["dtype"], "F32") << name;
      const auto begin = t["data_offsets"][0].get<size_t>(), end = t["data_offsets"][1].get<size_t>();
      std::vector<int64_t> shape = t["shape"].get<std::vector<int64_t>>();
      std::string bytes = data.substr(begin, end - begin);
      std::smatch m;
      if (std::regex_match(name, m, attn)) {
        const bool full = types.at(std::stoul(m[1].str())) == "full_attention";
        const int64_t hd = full ? kHd512FullDim : kHd512SlidingDim, kv = full ? 1 : kHd512SlidingKv;
        const std::string what = m[2].str();
        if (full && what == "v_proj") continue;  // attention_k_eq_v
        shape = what == "q_proj"                       ? std::vector<int64_t>{kHd512Heads * hd, E}
                : what == "o_proj"                     ? std::vector<int64_t>{E, kHd512Heads * hd}
                : what == "k_proj" || what == "v_proj" ? std::vector<int64_t>{kv * hd, E}
                                                       : std::vector<int64_t>{hd};
        const size_t n_old = bytes.size() / 4;
        size_t n_new = 1;
        for (int64_t d : shape) n_new *= static_cast<size_t>(d);
        std::string drawn(n_new * 4, '\0');
        const bool norm = what == "q_norm" || what == "k_norm";
        const float norm_w = std::pow(0.25f / static_cast<float>(hd), 0.25f);
        for (size_t i = 0; i < n_new; ++i) {
          if (norm) {
            std::memcpy(&drawn[i * 4], &norm_w, 4);
          } else {
            std::memcpy(&drawn[i * 4], &bytes[((i * 7919 + 13) % n_old) * 4], 4);
          }
        }
        bytes = std::move(drawn);
      }
      out_h[name] = {
          {"dtype", "F32"}, {"shape", shape}, {"data_offsets", {out_data.size(), out_data.size() + bytes.size()}}};
      out_data += bytes;
    }
    std::string hs = out_h.dump();
    hs.append((8 - hs.size() % 8) % 8, ' ');
    std::ofstream o(out / "model.safetensors", std::ios::binary);
    const uint64_t n = hs.size();
    o.write(reinterpret_cast<const char*>(&n), 8);
    o.write(hs.data(), static_cast<std::streamsize>(hs.size()));
    o.write(out_data.data(), static_cast<std::streamsize>(out_data.size()));
    return out.string();
  }();
  return dir;
}

}  // namespace rill::test
