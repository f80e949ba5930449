#pragma once
// What the k4c and k4a CUDA model tests share (k4c_cuda_test.cpp,
// k4a_cuda_test.cpp): the HF llama golden (f32, 3 layers, 4 heads, 2 KV
// heads) widened in memory to heads of 64 (k4c's V needs blocks of 64 a
// head): q / k / v / o redrawn from the golden's own values (element i of
// a new matrix is element (i * 7919 + 13) mod n of the old one), q and k
// scaled by 2 so that scores spread (at the golden's 0.02 init k4c moves
// the logits by 0.018 rms, at 2x by 0.092; at 4x and 8x by 0.30 and 0.43,
// where attention is peaked enough that roundings decide which key wins:
// a 2e-7 relative change of every weight then moved the k4c logits by up
// to 5% of k4c's own change, against 0.005% at 2x, measured on the host,
// docs/perf.md k4cwire22); the fixture that opens it on either device
// with a KV type ("k4c", "k4a": the pairs; k4a calibrated on 256 fixed
// tokens); the shared multi-sequence steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../engine/golden_util.h"
#include "core/e4m3.h"
#include "engine/sequence_runner.h"
#include "loader/model_files.h"
#include "model/batch.h"
#include "model/kv_types.h"
#include "model/registry.h"

namespace rill::chan_test {

// CUDA k4c against the CPU k4c, as a share of k4c's own change on the CPU.
inline constexpr double kShare = 0.05;

inline double rms_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double ss = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) ss += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return a.empty() ? 0.0 : std::sqrt(ss / static_cast<double>(a.size()));
}

inline bool ends_with(const std::string& s, const std::string& end) {
  return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

// The golden llama with heads of 64 (see this file's comment); null when
// the golden is missing.
inline std::shared_ptr<ModelFiles> llama_hd64(std::vector<std::vector<float>>& store) {
  const std::string dir = test::hf_golden_dir("llama");
  if (!std::filesystem::exists(dir + "/config.json")) return nullptr;
  auto files = open_model_files(dir);
  EXPECT_TRUE(files.ok()) << files.error().message;
  if (!files.ok()) return nullptr;
  std::shared_ptr<ModelFiles> f = std::move(files).value();
  constexpr int64_t kHd = 64;
  const int64_t E = f->config.n_embd, H = f->config.n_head, KV = f->config.n_head_kv;
  f->config.head_dim = kHd;
  f->config.rope_dim = kHd;
  for (auto& [name, t] : f->tensors) {
    int64_t rows = 0, cols = 0;
    float scale = 1.0f;
    if (ends_with(name, "q_proj.weight")) {
      rows = H * kHd, cols = E, scale = 2.0f;
    } else if (ends_with(name, "k_proj.weight")) {
      rows = KV * kHd, cols = E, scale = 2.0f;
    } else if (ends_with(name, "v_proj.weight")) {
      rows = KV * kHd, cols = E;
    } else if (ends_with(name, "o_proj.weight")) {
      rows = E, cols = H * kHd;
    } else {
      continue;
    }
    EXPECT_EQ(t.dtype, DType::kF32) << name;
    const auto* src = reinterpret_cast<const float*>(t.data);
    const auto n_src = static_cast<uint64_t>(t.n_elements());
    std::vector<float> w(static_cast<size_t>(rows * cols));
    for (uint64_t i = 0; i < w.size(); ++i) w[i] = scale * src[(i * 7919 + 13) % n_src];
    store.push_back(std::move(w));
    t.shape = {rows, cols};
    t.data = reinterpret_cast<const uint8_t*>(store.back().data());
    t.n_bytes = store.back().size() * sizeof(float);
  }
  return f;
}

inline std::vector<int32_t> prompt(size_t n, int64_t vocab, size_t salt = 0) {
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 53 + 7 + salt * 31 + i * i % 11) % vocab);
  return ids;
}

// The model on either device (K4cHd64 needs no GPU: the CPU half of the
// comparisons below, run on the host).
class K4cHd64 : public ::testing::Test {
 protected:
  void SetUp() override {
    files_ = llama_hd64(store_);
    if (!files_) GTEST_SKIP() << "the llama golden is missing";
  }
  // n_slots: the KV slots (and so k4c's tail slots: one per sequence).
  Result<std::unique_ptr<Model>> try_open(Device d, int chunk, const char* kv, int n_slots = 1, bool graphs = true) {
    ModelOptions o;
    o.device = d;
    o.cuda_graphs = graphs;
    o.n_threads = 2;
    o.n_ctx = 256;
    o.max_batch_tokens = chunk;
    o.n_kv_slots = n_slots;
    if (kv && (std::string(kv) == "k4c" || std::string(kv) == "k4a")) {  // the pairs (model/kv_types.h)
      const bool alloc = std::string(kv) == "k4a";
      o.kv_types.k = KvType{alloc ? kKvQ4Alloc : kKvQ4Chan, false};
      o.kv_types.v = KvType{kKvIq4Nl64, true};
      // k4a calibrates its widths at load on these tokens (both devices).
      if (alloc) o.kv_types.calibration_tokens = prompt(256, files_->config.n_vocab, 97);
    } else if (kv) {
      o.kv_types.k = o.kv_types.v = parse_kv_type(kv);
    }
    return create_model(builtin_registry(), infer_profile(*files_), files_, o);
  }
  std::unique_ptr<Model> open(Device d, int chunk, const char* kv, int n_slots = 1, bool graphs = true) {
    auto m = try_open(d, chunk, kv, n_slots, graphs);
    EXPECT_TRUE(m.ok()) << m.error().message;
    return m.ok() ? std::move(m).value() : nullptr;
  }
  static std::vector<float> score(Model& m, const std::vector<int32_t>& ids) {
    SequenceRunner r(m);
    auto l = r.score(ids);
    EXPECT_TRUE(l.ok()) << l.error().message;
    return l.ok() ? *l : std::vector<float>{};
  }

  std::shared_ptr<ModelFiles> files_;
  std::vector<std::vector<float>> store_;
};

// Adds n tokens of sequence `slot` at pos0, every token's logits sampled.
inline void add(Batch& b, const Model& m, int32_t slot, const std::vector<int32_t>& ids, int32_t pos0, int32_t n) {
  const std::vector<int32_t> table = slot_block_table(slot, m.n_ctx(), m.kv_block_size());
  const int32_t first = b.n_tokens();
  const int32_t s = b.add_sequence(ids.data() + pos0, n, pos0, false, table);
  b.seqs[static_cast<size_t>(s)].kv_tail = m.n_kv_tail_slots() > 0 ? slot : -1;
  for (int32_t i = first; i < b.n_tokens(); ++i) b.sample_rows.push_back(i);
}

// Two sequences of different lengths in shared steps: A (slot 1) 20 then
// 27 prompt tokens, B (slot 0) 40 then 30, then three decode steps of both
// (A from 47: its tail holds 15 rows; B from 70: 6), then A alone; every
// step's logits of every token against the CPU's same steps.
inline std::vector<float> two_sequences(Model& m) {
  const std::vector<int32_t> a = prompt(60, m.n_vocab(), 1), b = prompt(80, m.n_vocab(), 2);
  const int64_t V = m.n_vocab();
  std::vector<float> all;
  Batch batch;
  auto run = [&]() {
    std::vector<float> logits(batch.sample_rows.size() * static_cast<size_t>(V));
    const Status st = m.forward(batch, logits.data());
    EXPECT_TRUE(st.ok()) << st.error().message;
    all.insert(all.end(), logits.begin(), logits.end());
    batch.clear();
  };
  add(batch, m, 1, a, 0, 20);
  add(batch, m, 0, b, 0, 40);
  run();
  add(batch, m, 0, b, 40, 30);
  add(batch, m, 1, a, 20, 27);
  run();
  for (int32_t k = 0; k < 3; ++k) {
    add(batch, m, 1, a, 47 + k, 1);
    add(batch, m, 0, b, 70 + k, 1);
    run();
  }
  add(batch, m, 1, a, 50, 10);
  run();
  return all;
}

// Nine sequences of different lengths (slots 0..8: 5, 13, 21, 29, 30, 44,
// 58, 62, 63 prompt tokens, each prefilled in a step of its own), then
// four decode steps of all nine: with graphs on, nine decode rows run as a
// bucket of 16 (CudaModelBase::compute), seven of them padding in the
// scratch block and tail slot. The decode steps complete blocks (29 -> 31,
// 30 -> 31, 62 -> 63, 63 at once) and start new ones (32); every step's
// logits of every token against the CPU's same steps.
inline std::vector<float> nine_sequences(Model& m) {
  const int32_t lens[9] = {5, 13, 21, 29, 30, 44, 58, 62, 63};
  std::vector<std::vector<int32_t>> ids;
  for (size_t s = 0; s < 9; ++s) ids.push_back(prompt(80, m.n_vocab(), 3 + s));
  const int64_t V = m.n_vocab();
  std::vector<float> all;
  Batch batch;
  auto run = [&]() {
    std::vector<float> logits(batch.sample_rows.size() * static_cast<size_t>(V));
    const Status st = m.forward(batch, logits.data());
    EXPECT_TRUE(st.ok()) << st.error().message;
    all.insert(all.end(), logits.begin(), logits.end());
    batch.clear();
  };
  for (int32_t s = 0; s < 9; ++s) {
    add(batch, m, s, ids[static_cast<size_t>(s)], 0, lens[s]);
    run();
  }
  for (int32_t k = 0; k < 4; ++k) {
    // In an order other than the slots' (sequence i of the step is slot (i * 4) mod 9).
    for (int32_t i = 0; i < 9; ++i) {
      const int32_t s = (i * 4) % 9;
      add(batch, m, s, ids[static_cast<size_t>(s)], lens[s] + k, 1);
    }
    run();
  }
  return all;
}

}  // namespace rill::chan_test
