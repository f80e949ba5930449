// bench_kv_quality: what each KV cache type (model/kv_types.h) costs in
// accuracy on a real text. The model scores the text's first n_tokens
// tokens once with f16 KV (the reference) and once per type; per type it
// prints the perplexity of the text, the mean KL divergence
// KL(p_f16 || p_type) of the next-token distributions over every position,
// the share of positions whose argmax differs, the KV bytes per token and
// the tokens per GiB of KV against f16's; KL and argmax also against f32 KV.
//
//   bench_kv_quality [--chunk N] [--kv-calibration FILE] MODEL TEXT_FILE N_TOKENS [TYPE...]
//   (default: every type; --kv-calibration: q4a's calibration text, engine/kv_calibration.h)
//
// --chunk: tokens per forward step (default 512). Every KV type's result
// depends on it only through f32 rounding (chunked prefill is exact up to
// summation order; k4c's queries read their own block from its q8_0 rows
// however the text is cut), so rerunning with another chunk measures the noise floor.
//
// TYPE: a KV type for both sides (or a pair: k4c, k4a), K/V (q8_0/q4_0h) or @FILE (a --kv-config
// file). On a model with quantized weights every matmul quantizes its
// activations to 8 bits (Q8_0/Q8_1), which turns any small change of the
// KV into a larger one (an activation near a rounding boundary flips): see
// docs/perf.md, and tools/dequantize_gguf.py for an f32 copy of the weights.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "engine/kv_calibration.h"
#include "engine/sequence_runner.h"
#include "loader/model_files.h"
#include "model/registry.h"
#include "text/tokenizer.h"

namespace rill {
namespace {

struct Scored {
  std::vector<float> logp;  // log-softmax rows [n, V]
  size_t kv_bytes_per_token = 0;
  double seconds = 0;
};

// A type argument: T (both sides), K/V (e.g. q8_0/q4_0h) or @FILE (a
// --kv-config file over f16).
Result<KvTypeOptions> parse_types(const std::string& arg) {
  KvTypeOptions t;
  if (arg.starts_with("@")) {
    RILL_TRY(load_kv_config(arg.substr(1), t));
    return t;
  }
  const size_t slash = arg.find('/');
  if (slash == std::string::npos) {
    if (const std::optional<KvLayerTypes> pair = parse_kv_pair(arg)) {
      t.k = pair->k;
      t.v = pair->v;
    }
  } else {
    t.k = parse_kv_type(arg.substr(0, slash));
    t.v = parse_kv_type(arg.substr(slash + 1));
  }
  if (!t.k || !t.v) return Error{"unknown KV type " + arg + " (one of " + kv_type_names() + ", K/V or @FILE)"};
  return t;
}

Result<Scored> score(std::shared_ptr<const ModelFiles> files, const Tokenizer& tok, const std::vector<int32_t>& ids,
                     const std::string& kv, int64_t chunk, const std::string& calibration) {
  ModelOptions o;
  o.n_ctx = static_cast<int64_t>(ids.size());
  o.max_batch_tokens = chunk;
  RILL_ASSIGN_OR_RETURN(o.kv_types, parse_types(kv));
  o.kv_types.calibration_path = calibration;
  RILL_TRY(add_kv_calibration(&tok, o.kv_types));
  RILL_ASSIGN_OR_RETURN(auto model, create_model(builtin_registry(), infer_profile(*files), files, o));
  SequenceRunner runner(*model);
  Scored s;
  s.kv_bytes_per_token = model->kv_bytes_per_token();
  const auto t0 = std::chrono::steady_clock::now();
  RILL_ASSIGN_OR_RETURN(s.logp, runner.score(ids));
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto V = static_cast<size_t>(model->n_vocab());
  for (size_t r = 0; r < ids.size(); ++r) {
    float* x = s.logp.data() + r * V;
    const float max = *std::max_element(x, x + V);
    double sum = 0;
    for (size_t i = 0; i < V; ++i) sum += std::exp(double{x[i]} - max);
    const auto lse = static_cast<float>(max + std::log(sum));
    for (size_t i = 0; i < V; ++i) x[i] -= lse;
  }
  return s;
}

int run(int argc, char** argv) {
  int64_t chunk = 512;
  std::string calibration;  // q4a's (--kv-calibration FILE); empty: the built-in text
  while (argc >= 3 && (std::string_view(argv[1]) == "--chunk" || std::string_view(argv[1]) == "--kv-calibration")) {
    if (std::string_view(argv[1]) == "--kv-calibration") {
      calibration = argv[2];
    } else {
      char* end = nullptr;
      chunk = std::strtoll(argv[2], &end, 10);
      if (*end != '\0' || chunk < 1) {
        std::fprintf(stderr, "--chunk: '%s' is not a positive number of tokens\n", argv[2]);
        return 2;
      }
    }
    argc -= 2;
    argv += 2;
  }
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: bench_kv_quality [--chunk N] [--kv-calibration FILE] MODEL TEXT_FILE N_TOKENS [TYPE...]\n");
    return 2;
  }
  auto files = open_model_files(argv[1]);
  if (!files.ok() || !(*files)->gguf) {
    std::fprintf(stderr, "%s\n",
                 files.ok() ? "a .gguf model (its tokenizer) is needed" : files.error().message.c_str());
    return 1;
  }
  auto tok = Tokenizer::from_gguf(*(*files)->gguf);
  if (!tok.ok()) return std::fprintf(stderr, "%s\n", tok.error().message.c_str()), 1;
  std::ifstream in(argv[2]);
  std::stringstream text;
  text << in.rdbuf();
  std::vector<int32_t> ids = (*tok)->encode(text.str(), /*add_special=*/true, /*parse_special=*/false);
  const auto n = static_cast<size_t>(std::stoll(argv[3]));
  if (ids.size() < n) {
    std::fprintf(stderr, "%s has %zu tokens, fewer than %zu\n", argv[2], ids.size(), n);
    return 1;
  }
  ids.resize(n);
  std::vector<std::string> types;
  for (int i = 4; i < argc; ++i) types.emplace_back(argv[i]);
  if (types.empty()) types = {"f16", "bf16", "q8_0", "q8_0h", "q5_1", "q5_0", "q4_1", "q4_0", "q4_0h"};
  for (const std::string& t : types) {
    if (auto parsed = parse_types(t); !parsed.ok())
      return std::fprintf(stderr, "%s\n", parsed.error().message.c_str()), 1;
  }
  // Two references: f16 KV (the default, llama.cpp's rounding: the query
  // and the probabilities rounded to f16) and f32 KV (exact arithmetic), so
  // a type's distance from f16 can be told apart from f16's own.
  auto ref = score(*files, **tok, ids, "f16", chunk, calibration);
  if (!ref.ok()) return std::fprintf(stderr, "%s\n", ref.error().message.c_str()), 1;
  auto ref32 = score(*files, **tok, ids, "f32", chunk, calibration);
  if (!ref32.ok()) return std::fprintf(stderr, "%s\n", ref32.error().message.c_str()), 1;
  const size_t V = ref->logp.size() / n;
  std::printf(
      "model %s, text %s, %zu tokens in chunks of %lld; KL(ref || type) per position, mean over %zu positions\n",
      argv[1], argv[2], n, static_cast<long long>(chunk), n - 1);
  std::printf("%-10s %11s %11s %12s %12s %9s %9s %11s %9s %8s\n", "type", "perplexity", "ppl vs f16", "KL vs f16",
              "KL vs f32", "top1!=f16", "top1!=f32", "KV B/token", "tok/GiB x", "score s");
  auto row = [&](const std::string& t, const Scored& s) {
    double nll = 0, nll_ref = 0, kl = 0, kl32 = 0;
    size_t flips = 0, flips32 = 0;
    for (size_t r = 0; r + 1 < n; ++r) {
      const float* p = ref->logp.data() + r * V;
      const float* p32 = ref32->logp.data() + r * V;
      const float* q = s.logp.data() + r * V;
      nll -= q[ids[r + 1]];
      nll_ref -= p[ids[r + 1]];
      double k = 0, k32 = 0;
      for (size_t i = 0; i < V; ++i) {
        k += std::exp(double{p[i]}) * (double{p[i]} - q[i]);
        k32 += std::exp(double{p32[i]}) * (double{p32[i]} - q[i]);
      }
      kl += k;
      kl32 += k32;
      const auto top = std::max_element(q, q + V) - q;
      flips += std::max_element(p, p + V) - p != top;
      flips32 += std::max_element(p32, p32 + V) - p32 != top;
    }
    const double m = static_cast<double>(n - 1);
    const double ppl = std::exp(nll / m), ppl_ref = std::exp(nll_ref / m);
    std::printf("%-10s %11.4f %+10.3f%% %12.3e %12.3e %8.2f%% %8.2f%% %11zu %9.3f %8.1f\n", t.c_str(), ppl,
                100.0 * (ppl / ppl_ref - 1.0), kl / m, kl32 / m, 100.0 * static_cast<double>(flips) / m,
                100.0 * static_cast<double>(flips32) / m, s.kv_bytes_per_token,
                static_cast<double>(ref->kv_bytes_per_token) / static_cast<double>(s.kv_bytes_per_token), s.seconds);
    std::fflush(stdout);
  };
  row("f16", *ref);
  row("f32", *ref32);
  for (const std::string& t : types) {
    if (t == "f16" || t == "f32") continue;
    auto s = score(*files, **tok, ids, t, chunk, calibration);
    if (!s.ok()) return std::fprintf(stderr, "%s: %s\n", t.c_str(), s.error().message.c_str()), 1;
    row(t, *s);
  }
  return 0;
}

}  // namespace
}  // namespace rill

int main(int argc, char** argv) {
  return rill::run(argc, argv);
}
