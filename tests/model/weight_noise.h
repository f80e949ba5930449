#pragma once
// f32-level noise for a checkpoint (tests): a copy of a Hugging Face
// directory (config.json, one model.safetensors) with every nonzero f32
// weight moved by -1, 0 or +1 ulp, each chosen by a generator seeded with
// `seed`. Its f32 logits move about as much as two devices' f32 runs differ
// (a few 1e-7 on the tiny goldens), so a quantized KV type's logits on
// such copies show how far that noise alone moves them: the type's noise
// floor, the least difference another device can be held to
// (tools/kv_noise_floor.py does the same from the command line).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace rill::testing {

// Writes the noisy copy of dir into out_dir (created); false with nothing
// promised written if a file is missing or malformed.
inline bool write_weight_noise_copy(const std::string& dir, const std::string& out_dir, uint32_t seed) {
  namespace fs = std::filesystem;
  std::ifstream in(dir + "/model.safetensors", std::ios::binary);
  if (!in) return false;
  const std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (raw.size() < 8) return false;
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  if (n > raw.size() - 8) return false;
  const nlohmann::json header = nlohmann::json::parse(raw.begin() + 8, raw.begin() + 8 + static_cast<ptrdiff_t>(n),
                                                      nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) return false;
  std::vector<char> out = raw;
  const size_t data = 8 + static_cast<size_t>(n);
  std::mt19937 rng(seed);
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__" || t.value("dtype", "") != "F32") continue;
    const auto offsets = t.at("data_offsets").get<std::vector<size_t>>();
    if (offsets.size() != 2 || offsets[0] > offsets[1] || data + offsets[1] > raw.size()) return false;
    for (size_t at = data + offsets[0]; at + 4 <= data + offsets[1]; at += 4) {
      uint32_t bits = 0;
      std::memcpy(&bits, out.data() + at, 4);
      const int step = static_cast<int>(rng() % 3) - 1;
      if ((bits & 0x7FFFFFFFu) == 0) continue;  // zeros stay zeros (no sign flip, no subnormal from nothing)
      bits = static_cast<uint32_t>(static_cast<int64_t>(bits) + step);
      std::memcpy(out.data() + at, &bits, 4);
    }
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  fs::copy_file(dir + "/config.json", out_dir + "/config.json", fs::copy_options::overwrite_existing, ec);
  if (ec) return false;
  std::ofstream o(out_dir + "/model.safetensors", std::ios::binary | std::ios::trunc);
  o.write(out.data(), static_cast<std::streamsize>(out.size()));
  return static_cast<bool>(o);
}

// The noise floor of `base` (a model's logits on the checkpoint at dir):
// the largest rms difference from it of score(copy_dir) over n noisy
// copies (seeds 1..n, written under the system's temp dir and removed
// after). score returns empty to leave a copy out (e.g. one that
// calibrated other k4a widths).
template <typename Score>
double noise_floor(const std::string& dir, int n, const std::vector<float>& base, Score&& score) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("rill-noise-" + std::to_string(std::random_device{}()));
  double floor = 0.0;
  for (int seed = 1; seed <= n; ++seed) {
    const std::string copy = (root / std::to_string(seed)).string();
    if (!write_weight_noise_copy(dir, copy, static_cast<uint32_t>(seed))) continue;
    const std::vector<float> got = score(copy);
    if (got.size() != base.size() || got.empty()) continue;
    double ss = 0.0;
    for (size_t i = 0; i < got.size(); ++i) ss += (double{got[i]} - base[i]) * (double{got[i]} - base[i]);
    const double rms = std::sqrt(ss / static_cast<double>(got.size()));
    floor = rms > floor ? rms : floor;
  }
  std::error_code ec;
  fs::remove_all(root, ec);
  return floor;
}

}  // namespace rill::testing
