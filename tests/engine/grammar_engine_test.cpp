// Constrained decoding in the engine: a FakeModel whose logits are
// pseudo-random over SmolLM2's real vocabulary, so every valid output comes
// from the grammar's masks, not from the model. Checks that outputs are in
// the grammar's language (greedy and seeded), EOS only where the grammar may
// end, the request ends when nothing more can follow, constrained and
// unconstrained requests share steps without changing the unconstrained
// tokens (also when the unconstrained ones would otherwise be drawn on the
// device), constrained rows drawn where the model runs (forward_greedy /
// forward_sample with the step's token masks) give the host's tokens, ends
// and errors, and the errors name the field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../text/tokenizer_test_util.h"
#include "fake_model.h"
#include "rill/engine.h"
#include "text/grammar/grammar_cache.h"
#include "text/grammar/grammar_matcher.h"
#include "text/grammar/json_schema_grammar.h"
#include "text/grammar/token_vocabulary.h"

namespace rill {
namespace {

using testing::FakeModel;

std::shared_ptr<const Tokenizer> smollm2() {
  const Tokenizer* tok = testing::load_tokenizer("smollm2");
  if (tok == nullptr) return nullptr;
  return std::shared_ptr<const Tokenizer>(tok, [](const Tokenizer*) {});  // the loader's cache owns it
}

struct Fixture {
  std::shared_ptr<const Tokenizer> tok;
  FakeModel* model = nullptr;
  std::unique_ptr<Engine> engine;
};

Fixture make(bool device = false) {
  Fixture f;
  f.tok = smollm2();
  if (!f.tok) return f;
  auto model = std::make_unique<FakeModel>(FakeModel::Options{.n_vocab = f.tok->n_vocab(),
                                                              .n_ctx = 512,
                                                              .block_size = 16,
                                                              .n_blocks = 256,
                                                              .max_batch_tokens = 256,
                                                              .max_batch_seqs = 16,
                                                              .device_greedy = device,
                                                              .device_sample = device});
  f.model = model.get();
  EngineOptions eo;
  eo.check_integrity = true;
  auto e = Engine::create(std::move(model), f.tok, eo);
  EXPECT_TRUE(e.ok()) << e.error().message;
  if (e.ok()) f.engine = std::move(e).value();
  return f;
}

std::shared_ptr<const grammar::CompiledGrammar> compile(const std::string& gbnf) {
  auto g = grammar::GrammarCache::shared().get(gbnf);
  EXPECT_TRUE(g.ok()) << g.error().message;
  return g.ok() ? *g : nullptr;
}

struct Output {
  std::vector<int32_t> ids;
  std::string text;
  GenerationEvent last;
};

Output run(Engine& e, GenerationRequest r) {
  Output o;
  auto h = e.submit(std::move(r));
  EXPECT_TRUE(h.ok()) << h.error().message;
  if (!h.ok()) return o;
  GenerationEvent ev;
  while (h->next(ev)) {
    o.ids.insert(o.ids.end(), ev.token_ids.begin(), ev.token_ids.end());
    o.text += ev.text;
    if (ev.finished) o.last = ev;
  }
  return o;
}

GenerationRequest request(const Tokenizer& tok, int32_t max_tokens, float temperature, uint64_t seed) {
  GenerationRequest r;
  r.prompt = tok.encode("Answer:", false, false);
  r.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  return r;
}

// Every token is one a fresh matcher accepts in turn.
void expect_tokens_in_grammar(const Fixture& f, const std::shared_ptr<const grammar::CompiledGrammar>& g,
                              const std::vector<int32_t>& ids) {
  auto vocab = grammar::TokenVocabulary::from_tokenizer(*f.tok, f.engine->eos_ids());
  grammar::GrammarMatcher m(std::make_shared<grammar::TokenMaskCache>(g, vocab));
  for (size_t i = 0; i < ids.size(); ++i) ASSERT_TRUE(m.accept_token(ids[i])) << "token " << i << " = " << ids[i];
}

const char* kSchema = R"({"type": "object", "properties": {
  "count": {"type": "integer", "minimum": 0, "maximum": 99},
  "color": {"enum": ["red", "green", "blue"]},
  "ok": {"type": "boolean"}}, "required": ["count", "color", "ok"], "additionalProperties": false})";

TEST(GrammarEngine, GreedyAndSeededOutputsMatchTheSchema) {
  Fixture f = make();
  if (!f.tok) GTEST_SKIP() << "SmolLM2 model file missing";
  auto gbnf = grammar::json_schema_to_gbnf(nlohmann::ordered_json::parse(kSchema));
  ASSERT_TRUE(gbnf.ok()) << gbnf.error().message;
  auto g = compile(*gbnf);
  for (float temperature : {0.0f, 1.0f}) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      GenerationRequest r = request(*f.tok, 200, temperature, seed);
      r.grammar = g;
      Output o = run(*f.engine, std::move(r));
      SCOPED_TRACE(o.text);
      ASSERT_EQ(o.last.finish_reason, FinishReason::kStop) << o.last.error;
      auto j = nlohmann::json::parse(o.text);
      ASSERT_TRUE(j.is_object());
      EXPECT_EQ(j.size(), 3u);
      EXPECT_TRUE(j["count"].is_number_integer() && j["count"] >= 0 && j["count"] <= 99);
      EXPECT_TRUE(j["color"] == "red" || j["color"] == "green" || j["color"] == "blue");
      EXPECT_TRUE(j["ok"].is_boolean());
      expect_tokens_in_grammar(f, g, o.ids);
      if (temperature == 0.0f) break;  // greedy: one run is the run
    }
  }
}

TEST(GrammarEngine, EndsWhenNothingCanFollowWithoutAStopToken) {
  Fixture f = make();
  if (!f.tok) GTEST_SKIP() << "SmolLM2 model file missing";
  auto choice = grammar::choice_gbnf({"alpha", "beta", "gamma delta"});
  ASSERT_TRUE(choice.ok());
  GenerationRequest r = request(*f.tok, 50, 0.7f, 3);
  r.grammar = compile(*choice);
  Output o = run(*f.engine, std::move(r));
  EXPECT_TRUE(o.text == "alpha" || o.text == "beta" || o.text == "gamma delta") << o.text;
  EXPECT_EQ(o.last.finish_reason, FinishReason::kStop);
  EXPECT_FALSE(o.last.stop_token.has_value());
}

TEST(GrammarEngine, EosOnlyWhereTheGrammarMayEnd) {
  Fixture f = make();
  if (!f.tok) GTEST_SKIP() << "SmolLM2 model file missing";
  const int32_t eos = f.tok->eos_ids().front();
  for (bool ignore_eos : {false, true}) {
    // A huge bias on EOS: masked out until the grammar may end, then taken
    // (and it ends the request even with ignore_eos: the grammar is done).
    GenerationRequest r = request(*f.tok, 60, 0.0f, 1);
    r.grammar = compile(R"(root ::= "x" [a-z]{3,} )");
    r.sampling.logit_bias = {{eos, 1000.0f}};
    r.ignore_eos = ignore_eos;
    Output o = run(*f.engine, std::move(r));
    ASSERT_EQ(o.last.finish_reason, FinishReason::kStop) << o.last.error;
    ASSERT_TRUE(o.last.stop_token.has_value());
    EXPECT_EQ(*o.last.stop_token, eos);
    EXPECT_EQ(o.ids.back(), eos);
    ASSERT_GE(o.text.size(), 4u) << o.text;
    EXPECT_EQ(o.text[0], 'x');
    for (char c : o.text.substr(1)) EXPECT_TRUE(c >= 'a' && c <= 'z') << o.text;
  }
}

TEST(GrammarEngine, ConstrainedAndUnconstrainedShareStepsWithoutChangingTheUnconstrainedTokens) {
  for (bool device : {false, true}) {
    SCOPED_TRACE(device ? "device sampling" : "host sampling");
    // Alone: the unconstrained requests' tokens (on the device path when
    // offered); then batched with constrained ones (the step samples on the
    // host): the same tokens.
    std::vector<std::vector<int32_t>> alone;
    {
      Fixture f = make(device);
      if (!f.tok) GTEST_SKIP() << "SmolLM2 model file missing";
      for (uint64_t seed : {11u, 12u})
        alone.push_back(run(*f.engine, request(*f.tok, 24, seed == 11 ? 0.0f : 0.9f, seed)).ids);
      if (device) {
        EXPECT_EQ(f.model->n_logit_calls(), 0);
      }
    }
    Fixture f = make(device);
    auto g = compile(grammar::json_object_gbnf());
    std::vector<RequestHandle> handles;
    for (int i = 0; i < 4; ++i) {
      GenerationRequest r =
          i < 2 ? request(*f.tok, 24, i == 0 ? 0.0f : 0.9f, 11 + i) : request(*f.tok, 40, 0.8f, 20 + i);
      if (i >= 2) r.grammar = g;
      auto h = f.engine->submit(std::move(r));
      ASSERT_TRUE(h.ok());
      handles.push_back(std::move(h).value());
    }
    for (int i = 0; i < 4; ++i) {
      std::vector<int32_t> ids;
      std::string text;
      GenerationEvent ev, last;
      while (handles[i].next(ev)) {
        ids.insert(ids.end(), ev.token_ids.begin(), ev.token_ids.end());
        text += ev.text;
        if (ev.finished) last = ev;
      }
      if (i < 2) {
        EXPECT_EQ(ids, alone[static_cast<size_t>(i)]) << "request " << i;
      } else {
        EXPECT_NE(last.finish_reason, FinishReason::kError) << last.error;
        EXPECT_EQ(text.substr(0, 1), "{") << text;
        if (last.finish_reason == FinishReason::kStop) {
          EXPECT_TRUE(nlohmann::json::parse(text).is_object()) << text;
        }
        expect_tokens_in_grammar(f, g, ids);
      }
    }
    const auto seqs = f.model->step_seqs();
    EXPECT_GT(*std::max_element(seqs.begin(), seqs.end()), 1) << "requests were never batched";
  }
}

TEST(GrammarEngine, SharesOneMaskCachePerGrammarAcrossRequests) {
  // Indirectly: the same grammar object twice gives the same tokens (the
  // cache is warm the second time; a wrong cached entry would show).
  Fixture f = make();
  if (!f.tok) GTEST_SKIP() << "SmolLM2 model file missing";
  auto g = compile(grammar::json_object_gbnf());
  EXPECT_EQ(g, compile(grammar::json_object_gbnf()));  // one object per grammar text
  GenerationRequest a = request(*f.tok, 30, 0.9f, 7), b = request(*f.tok, 30, 0.9f, 7);
  a.grammar = b.grammar = g;
  EXPECT_EQ(run(*f.engine, std::move(a)).ids, run(*f.engine, std::move(b)).ids);
}

TEST(GrammarEngine, RefusedWithoutATokenizer) {
  auto model = std::make_unique<FakeModel>(FakeModel::Options{});
  auto e = Engine::create(std::move(model), nullptr, EngineOptions{});
  ASSERT_TRUE(e.ok());
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  r.max_tokens = 8;
  r.grammar = compile(R"(root ::= "a")");
  auto id = (*e)->submit(std::move(r), [](GenerationEvent&&) {});
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.error().message.rfind("grammar:", 0), 0u) << id.error().message;
}

// Thinking (GenerationRequest::Thinking) over two ordinary ids of the
// vocabulary standing for <think> and </think>; logit biases make the model
// open the block first and never close it by itself, so every close below is
// the engine's.
constexpr int32_t kOpen = 100, kClose = 101;

GenerationRequest thinking_request(const Tokenizer& tok, int32_t budget, bool starts_inside) {
  GenerationRequest r = request(tok, 40, 0.9f, 5);
  r.thinking = {kOpen, kClose, starts_inside, budget};
  r.sampling.logit_bias = {{kOpen, 1000.0f}, {kClose, -1000.0f}};
  r.ignore_eos = true;
  return r;
}

TEST(GrammarEngine, ASpentThinkingBudgetForcesTheClose) {
  Fixture f = make();
  if (!f.tok) GTEST_SKIP() << "SmolLM2 model file missing";
  for (int32_t budget : {0, 1, 7}) {
    SCOPED_TRACE(budget);
    Output o = run(*f.engine, thinking_request(*f.tok, budget, false));
    ASSERT_GE(o.ids.size(), static_cast<size_t>(budget) + 3);
    EXPECT_EQ(o.ids[0], kOpen);
    for (int32_t i = 1; i <= budget; ++i) EXPECT_NE(o.ids[static_cast<size_t>(i)], kClose);
    EXPECT_EQ(o.ids[static_cast<size_t>(budget) + 1], kClose);
    // After the block the model writes on (the open token again is just a token).
    EXPECT_EQ(std::count(o.ids.begin(), o.ids.end(), kClose), 1);
    EXPECT_EQ(o.last.finish_reason, FinishReason::kLength);
    EXPECT_EQ(o.last.usage.reasoning_tokens, budget + 2);  // open, the budget, close
  }
  // The prompt opened the block: the budget counts from the first token.
  Output o = run(*f.engine, thinking_request(*f.tok, 3, true));
  ASSERT_GE(o.ids.size(), 4u);
  EXPECT_EQ(o.ids[3], kClose);
  EXPECT_EQ(std::count(o.ids.begin(), o.ids.begin() + 3, kClose), 0);
  EXPECT_EQ(o.last.usage.reasoning_tokens, 4);
  // Unbounded: the model never closes (its bias), nothing forces it.
  Output free = run(*f.engine, thinking_request(*f.tok, -1, false));
  EXPECT_EQ(std::count(free.ids.begin(), free.ids.end(), kClose), 0);
}

TEST(GrammarEngine, TheGrammarConstrainsTheAnswerAfterTheThinkingBlock) {
  Fixture f = make();
  if (!f.tok) GTEST_SKIP() << "SmolLM2 model file missing";
  auto choice = grammar::choice_gbnf({"alpha", "beta", "gamma delta"});
  ASSERT_TRUE(choice.ok());
  for (bool opens : {true, false}) {
    SCOPED_TRACE(opens ? "the model thinks first" : "the model answers at once");
    GenerationRequest r = thinking_request(*f.tok, 6, false);
    if (!opens) r.sampling.logit_bias = {{kOpen, -1000.0f}, {kClose, -1000.0f}};
    r.ignore_eos = false;
    r.grammar = compile(*choice);
    Output o = run(*f.engine, std::move(r));
    ASSERT_EQ(o.last.finish_reason, FinishReason::kStop) << o.last.error;
    size_t answer = 0;
    if (opens) {
      ASSERT_GE(o.ids.size(), 8u);
      EXPECT_EQ(o.ids[0], kOpen);
      EXPECT_EQ(o.ids[7], kClose);  // six free tokens, then the forced close
      answer = 8;
    }
    const std::vector<int32_t> rest(o.ids.begin() + static_cast<std::ptrdiff_t>(answer), o.ids.end());
    const std::string text = f.tok->decode(rest, /*skip_special=*/true);
    EXPECT_TRUE(text == "alpha" || text == "beta" || text == "gamma delta") << text;
  }
}

TEST(GrammarEngine, ThinkingIdsAreChecked) {
  Fixture f = make();
  if (!f.tok) GTEST_SKIP() << "SmolLM2 model file missing";
  for (GenerationRequest::Thinking t :
       {GenerationRequest::Thinking{5, 5, false, -1},
        GenerationRequest::Thinking{5, static_cast<int32_t>(f.tok->n_vocab()), false, -1},
        GenerationRequest::Thinking{-1, -1, false, 10}, GenerationRequest::Thinking{5, 6, false, -2}}) {
    GenerationRequest r = request(*f.tok, 4, 0.0f, 1);
    r.thinking = t;
    auto h = f.engine->submit(std::move(r));
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.error().message.rfind("thinking:", 0), 0u) << h.error().message;
  }
}

struct Finished {
  std::vector<int32_t> ids;
  FinishReason reason = FinishReason::kError;
  std::string error;
  bool operator==(const Finished&) const = default;
};

// Submits every request at once (so they share steps) and waits for all.
std::vector<Finished> run_together(Engine& e, const std::vector<GenerationRequest>& requests) {
  std::vector<RequestHandle> handles;
  for (const GenerationRequest& r : requests) {
    auto h = e.submit(r);
    EXPECT_TRUE(h.ok()) << h.error().message;
    if (h.ok()) handles.push_back(std::move(h).value());
  }
  std::vector<Finished> out;
  for (RequestHandle& h : handles) {
    Finished f;
    GenerationEvent ev;
    while (h.next(ev)) {
      f.ids.insert(f.ids.end(), ev.token_ids.begin(), ev.token_ids.end());
      if (ev.finished) f.reason = ev.finish_reason, f.error = ev.error;
    }
    out.push_back(std::move(f));
  }
  return out;
}

TEST(GrammarEngine, MaskedDrawsWhereTheModelRunsGiveTheHostsTokens) {
  // The same requests on a model that samples only on the host and on one
  // that draws where it runs (the FakeModel's device draws are the host
  // reference under the mask it is handed): every request gets the same
  // tokens and end, and the device run takes no logits at all, so the
  // engine's per-step mask table (which row has which mask) is right.
  auto gbnf = grammar::json_schema_to_gbnf(nlohmann::ordered_json::parse(kSchema));
  ASSERT_TRUE(gbnf.ok()) << gbnf.error().message;
  auto choice = grammar::choice_gbnf({"alpha", "beta", "gamma delta"});
  ASSERT_TRUE(choice.ok());
  const auto schema = compile(*gbnf), object = compile(grammar::json_object_gbnf()), words = compile(*choice);
  Fixture probe = make();
  if (!probe.tok) GTEST_SKIP() << "SmolLM2 model file missing";
  const Tokenizer& tok = *probe.tok;
  std::vector<GenerationRequest> sampled;  // constrained and not, seeded and greedy: forward_sample steps
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    GenerationRequest r = request(tok, 60, 1.0f, seed);
    r.grammar = schema;
    r.sampling.top_k = seed == 2 ? 40 : 0;
    r.sampling.top_p = seed == 3 ? 0.9f : 1.0f;
    sampled.push_back(std::move(r));
  }
  for (float temperature : {0.0f, 0.8f}) {
    GenerationRequest r = request(tok, 40, temperature, 9);
    r.grammar = object;
    sampled.push_back(std::move(r));
  }
  sampled.push_back(request(tok, 24, 0.9f, 12));  // unconstrained
  GenerationRequest think = request(tok, 30, 0.7f, 4);
  think.grammar = words;
  think.thinking = {kOpen, kClose, false, -1};  // the first token may open the block instead
  sampled.push_back(std::move(think));
  std::vector<GenerationRequest> greedy;  // every row plain greedy: forward_greedy steps
  for (const auto& g : {schema, object, words}) {
    GenerationRequest r = request(tok, 60, 0.0f, 1);
    r.grammar = g;
    greedy.push_back(std::move(r));
  }
  greedy.push_back(request(tok, 20, 0.0f, 1));

  for (const auto* set : {&sampled, &greedy}) {
    SCOPED_TRACE(set == &sampled ? "forward_sample" : "forward_greedy");
    Fixture host = make(false), device = make(true);
    const std::vector<Finished> want = run_together(*host.engine, *set);
    const std::vector<Finished> got = run_together(*device.engine, *set);
    ASSERT_EQ(got.size(), set->size());
    for (size_t i = 0; i < set->size(); ++i) {
      EXPECT_EQ(got[i], want[i]) << "request " << i << ": " << got[i].error;
      EXPECT_NE(want[i].reason, FinishReason::kError) << want[i].error;
      if ((*set)[i].grammar) expect_tokens_in_grammar(host, (*set)[i].grammar, want[i].ids);
    }
    EXPECT_EQ(device.model->n_logit_calls(), 0) << "a step took its logits to the host";
    EXPECT_GT(device.model->n_masked_steps(), 0);
    EXPECT_EQ(host.model->n_masked_steps(), 0);
    EXPECT_GT(set == &sampled ? device.model->n_sample_calls() : device.model->n_greedy_calls(), 0);
    const auto seqs = device.model->step_seqs();
    EXPECT_GT(*std::max_element(seqs.begin(), seqs.end()), 1) << "requests were never batched";
  }
}

TEST(GrammarEngine, AMaskThatAllowsNothingEndsTheRequestAsOnTheHost) {
  // After "a" the grammar wants a special token the vocabulary lacks: the
  // mask allows nothing. Drawn where the model runs, the first token is
  // masked there; the dead end sends its step to the host, which ends the
  // request with the host's error.
  Fixture host = make(false), device = make(true);
  if (!host.tok) GTEST_SKIP() << "SmolLM2 model file missing";
  GenerationRequest r = request(*host.tok, 10, 0.0f, 1);
  r.grammar = compile(R"(root ::= "a" <|no_such_token|>)");
  const std::vector<Finished> want = run_together(*host.engine, {r});
  const std::vector<Finished> got = run_together(*device.engine, {r});
  ASSERT_EQ(want.size(), 1u);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(want[0].ids, host.tok->encode("a", false, false));
  EXPECT_EQ(want[0].reason, FinishReason::kError);
  EXPECT_EQ(want[0].error, "grammar: no token of the vocabulary can continue the output here");
  EXPECT_EQ(got[0], want[0]);
  EXPECT_EQ(device.model->n_masked_steps(), 1);  // the first token's
  EXPECT_EQ(device.model->n_logit_calls(), 1);   // the dead end's step
}

}  // namespace
}  // namespace rill
