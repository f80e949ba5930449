// Grammar token masks on real vocabularies: Llama-3 (128k, byte-level BPE),
// Qwen3 (151k) and the default model's (SmolLM2, 49k, from its GGUF), for
// json_object (any JSON value in an object), a large JSON schema (40
// properties: enums, patterns, formats, ranges, nested objects and arrays)
// and a GBNF arithmetic grammar. Each iteration replays a valid text token by
// token (its encoding with the model's tokenizer): a mask per step, then
// the token is accepted. Reported per mask: mean (us_per_mask), p50 and
// p99 over all steps, in thread CPU time (the build machine is shared, so
// wall time would measure the neighbours). "warm": after one untimed
// replay (the steady state of a server serving one grammar); "cold": the
// cache emptied before every mask (a state never seen: a full trie walk).
// The ceiling to compare with: one decode step of the default model on
// the CPU is milliseconds; a mask should be a small fraction of it.
// With RILL_BENCH_DUMP_DIR set, each grammar's GBNF and document are written
// there (<which>.gbnf, <which>.txt) for bench/e2e/llamacpp_grammar_bench.py,
// which times llama.cpp's grammar sampler on the same grammar and text.
#include <benchmark/benchmark.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "loader/gguf.h"
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
  if (name == "smollm2") {  // the default model's own vocabulary
    auto gguf = GgufFile::open(std::string(RILL_BENCH_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf");
    if (!gguf.ok()) return nullptr;
    auto t = Tokenizer::from_gguf(**gguf);
    if (!t.ok()) return nullptr;
    return (cache[name] = std::move(t).value()).get();
  }
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

// A large structured-output schema (a customer record) and an instance in
// the grammar's form (schema order, ", " and ": ").
const char* kLargeSchema = R"({"type": "object", "properties": {
 "id": {"type": "string", "format": "uuid"}, "created": {"type": "string", "format": "date-time"},
 "first_name": {"type": "string", "maxLength": 40}, "last_name": {"type": "string", "maxLength": 40},
 "email": {"type": "string", "format": "email"}, "phone": {"type": "string", "pattern": "^\\+?[0-9]{7,15}$"},
 "age": {"type": "integer", "minimum": 0, "maximum": 150}, "vip": {"type": "boolean"},
 "tier": {"enum": ["free", "basic", "pro", "enterprise"]}, "language": {"enum": ["en", "fr", "de", "es", "zh"]},
 "balance": {"type": "number"}, "credit_limit": {"type": ["integer", "null"], "minimum": 0},
 "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "country": {"type": "string", "pattern": "^[A-Z]{2}$"}},
   "required": ["street", "city", "zip", "country"], "additionalProperties": false},
 "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
 "orders": {"type": "array", "items": {"$ref": "#/$defs/order"}, "maxItems": 20},
 "notes": {"type": ["string", "null"]}, "birthday": {"type": "string", "format": "date"},
 "referrer": {"anyOf": [{"type": "string", "format": "uuid"}, {"type": "null"}]},
 "consent": {"type": "object", "properties": {"email": {"type": "boolean"}, "sms": {"type": "boolean"},
   "updated": {"type": "string", "format": "date"}}, "required": ["email", "sms"], "additionalProperties": false},
 "score": {"type": "integer", "minimum": -100, "maximum": 100}},
 "required": ["id", "created", "first_name", "last_name", "email", "age", "vip", "tier", "language", "balance",
   "address", "tags", "orders", "birthday", "consent", "score"],
 "additionalProperties": false,
 "$defs": {"order": {"type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
   "qty": {"type": "integer", "minimum": 1, "maximum": 999}, "price": {"type": "number", "minimum": 0},
   "status": {"enum": ["pending", "shipped", "delivered", "returned"]}},
   "required": ["sku", "qty", "price", "status"], "additionalProperties": false}}})";
const char* kLargeDoc =
    R"({"id": "123e4567-e89b-12d3-a456-426614174000", "created": "2024-07-26T09:30:00Z", "first_name": "Ada", )"
    R"("last_name": "Lovelace", "email": "ada.lovelace@example.org", "phone": "+441234567890", "age": 36, )"
    R"("vip": true, "tier": "enterprise", "language": "en", "balance": 1234.5, "credit_limit": null, )"
    R"("address": {"street": "12 St James's Square", "city": "London", "zip": "12345", "country": "GB"}, )"
    R"("tags": ["math", "poetry", "engines"], "orders": [{"sku": "ENG-0001", "qty": 2, "price": 99.99, )"
    R"("status": "shipped"}, {"sku": "CAL-1843", "qty": 1, "price": 0, "status": "pending"}], )"
    R"("notes": "Prefers letters.", "birthday": "1815-12-10", "referrer": null, )"
    R"("consent": {"email": true, "sms": false, "updated": "2024-01-31"}, "score": 97})";

std::string grammar_text(const std::string& which) {
  if (which == "json_object") return json_object_gbnf();
  if (which == "large_schema") return json_schema_to_gbnf(nlohmann::ordered_json::parse(kLargeSchema)).value();
  return kArithmetic;
}

std::string document(const std::string& which) {
  if (which == "json_object") return kJsonDoc;
  if (which == "large_schema") return kLargeDoc;
  return kArithmeticDoc;
}

// The schema of bench/e2e/grammar_decode_bench.py (for llama.cpp's decode run).
const char* kDecodeSchema = R"({"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array",
 "items": {"type": "string"}}}, "required": ["name", "tags"], "additionalProperties": false})";

void dump(const std::string& which) {
  const char* dir = std::getenv("RILL_BENCH_DUMP_DIR");
  if (dir == nullptr) return;
  std::ofstream(std::string(dir) + "/decode_schema.gbnf")
      << json_schema_to_gbnf(nlohmann::ordered_json::parse(kDecodeSchema)).value();
  std::ofstream(std::string(dir) + "/" + which + ".gbnf") << grammar_text(which);
  std::ofstream(std::string(dir) + "/" + which + ".txt") << document(which);
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
  dump(which);
  const std::string doc = document(which);
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
  for (const char* tok : {"llama3", "qwen3", "smollm2"}) {
    for (const char* which : {"json_object", "large_schema", "arithmetic"}) {
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
