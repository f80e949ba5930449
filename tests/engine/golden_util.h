#pragma once
// What the model-family tests share (CPU and CUDA, model and engine level):
// reading a Hugging Face golden from ../shared/goldens/hf, prompts derived
// from its prompt, and running prompts through an Engine alone or all at
// once (the batch-invariance and prefix-cache checks compare the two).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rill/engine.h"

namespace rill::test {

// ../shared/goldens/hf/<family>; RILL_SHARED_DIR in the environment
// overrides the build-time path (a GPU machine gets a copy of the goldens).
inline std::string hf_golden_dir(const std::string& family) {
  const char* env = std::getenv("RILL_SHARED_DIR");
  return std::string(env ? env : RILL_SHARED_DIR) + "/goldens/hf/" + family;
}

inline bool has_hf_golden(const std::string& dir) {
  return std::filesystem::exists(dir + "/golden.json");
}

// golden.json as tools/make_hf_goldens.py writes it: the prompt's ids, the
// logits transformers gives at every prompt position, its greedy
// continuation.
struct HfGolden {
  std::vector<int32_t> prompt_ids;
  std::vector<std::vector<float>> logits;  // [prompt position][n_vocab]
  std::vector<int32_t> greedy_ids;
};

inline HfGolden read_hf_golden(const std::string& dir) {
  std::ifstream in(dir + "/golden.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  return {j["prompt_ids"].get<std::vector<int32_t>>(), j["logits"].get<std::vector<std::vector<float>>>(),
          j["greedy_ids"].get<std::vector<int32_t>>()};
}

// max |logits - g.logits| over every prompt position; logits: [prompt
// positions, n_vocab] as SequenceRunner::score gives them. A shape that
// does not match the golden fails the test (and counts as infinite).
inline double max_golden_error(const std::vector<float>& logits, const HfGolden& g) {
  const size_t n = g.prompt_ids.size(), V = g.logits.empty() ? 0 : g.logits[0].size();
  EXPECT_EQ(g.logits.size(), n);
  EXPECT_EQ(logits.size(), n * V);
  if (g.logits.size() != n || logits.size() != n * V) return INFINITY;
  double m = 0;
  for (size_t t = 0; t < n; ++t) {
    EXPECT_EQ(g.logits[t].size(), V) << "golden row " << t;
    for (size_t i = 0; i < V && i < g.logits[t].size(); ++i)
      m = std::max(m, std::fabs(double(logits[t * V + i]) - g.logits[t][i]));
  }
  return m;
}

// Six prompts of 3..24 tokens: slices and rotations of a golden prompt.
inline std::vector<std::vector<int32_t>> prompts_from(const std::vector<int32_t>& ids) {
  std::vector<std::vector<int32_t>> out;
  const size_t n = ids.size();
  for (size_t len : {3u, 24u, 11u, 5u, 17u, 8u}) {
    const size_t start = (out.size() * 5) % n;
    std::vector<int32_t> p;
    for (size_t i = 0; i < std::min(len, n); ++i) p.push_back(ids[(start + i) % n]);
    out.push_back(std::move(p));
  }
  return out;
}

// Every prompt's max_tokens generated tokens (EOS ignored) in prefix-cache
// namespace ns: one request at a time, or all submitted before any is read
// (so they share steps). A failed submit or an error event fails the test.
inline std::vector<std::vector<int32_t>> generate_all(Engine& e, const std::vector<std::vector<int32_t>>& prompts,
                                                      const SamplingParams& sampling, bool concurrent, uint64_t ns,
                                                      int max_tokens) {
  std::vector<std::vector<int32_t>> out(prompts.size());
  auto request = [&](size_t i) {
    GenerationRequest r;
    r.prompt = prompts[i];
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.sampling = sampling;
    r.cache_namespace = ns;
    auto h = e.submit(std::move(r));
    EXPECT_TRUE(h.ok()) << h.error().message;
    return std::move(h).value();
  };
  auto drain = [&](RequestHandle& h, size_t i) {
    GenerationEvent ev;
    while (h.next(ev)) {
      out[i].insert(out[i].end(), ev.token_ids.begin(), ev.token_ids.end());
      EXPECT_NE(ev.finish_reason, FinishReason::kError) << ev.error;
    }
  };
  if (concurrent) {
    std::vector<RequestHandle> hs;
    for (size_t i = 0; i < prompts.size(); ++i) hs.push_back(request(i));
    for (size_t i = 0; i < prompts.size(); ++i) drain(hs[i], i);
  } else {
    for (size_t i = 0; i < prompts.size(); ++i) {
      RequestHandle h = request(i);
      drain(h, i);
    }
  }
  return out;
}

// n_requests greedy requests for the golden prompt submitted at once,
// request i asking for all but i of the golden continuation's tokens (so
// they finish at different steps); each must give that prefix of it.
inline void expect_greedy_prefixes(Engine& e, const HfGolden& g, int n_requests, const std::string& what) {
  const auto n = static_cast<int32_t>(g.greedy_ids.size());
  std::vector<RequestHandle> hs;
  for (int32_t i = 0; i < n_requests; ++i) {
    GenerationRequest r;
    r.prompt = g.prompt_ids;
    r.max_tokens = n - i;
    r.ignore_eos = true;
    r.sampling.temperature = 0.0f;
    auto h = e.submit(std::move(r));
    ASSERT_TRUE(h.ok()) << h.error().message;
    hs.push_back(std::move(h).value());
  }
  for (int32_t i = 0; i < n_requests; ++i) {
    std::vector<int32_t> ids;
    GenerationEvent ev;
    while (hs[static_cast<size_t>(i)].next(ev)) {
      EXPECT_TRUE(ev.error.empty()) << ev.error;
      ids.insert(ids.end(), ev.token_ids.begin(), ev.token_ids.end());
    }
    EXPECT_EQ(ids, std::vector<int32_t>(g.greedy_ids.begin(), g.greedy_ids.begin() + (n - i)))
        << what << " request " << i;
  }
}

}  // namespace rill::test
