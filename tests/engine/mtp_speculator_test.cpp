// The MTP speculator (`--spec mtp`, engine/mtp_speculator.h) on the tiny
// DeepSeek-V3 and GLM-4.5 checkpoints with an MTP layer
// (tests/data/mtp-{deepseek-v3,glm4-moe}, tools/make_mtp_golden.py): greedy
// and seeded output equal the output without speculation, alone and batched with opted-out rows, with drafts
// proposed and counted in the stats and usage (random weights: mostly
// rejected, so the rollback runs); its first draft is the numpy
// reference's; `--spec mtp` on a model without MTP layers, or whose files
// dropped them, is refused naming the model.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/e4m3.h"
#include "engine/mtp_speculator.h"
#include "golden_util.h"
#include "loader/model_files.h"
#include "model/batch.h"
#include "model/kv_types.h"
#include "model/registry.h"
#include "rill/engine.h"

namespace rill {
namespace {

const std::string kMtpCheckpoint = std::string(RILL_TEST_DATA) + "/mtp-deepseek-v3";
const std::string kGlmCheckpoint = std::string(RILL_TEST_DATA) + "/mtp-glm4-moe";     // GLM-4.5's nextn layer
const std::string kGlm5Checkpoint = std::string(RILL_TEST_DATA) + "/mtp-glm-5";       // GLM-5: MLA + DSA
const std::string kQwenCheckpoint = std::string(RILL_TEST_DATA) + "/mtp-qwen3-next";  // Qwen3-Next's mtp.*

EngineOptions options(const std::string& spec, const KvTypeOptions& kv = {}) {
  EngineOptions o;
  o.kv_types = kv;
  o.n_threads = 2;
  o.n_ctx = 128;
  o.max_batch_tokens = 32;
  o.max_running = 4;
  o.kv_cache_mb = 8;
  o.check_integrity = true;
  o.spec = spec;
  o.spec_tokens = 4;
  return o;
}

// checkpoint: an MTP checkpoint made from the Hugging Face golden `golden`.
// check_golden: also hold the first greedy tokens to the transformers
// golden's (not for DSA models, whose transformers golden breaks index ties
// by the whole call: tests/engine/dsa_parity_test.cpp).
// kv: the KV types of both engines.
void expect_same_output(const std::string& checkpoint, const std::string& golden, bool check_golden = true,
                        const KvTypeOptions& kv = {}) {
  const std::string hf = test::hf_golden_dir(golden);
  if (!test::has_hf_golden(hf)) GTEST_SKIP() << hf << " not found";
  auto on = Engine::load(checkpoint, options("mtp", kv));
  ASSERT_TRUE(on.ok()) << on.error().message;
  auto off = Engine::load(checkpoint, options("off", kv));
  ASSERT_TRUE(off.ok()) << off.error().message;
  EXPECT_EQ((*on)->stats().speculator, "mtp");
  const test::HfGolden g = test::read_hf_golden(hf);
  if (check_golden) test::expect_greedy_prefixes(**on, g, 2, golden + " with --spec mtp");
  const auto prompts = test::prompts_from(g.prompt_ids);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams seeded;
  seeded.temperature = 0.8f;
  seeded.seed = 5;
  for (const SamplingParams& s : {greedy, seeded}) {
    const auto want = test::generate_all(**off, prompts, s, false, 1, 24);
    EXPECT_EQ(test::generate_all(**on, prompts, s, false, 1, 24), want) << "temperature " << s.temperature;
    EXPECT_EQ(test::generate_all(**on, prompts, s, true, 2, 24), want) << "temperature " << s.temperature << " batched";
  }
  const EngineStats st = (*on)->stats();
  std::printf("%s MTP (random weights): %lld drafted, %lld accepted\n", golden.c_str(),
              static_cast<long long>(st.spec_draft_tokens), static_cast<long long>(st.spec_accepted_tokens));
  EXPECT_GT(st.spec_draft_tokens, 50);
  EXPECT_EQ(st.integrity_errors, 0) << st.last_integrity_error;

  // Usage reports the request's drafted and accepted tokens.
  GenerationRequest r;
  r.prompt = prompts[1];
  r.max_tokens = 16;
  r.ignore_eos = true;
  r.sampling = greedy;
  auto h = (*on)->submit(std::move(r));
  ASSERT_TRUE(h.ok()) << h.error().message;
  GenerationEvent ev;
  Usage usage;  // the last event's
  while (h->next(ev)) usage = ev.usage;
  EXPECT_GT(usage.draft_tokens, 0);
  EXPECT_LE(usage.accepted_draft_tokens, usage.draft_tokens);
  std::vector<int32_t> speculated;
  for (const bool speculative : {true, false}) {  // "speculative": false opts out, same tokens
    GenerationRequest q;
    q.prompt = prompts[2];
    q.max_tokens = 16;
    q.ignore_eos = true;
    q.sampling = greedy;
    q.speculative = speculative;
    auto hq = (*on)->submit(std::move(q));
    ASSERT_TRUE(hq.ok()) << hq.error().message;
    std::vector<int32_t> out;
    while (hq->next(ev)) {
      out.insert(out.end(), ev.token_ids.begin(), ev.token_ids.end());
      usage = ev.usage;
    }
    if (speculative) {
      EXPECT_GT(usage.draft_tokens, 0);
      speculated = out;
    } else {
      EXPECT_EQ(usage.draft_tokens, 0);
      EXPECT_EQ(out, speculated);
    }
  }
}

TEST(MtpSpeculator, OutputIsTheSameWithAndWithout) {
  expect_same_output(kMtpCheckpoint, "deepseek-v3");
}
TEST(MtpSpeculator, Glm4MoeOutputIsTheSameWithAndWithout) {
  expect_same_output(kGlmCheckpoint, "glm4-moe");
}
// K in q4c (k4c's K; V stays the checkpoint's f32: heads of 16 hold no
// iq4_nlh64 block) with its per-sequence tails: the engine ends drafts
// before a block does (EngineImpl::draft_length), and the MTP layer's own
// plane keeps f32 (its chained rows are rewritten: CpuPagedModel::
// kv_draft_planes_) while every model layer is q4c.
TEST(MtpSpeculator, Glm4MoeWithQ4cKvOutputIsTheSameWithAndWithout) {
  KvTypeOptions kv;
  kv.k = KvType{kKvQ4Chan, false};
  expect_same_output(kGlmCheckpoint, "glm4-moe", false, kv);
  auto e = Engine::load(kGlmCheckpoint, options("mtp", kv));
  ASSERT_TRUE(e.ok()) << e.error().message;
  const std::vector<Model::KvLayer> layers = (*e)->model().kv_layers();
  ASSERT_GE(layers.size(), 2u);
  for (size_t l = 0; l + 1 < layers.size(); ++l) EXPECT_EQ(layers[l].dtype, kKvQ4Chan) << "layer " << l;
  EXPECT_EQ(layers.back().dtype, DType::kF32) << "the MTP layer's plane";
  EXPECT_GT((*e)->model().n_kv_tail_slots(), 0);
}
// A hybrid: rejected drafts roll the recurrent state back; the MTP layer
// (full attention) never touches it.
TEST(MtpSpeculator, Glm5OutputIsTheSameWithAndWithout) {
  expect_same_output(kGlm5Checkpoint, "glm-5", false);
}
TEST(MtpSpeculator, Qwen3NextOutputIsTheSameWithAndWithout) {
  expect_same_output(kQwenCheckpoint, "qwen3-next");
}

// A prompt of exactly two blocks: the chain's rows past it need a block
// the request does not hold yet, which the engine leases from the free
// blocks for the chain alone. The first round then drafts 3 (max_tokens 5:
// the owed token and 3 drafts), not the 1 a chain cut at the request's
// blocks would give; output and block accounting stay exact.
TEST(MtpSpeculator, ChainsPastTheRequestsBlocks) {
  std::ifstream in(kMtpCheckpoint + "/golden.json");
  ASSERT_TRUE(in);
  const auto gold = nlohmann::json::parse(in);
  std::vector<int32_t> prompt = gold["prompt_ids"].get<std::vector<int32_t>>();
  prompt.insert(prompt.end(), prompt.begin(), prompt.begin() + (32 - static_cast<long>(prompt.size())));
  ASSERT_EQ(prompt.size(), 32u);
  auto on = Engine::load(kMtpCheckpoint, options("mtp"));
  ASSERT_TRUE(on.ok()) << on.error().message;
  auto off = Engine::load(kMtpCheckpoint, options("off"));
  ASSERT_TRUE(off.ok()) << off.error().message;
  std::vector<int32_t> outs[2];
  Usage usage;
  for (int i = 0; i < 2; ++i) {
    GenerationRequest r;
    r.prompt = prompt;
    r.max_tokens = 5;
    r.ignore_eos = true;
    r.sampling.temperature = 0.0f;
    auto h = (i == 0 ? *on : *off)->submit(std::move(r));
    ASSERT_TRUE(h.ok()) << h.error().message;
    GenerationEvent ev;
    while (h->next(ev)) {
      outs[i].insert(outs[i].end(), ev.token_ids.begin(), ev.token_ids.end());
      if (i == 0) usage = ev.usage;
    }
  }
  EXPECT_EQ(outs[0], outs[1]);
  // Rejected drafts (random weights): rounds of 3, then 1 and 1.
  if (usage.accepted_draft_tokens == 0) {
    EXPECT_EQ(usage.draft_tokens, 5);
  }
  EXPECT_EQ((*on)->stats().integrity_errors, 0) << (*on)->stats().last_integrity_error;
}

// The first draft after a prompt is the MTP head's argmax at the prompt's
// last position, which the numpy reference computed (mtp_greedy's last).
TEST(MtpSpeculator, FirstDraftIsTheReferenceHeads) {
  std::ifstream in(kMtpCheckpoint + "/golden.json");
  ASSERT_TRUE(in);
  const auto gold = nlohmann::json::parse(in);
  EngineOptions o = options("mtp");
  o.spec_tokens = 1;
  auto on = Engine::load(kMtpCheckpoint, o);
  ASSERT_TRUE(on.ok()) << on.error().message;
  GenerationRequest r;
  r.prompt = gold["prompt_ids"].get<std::vector<int32_t>>();
  r.max_tokens = 3;  // the first token, then one verify step with the first draft
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  auto h = (*on)->submit(std::move(r));
  ASSERT_TRUE(h.ok()) << h.error().message;
  std::vector<int32_t> out;
  GenerationEvent ev;
  while (h->next(ev)) out.insert(out.end(), ev.token_ids.begin(), ev.token_ids.end());
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0], gold["next_token"].get<int32_t>());
  const EngineStats st = (*on)->stats();
  ASSERT_EQ(st.spec_draft_tokens, 1);
  // The draft held iff the target's second token is the head's guess.
  EXPECT_EQ(st.spec_accepted_tokens, out[1] == gold["mtp_greedy"].back().get<int32_t>() ? 1 : 0);
}

// Chained drafts (k > 1): after the prompt, the speculator's k drafts are
// the numpy reference's chain (golden mtp_chain: the one MTP layer fed its
// own output and its previous draft), for every k up to the golden's (each
// observe rewrites the rows the previous chain wrote past the prompt).
void expect_reference_chain(const std::string& dir) {
  std::ifstream in(dir + "/golden.json");
  ASSERT_TRUE(in) << dir;
  const auto gold = nlohmann::json::parse(in);
  const auto prompt = gold["prompt_ids"].get<std::vector<int32_t>>();
  const auto chain = gold["mtp_chain"].get<std::vector<int32_t>>();
  const auto n = static_cast<int32_t>(prompt.size());
  auto files = open_model_files(dir);
  ASSERT_TRUE(files.ok()) << files.error().message;
  ModelOptions o;
  o.n_threads = 2;
  o.n_ctx = 64;
  o.max_batch_tokens = 32;
  o.max_batch_seqs = 4;
  o.mtp = true;
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, o);
  ASSERT_TRUE(model.ok()) << model.error().message;
  Model& m = **model;
  const int64_t E = m.config().n_embd, V = m.n_vocab();
  // Two slots: the request's blocks, then blocks a second request holds.
  const std::vector<int32_t> table = slot_block_table(0, m.n_ctx(), m.kv_block_size());
  Batch b;
  b.add_sequence(prompt.data(), n, 0, true, table);
  const KvSpec& groups = m.kv_spec();
  if (std::any_of(groups.begin(), groups.end(), [](const LayerGroupSpec& g) { return !g.is_attention(); }))
    b.seqs[0].state_slot = 0;  // a hybrid's recurrent state (Qwen3-Next)
  b.seqs[0].decode_from = n;
  std::vector<float> logits(static_cast<size_t>(V)), hidden(static_cast<size_t>(n * E));
  const Status st = m.forward_hidden(b, logits.data(), hidden.data());
  ASSERT_TRUE(st.ok()) << st.error().message;
  std::vector<int32_t> tokens = prompt;
  tokens.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  ASSERT_EQ(tokens.back(), gold["next_token"].get<int32_t>());

  if (gold.contains("hidden")) {  // Qwen3-Next: the reference's given rows (tests/model/mtp_head_test.cpp)
    hidden.clear();
    for (const auto& row : gold["hidden"]) {
      for (const auto& x : row) hidden.push_back(x.get<float>());
    }
    ASSERT_EQ(hidden.size(), static_cast<size_t>(n * E));
  }
  MtpSpeculator spec(m);
  for (int32_t k = 1; k <= static_cast<int32_t>(chain.size()); ++k) {
    const HiddenRows rows{7, tokens, 0, n, hidden.data(), table, n, k, 0, {}};
    spec.observe(std::span<const HiddenRows>(&rows, 1));
    std::vector<int32_t> drafts;
    spec.propose(7, tokens, k, drafts);
    EXPECT_EQ(drafts, std::vector<int32_t>(chain.begin(), chain.begin() + k)) << dir << ": k = " << k;
    drafts.clear();
    spec.propose(7, tokens, 1, drafts);  // fewer than drafted: the chain's head
    EXPECT_EQ(drafts, std::vector<int32_t>(chain.begin(), chain.begin() + 1)) << dir << ": k = " << k;
  }
  // A request whose tokens moved on gets no stale drafts.
  std::vector<int32_t> drafts;
  tokens.push_back(chain[0]);
  spec.propose(7, tokens, 4, drafts);
  EXPECT_TRUE(drafts.empty());
}

TEST(MtpSpeculator, ChainedDraftsAreTheReferenceChain) {
  expect_reference_chain(kMtpCheckpoint);
  expect_reference_chain(kGlmCheckpoint);
  expect_reference_chain(kQwenCheckpoint);
  expect_reference_chain(kGlm5Checkpoint);
}

TEST(MtpSpeculator, AModelWithoutMtpLayersIsRefusedNamingIt) {
  const std::string llama = test::hf_golden_dir("llama"), deepseek = test::hf_golden_dir("deepseek-v3");
  if (!test::has_hf_golden(llama) || !test::has_hf_golden(deepseek)) GTEST_SKIP() << "goldens not found";
  auto none = Engine::load(llama, options("mtp"));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find(llama), std::string::npos) << none.error().message;
  EXPECT_NE(none.error().message.find("no multi-token-prediction"), std::string::npos) << none.error().message;
  // The transformers-saved golden declares a layer and dropped its weights.
  auto dropped = Engine::load(deepseek, options("mtp"));
  ASSERT_FALSE(dropped.ok());
  EXPECT_NE(dropped.error().message.find(deepseek), std::string::npos) << dropped.error().message;
  EXPECT_NE(dropped.error().message.find("model.layers.3.eh_proj.weight"), std::string::npos)
      << dropped.error().message;
}

// No family splits its MTP layer over ranks: `--spec mtp` with
// `--tensor-parallel N` is refused at load, naming both flags, for the
// family whose CPU runtime splits (GLM-4.5, the Llama graph) and for those
// that do not (DeepSeek-V3, Qwen3-Next), on either device (the refusal
// comes before any rank or device is touched).
TEST(MtpSpeculator, TensorParallelIsRefusedAtLoadNamingTheFlag) {
  for (const std::string& dir : {kGlmCheckpoint, kMtpCheckpoint, kQwenCheckpoint}) {
    for (const Device device : {Device::kCpu, Device::kCuda}) {
      EngineOptions o = options("mtp");
      o.device = device;
      o.tensor_parallel = 2;
      auto e = Engine::load(dir, o);
      ASSERT_FALSE(e.ok()) << dir;
      const std::string& msg = e.error().message;
      EXPECT_NE(msg.find("--spec mtp"), std::string::npos) << msg;
      EXPECT_NE(msg.find("--tensor-parallel 2"), std::string::npos) << msg;
    }
  }
  // The split itself is not what is refused: the CPU splits GLM-4.5.
  EngineOptions o = options("ngram");
  o.tensor_parallel = 2;
  auto split = Engine::load(kGlmCheckpoint, o);
  EXPECT_TRUE(split.ok()) << split.error().message;
}

}  // namespace
}  // namespace rill
