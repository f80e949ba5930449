// Gemma 4's assistant (`--spec assistant=PATH`, engine/assistant_speculator.h,
// model/arch/gemma4_assistant.h) on a tiny random gemma4_text target and
// gemma4_assistant pair made with transformers 5.25.0
// (tests/data/gemma4-assistant, tools/make_gemma4_assistant_golden.py):
// the assistant's draft logits of steps 1..4 after the prompt equal
// transformers' (its own candidate generator) within 1e-4; the speculator
// proposes transformers' drafts; greedy output equals the output without
// speculation (and transformers' assisted generation), alone and batched
// with opted-out rows; usage and stats count drafted and accepted tokens
// consistently with the steps taken; mismatched targets and bad configs are
// refused naming the field or both models.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/assistant_speculator.h"
#include "golden_util.h"
#include "loader/model_files.h"
#include "model/batch.h"
#include "model/registry.h"
#include "rill/engine.h"

namespace rill {
namespace {

const std::string kDir = std::string(RILL_TEST_DATA) + "/gemma4-assistant";
const std::string kTarget = kDir + "/target";
const std::string kAssistant = kDir + "/assistant";

nlohmann::json golden() {
  std::ifstream in(kDir + "/golden.json");
  EXPECT_TRUE(in) << kDir;
  return nlohmann::json::parse(in);
}

EngineOptions options(const std::string& spec) {
  EngineOptions o;
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

const std::string kSpec = "assistant=" + kAssistant;

// The target with the assistant bound, the prompt computed by
// forward_hidden in slot 0 (every group's table the slot's).
struct Prefilled {
  std::unique_ptr<Model> model;
  std::vector<int32_t> table;
  std::vector<int32_t> tokens;  // the prompt and the target's greedy next token
  std::vector<float> hidden;    // [prompt, n_embd]
};

Prefilled prefill(const std::vector<int32_t>& prompt) {
  Prefilled p;
  auto files = open_model_files(kTarget);
  EXPECT_TRUE(files.ok()) << files.error().message;
  ModelOptions o;
  o.n_threads = 2;
  o.n_ctx = 64;
  o.max_batch_tokens = 32;
  o.max_batch_seqs = 4;
  o.gemma4_assistant = kAssistant;
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, o);
  EXPECT_TRUE(model.ok()) << model.error().message;
  if (!model.ok()) return p;
  p.model = std::move(model).value();
  Model& m = *p.model;
  const auto n = static_cast<int32_t>(prompt.size());
  p.table = slot_block_table(0, m.n_ctx(), m.kv_block_size());
  Batch b;
  b.group_tables.resize(m.kv_spec().size() - 1);
  b.add_sequence(prompt.data(), n, 0, true, p.table);
  for (auto& t : b.group_tables) t = p.table;
  b.seqs[0].decode_from = n;
  std::vector<float> logits(static_cast<size_t>(m.n_vocab()));
  p.hidden.resize(static_cast<size_t>(n * m.config().n_embd));
  const Status st = m.forward_hidden(b, logits.data(), p.hidden.data());
  EXPECT_TRUE(st.ok()) << st.error().message;
  p.tokens = prompt;
  p.tokens.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  return p;
}

// Steps 1..K of the assistant after the prompt, by hand through
// forward_mtp: each at the prompt's last position, the next step fed the
// previous argmax and post_projection. Every logit within 1e-4 of
// transformers' (f32 on both sides).
TEST(AssistantSpeculator, DraftLogitsMatchTransformers) {
  const auto g = golden();
  const auto prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  Prefilled p = prefill(prompt);
  ASSERT_TRUE(p.model);
  Model& m = *p.model;
  EXPECT_EQ(m.n_mtp_layers(), 4);
  ASSERT_EQ(p.tokens.back(), g["next_token"].get<int32_t>());
  const int64_t E = m.config().n_embd, V = m.n_vocab();
  const auto n = static_cast<int32_t>(prompt.size());
  std::vector<float> hidden(p.hidden.end() - E, p.hidden.end()), next(static_cast<size_t>(E));
  std::vector<float> logits(static_cast<size_t>(V));
  int32_t token = p.tokens.back();
  float worst = 0;
  const auto& want = g["draft_logits"];
  std::string per_step;
  for (size_t j = 0; j < want.size(); ++j) {
    float step_worst = 0;
    Batch b;
    b.group_tables.resize(m.kv_spec().size() - 1);
    b.add_sequence(&token, 1, n - 1, true, p.table);
    for (auto& t : b.group_tables) t = p.table;
    b.seqs[0].decode_from = n;
    const Status st = m.forward_mtp(b, hidden.data(), logits.data(), next.data());
    ASSERT_TRUE(st.ok()) << st.error().message;
    ASSERT_EQ(want[j].size(), static_cast<size_t>(V));
    for (size_t v = 0; v < static_cast<size_t>(V); ++v) {
      const float d = std::fabs(logits[v] - want[j][v].get<float>());
      step_worst = std::max(step_worst, d);
      ASSERT_LE(d, 1e-4f) << "step " << j + 1 << " token " << v;
    }
    worst = std::max(worst, step_worst);
    per_step += " " + std::to_string(step_worst);
    token = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_EQ(token, g["draft_tokens"][j].get<int32_t>()) << "step " << j + 1;
    hidden = next;
  }
  std::printf("assistant draft logits: max |rill - transformers| = %.3g over %zu steps (per step:%s)\n", worst,
              want.size(), per_step.c_str());
}

// The speculator, handed the prompt's rows as the engine would, proposes
// transformers' drafts: k of them for every k, fewer when asked.
TEST(AssistantSpeculator, ProposesTransformersDrafts) {
  const auto g = golden();
  const auto prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  const auto chain = g["draft_tokens"].get<std::vector<int32_t>>();
  Prefilled p = prefill(prompt);
  ASSERT_TRUE(p.model);
  const auto n = static_cast<int32_t>(prompt.size());
  const int32_t own = (n + p.model->kv_block_size() - 1) / p.model->kv_block_size();
  AssistantSpeculator spec(*p.model);
  EXPECT_FALSE(spec.chain_writes_kv());
  for (int32_t k = 1; k <= static_cast<int32_t>(chain.size()); ++k) {
    // Only the last row matters; the engine hands every kept row.
    const HiddenRows rows{7,       p.tokens, 0, n,   p.hidden.data(),
                          p.table, n,        k, own, std::span<const int32_t>(p.table).first(static_cast<size_t>(own))};
    spec.observe(std::span<const HiddenRows>(&rows, 1));
    std::vector<int32_t> drafts;
    spec.propose(7, p.tokens, k, drafts);
    EXPECT_EQ(drafts, std::vector<int32_t>(chain.begin(), chain.begin() + k)) << "k = " << k;
    drafts.clear();
    spec.propose(7, p.tokens, 1, drafts);
    EXPECT_EQ(drafts, std::vector<int32_t>(chain.begin(), chain.begin() + 1)) << "k = " << k;
  }
  std::vector<int32_t> drafts;  // tokens that moved on get no stale drafts
  std::vector<int32_t> moved = p.tokens;
  moved.push_back(chain[0]);
  spec.propose(7, moved, 4, drafts);
  EXPECT_TRUE(drafts.empty());
}

// Greedy output with the assistant is the output without it, and
// transformers' (plain and assisted, which the golden holds equal); batched
// with requests that opt out, every row is the same as alone.
TEST(AssistantSpeculator, GreedyOutputIsTheSameWithAndWithout) {
  const auto g = golden();
  auto on = Engine::load(kTarget, options(kSpec));
  ASSERT_TRUE(on.ok()) << on.error().message;
  auto off = Engine::load(kTarget, options("off"));
  ASSERT_TRUE(off.ok()) << off.error().message;
  EXPECT_EQ((*on)->stats().speculator, "assistant");
  const auto prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  const auto want = g["greedy"].get<std::vector<int32_t>>();
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const auto got = test::generate_all(**on, {prompt}, greedy, false, 1, static_cast<int>(want.size()));
  EXPECT_EQ(got[0], want);
  EXPECT_EQ(got[0], g["assisted"].get<std::vector<int32_t>>());

  const auto prompts = test::prompts_from(prompt);
  const auto alone = test::generate_all(**off, prompts, greedy, false, 1, 20);
  EXPECT_EQ(test::generate_all(**on, prompts, greedy, false, 2, 20), alone);
  // Speculating and opted-out rows in the same steps.
  std::vector<std::vector<int32_t>> mixed(prompts.size());
  std::vector<RequestHandle> handles;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.prompt = prompts[i];
    r.max_tokens = 20;
    r.ignore_eos = true;
    r.sampling = greedy;
    r.cache_namespace = 3;
    r.speculative = i % 2 == 0;
    auto h = (*on)->submit(std::move(r));
    ASSERT_TRUE(h.ok()) << h.error().message;
    handles.push_back(std::move(h).value());
  }
  Usage usage[6];
  for (size_t i = 0; i < handles.size(); ++i) {
    GenerationEvent ev;
    while (handles[i].next(ev)) {
      mixed[i].insert(mixed[i].end(), ev.token_ids.begin(), ev.token_ids.end());
      usage[i] = ev.usage;
    }
  }
  EXPECT_EQ(mixed, alone);
  for (size_t i = 0; i < handles.size(); ++i) {
    if (i % 2 == 0) {
      EXPECT_GT(usage[i].draft_tokens, 0) << i;
    } else {
      EXPECT_EQ(usage[i].draft_tokens, 0) << i;
    }
  }
  const EngineStats st = (*on)->stats();
  std::printf("assistant (random weights): %lld drafted, %lld accepted\n", static_cast<long long>(st.spec_draft_tokens),
              static_cast<long long>(st.spec_accepted_tokens));
  EXPECT_EQ(st.integrity_errors, 0) << st.last_integrity_error;
}

// One request on a fresh engine: its usage's drafted and accepted tokens
// are the engine's, and every output token past the first came from a
// decode step or an accepted draft (steps = prefill steps + completion - 1
// - accepted). The first round's drafts are transformers' (spec_tokens 4):
// it accepts their longest prefix that greedy decoding repeats.
TEST(AssistantSpeculator, UsageCountsDraftsAndAcceptance) {
  const auto g = golden();
  auto on = Engine::load(kTarget, options(kSpec));
  ASSERT_TRUE(on.ok()) << on.error().message;
  GenerationRequest r;
  r.prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  r.max_tokens = 16;
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  auto h = (*on)->submit(std::move(r));
  ASSERT_TRUE(h.ok()) << h.error().message;
  GenerationEvent ev;
  Usage usage;
  std::vector<int32_t> out;
  while (h->next(ev)) {
    out.insert(out.end(), ev.token_ids.begin(), ev.token_ids.end());
    usage = ev.usage;
  }
  const auto greedy = g["greedy"].get<std::vector<int32_t>>();
  EXPECT_EQ(out, std::vector<int32_t>(greedy.begin(), greedy.begin() + 16));
  const EngineStats st = (*on)->stats();
  EXPECT_EQ(usage.draft_tokens, st.spec_draft_tokens);
  EXPECT_EQ(usage.accepted_draft_tokens, st.spec_accepted_tokens);
  EXPECT_GE(usage.draft_tokens, 4);
  EXPECT_LE(usage.accepted_draft_tokens, usage.draft_tokens);
  EXPECT_EQ(st.steps, usage.prefill_steps + usage.completion_tokens - 1 - usage.accepted_draft_tokens);
  const auto drafts = g["draft_tokens"].get<std::vector<int32_t>>();
  int32_t first_round = 0;
  while (first_round < 4 && drafts[static_cast<size_t>(first_round)] == greedy[static_cast<size_t>(first_round) + 1])
    ++first_round;
  EXPECT_GE(usage.accepted_draft_tokens, first_round);
}

// A directory holding the assistant's weights and its config.json with
// `edit` applied (the target's files are not touched).
std::string edited_assistant(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("rill-assistant-" + name);
  std::filesystem::create_directories(dir);
  std::ifstream in(kAssistant + "/config.json");
  nlohmann::json c = nlohmann::json::parse(in);
  edit(c);
  std::ofstream(dir / "config.json") << c.dump(2);
  std::filesystem::remove(dir / "model.safetensors");
  std::filesystem::create_symlink(std::filesystem::absolute(kAssistant + "/model.safetensors"),
                                  dir / "model.safetensors");
  return dir.string();
}

std::string load_error(const std::string& target, const std::string& assistant) {
  auto e = Engine::load(target, options("assistant=" + assistant));
  return e.ok() ? std::string("(loaded)") : e.error().message;
}

TEST(AssistantSpeculator, BadConfigsAreRefusedNamingTheField) {
  const struct {
    const char* name;
    std::function<void(nlohmann::json&)> edit;
    const char* field;
  } cases[] = {
      {"type", [](nlohmann::json& c) { c["model_type"] = "gemma4"; }, "gemma4_assistant"},
      {"type-number", [](nlohmann::json& c) { c["model_type"] = 5; }, "gemma4_assistant"},
      {"ple", [](nlohmann::json& c) { c["text_config"]["hidden_size_per_layer_input"] = 8; },
       "hidden_size_per_layer_input"},
      {"moe", [](nlohmann::json& c) { c["text_config"]["enable_moe_block"] = true; }, "enable_moe_block"},
      {"shared", [](nlohmann::json& c) { c["text_config"]["num_kv_shared_layers"] = 2; }, "num_kv_shared_layers"},
      {"centroids", [](nlohmann::json& c) { c["num_centroids"] = 7; }, "num_centroids"},
      {"topk", [](nlohmann::json& c) { c["centroid_intermediate_top_k"] = 17; }, "centroid_intermediate_top_k"},
      {"ordered", [](nlohmann::json& c) { c["use_ordered_embeddings"] = "yes"; }, "use_ordered_embeddings"},
      {"backbone", [](nlohmann::json& c) { c["backbone_hidden_size"] = 48; }, "backbone_hidden_size"},
      {"heads", [](nlohmann::json& c) { c["text_config"]["num_key_value_heads"] = 4; }, "KV heads"},
      {"window", [](nlohmann::json& c) { c["text_config"]["sliding_window"] = int64_t{1} << 31; }, "sliding_window"},
  };
  for (const auto& k : cases) {
    const std::string dir = edited_assistant(k.name, k.edit);
    const std::string msg = load_error(kTarget, dir);
    EXPECT_NE(msg.find(k.field), std::string::npos) << k.name << ": " << msg;
    EXPECT_NE(msg.find(dir), std::string::npos) << k.name << ": " << msg;
    std::filesystem::remove_all(dir);
  }
  // Mismatches name both models: the target's hidden size, its vocabulary.
  const std::string backbone = edited_assistant("backbone2", [](nlohmann::json& c) { c["backbone_hidden_size"] = 48; });
  std::string msg = load_error(kTarget, backbone);
  EXPECT_NE(msg.find(kTarget), std::string::npos) << msg;
  std::filesystem::remove_all(backbone);
  const std::string vocab = edited_assistant("vocab", [](nlohmann::json& c) { c["text_config"]["vocab_size"] = 512; });
  msg = load_error(kTarget, vocab);
  EXPECT_NE(msg.find("vocab_size 512"), std::string::npos) << msg;
  EXPECT_NE(msg.find(kTarget), std::string::npos) << msg;
  EXPECT_NE(msg.find(vocab), std::string::npos) << msg;
  std::filesystem::remove_all(vocab);
  EXPECT_NE(load_error(kTarget, kDir + "/missing").find(kDir + "/missing"), std::string::npos);
}

// The speculator flags name the head they drive: `mtp` refuses a model
// whose head is the assistant, `assistant=PATH` one bound from another path.
TEST(AssistantSpeculator, SpecFlagMustNameTheBoundHead) {
  Prefilled p = prefill({2, 7, 11, 5});
  ASSERT_TRUE(p.model);
  SpeculatorTarget t;
  t.model = p.model.get();
  t.model_path = kTarget;
  EXPECT_TRUE(make_speculator("assistant=" + kAssistant, t).ok());
  auto mtp = make_speculator("mtp", t);
  ASSERT_FALSE(mtp.ok());
  EXPECT_NE(mtp.error().message.find("--spec assistant=" + kAssistant), std::string::npos) << mtp.error().message;
  auto other = make_speculator("assistant=/elsewhere", t);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.error().message.find(kAssistant), std::string::npos) << other.error().message;
}

TEST(AssistantSpeculator, MismatchedTargetsAreRefusedNamingBoth) {
  // Another Gemma 4 (hidden size 64, the assistant's backbone 32).
  const std::string gemma4 = test::hf_golden_dir("gemma4");
  if (test::has_hf_golden(gemma4)) {
    const std::string msg = load_error(gemma4, kAssistant);
    EXPECT_NE(msg.find(gemma4), std::string::npos) << msg;
    EXPECT_NE(msg.find(kAssistant), std::string::npos) << msg;
    EXPECT_NE(msg.find("backbone_hidden_size"), std::string::npos) << msg;
  }
  // Not Gemma 4: a Gemma 3 is refused by the Gemma runtime, a Llama by the
  // engine (its family never binds an assistant).
  for (const char* name : {"gemma3", "llama"}) {
    const std::string dir = test::hf_golden_dir(name);
    if (!test::has_hf_golden(dir)) continue;
    const std::string msg = load_error(dir, kAssistant);
    EXPECT_NE(msg.find(dir), std::string::npos) << name << ": " << msg;
    EXPECT_TRUE(msg.find("Gemma 4") != std::string::npos) << name << ": " << msg;
  }
}

}  // namespace
}  // namespace rill
