// Grammar token masks on real vocabularies: Llama-3 (128k, byte-level BPE)
// and Qwen3 (151k), for json_object (any JSON value in an object) and a
// GBNF arithmetic grammar. Each iteration replays a valid text token by
// token (its encoding with the model's tokenizer): a mask per step, then
// the token is accepted. Reported per mask: mean (us_per_mask), p50 and
// p99 over all steps, in thread CPU time (the build machine is shared, so
// wall time would measure the neighbours). "warm": after one untimed
// replay (the steady state of a server serving one grammar); "cold": the
// cache emptied before every mask (a state never seen: a full trie walk).
// The ceiling to compare with: one decode step of the default model on
// the CPU is milliseconds; a mask should be a small fraction of it.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "text/grammar/grammar_matcher.h"
#include "text/grammar/json_schema_grammar.h"
#include "text/grammar/token_mask_cache.h"
#include "text/tokenizer.h"

namespace {

using namespace rill;
using namespace rill::grammar;

const Tokenizer* tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  if (auto it = cache.find(name); it != cache.end()) return it->second.get();
  const std::filesystem::path src = std::filesystem::path(RILL_BENCH_SHARED_DIR) / "tokenizers" / name;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("rill_bench_tok_" + name);
  std::filesystem::create_directories(dir);
  const std::string cmd = "gunzip -c '" + (src / "tokenizer.json.gz").string() + "' > '" +
                          (dir / "tokenizer.json").string() + "' && cp '" + (src / "tokenizer_config.json").string() +
                          "' '" + dir.string() + "/'";
  if (std::system(cmd.c_str()) != 0) return nullptr;
  auto t = Tokenizer::from_tokenizer_json((dir / "tokenizer.json").string());
  if (!t.ok()) return nullptr;
  return (cache[name] = std::move(t).value()).get();
}

const char* kArithmetic = R"g(root ::= expr
expr ::= term (ws ("+" | "-") ws term)*
term ::= factor (ws ("*" | "/") ws factor)*
factor ::= number | "(" ws expr ws ")"
number ::= [0-9]+ ("." [0-9]+)?
ws ::= " "?
)g";

const char* kJsonDoc =
    R"({"id": 1234, "name": "Ada Lovelace", "email": "ada@example.com", "tags": ["math", "poetry", "engines"],
"address": {"street": "12 St James's Square", "city": "London", "zip": "SW1Y 4JH"}, "active": true,
"scores": [98.5, 87.25, -3e2], "notes": null, "nested": {"a": {"b": {"c": [1, [2, [3, {"d": "deep"}]]]}}}})";
const char* kArithmeticDoc = "(12.5 + 3) * 4 - (7 / (2 + 0.25)) * 19 + 1000 - 3 * (4 + (5 * (6 - 7)))";

std::string grammar_text(const std::string& which) {
  if (which == "json_object") return json_object_gbnf();
  return kArithmetic;
}

void BM_Mask(benchmark::State& state, const std::string& tok_name, const std::string& which, bool cold) {
  const Tokenizer* tok = tokenizer(tok_name);
  if (tok == nullptr) {
    state.SkipWithError("shared tokenizer missing");
    return;
  }
  auto g = CompiledGrammar::from_gbnf(grammar_text(which));
  if (!g.ok()) {
    state.SkipWithError(g.error().message.c_str());
    return;
  }
  const std::string doc = which == "json_object" ? kJsonDoc : kArithmeticDoc;
  const std::vector<int32_t> ids = tok->encode(doc, false, false);
  auto cache = std::make_shared<TokenMaskCache>(*g, TokenVocabulary::from_tokenizer(*tok));
  std::vector<uint64_t> mask(cache->vocab().mask_words());
  std::vector<double> times_us;
  if (!cold) {  // prime the cache
    GrammarMatcher m(cache);
    for (int32_t id : ids) {
      m.fill_mask(mask);
      m.accept_token(id);
    }
  }
  auto cpu_us = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
  };
  for (auto _ : state) {
    GrammarMatcher m(cache);
    for (int32_t id : ids) {
      if (cold) cache->clear();
      const double t0 = cpu_us();
      m.fill_mask(mask);
      times_us.push_back(cpu_us() - t0);
      if (!((mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1) || !m.accept_token(id)) {
        state.SkipWithError("the document's token is not in the mask");
        return;
      }
    }
  }
  std::sort(times_us.begin(), times_us.end());
  double sum = 0;
  for (double t : times_us) sum += t;
  state.counters["us_per_mask"] = sum / static_cast<double>(times_us.size());
  state.counters["p50_us"] = times_us[times_us.size() / 2];
  state.counters["p99_us"] = times_us[times_us.size() * 99 / 100];
  state.counters["masks"] = static_cast<double>(times_us.size());
  state.counters["n_vocab"] = static_cast<double>(tok->n_vocab());
  state.counters["cache_entries"] = static_cast<double>(cache->stats().entries);
}

void register_all() {
  for (const char* tok : {"llama3", "qwen3"}) {
    for (const char* which : {"json_object", "arithmetic"}) {
      for (bool cold : {false, true}) {
        const std::string name = std::string("BM_Mask/") + tok + "/" + which + (cold ? "/cold" : "/warm");
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { BM_Mask(s, tok, which, cold); })
            ->Unit(benchmark::kMillisecond)
            ->Iterations(cold ? 1 : 5);
      }
    }
  }
}

const bool kRegistered = (register_all(), true);

}  // namespace
