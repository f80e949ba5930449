// llama.cpp's logits at every prompt position and its greedy ids, through
// llama.cpp's C API, for rill's GGUF parity goldens of the model families
// (tools/make_family_gguf.py builds and runs it): the prompt in one batch
// with an output row per token, then --n-gen tokens decoded one at a time
// taking the argmax (no sampler). f32 K/V cache (the reference must not
// round K/V to f16), flash attention off. Prints JSON: n_vocab, the logits
// rows [prompt position][n_vocab] and the greedy ids.
//
//   llamacpp_logits MODEL N_GEN THREADS "1,2,3"
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

namespace {

std::vector<llama_token> parse_ids(const std::string& s) {
  std::vector<llama_token> ids;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ',')) ids.push_back(static_cast<llama_token>(std::stol(tok)));
  return ids;
}

int argmax(const float* row, int n) {
  int best = 0;
  for (int v = 1; v < n; ++v)
    if (row[v] > row[best]) best = v;
  return best;
}

void quiet(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s MODEL N_GEN THREADS PROMPT_IDS\n", argv[0]);
    return 2;
  }
  const int n_gen = std::atoi(argv[2]), n_threads = std::atoi(argv[3]);
  const std::vector<llama_token> ids = parse_ids(argv[4]);
  const int n = static_cast<int>(ids.size());
  llama_log_set(quiet, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.use_extra_bufts = false;  // no repacked weights: the plain f32/f16/quant dot products
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) {
    std::fprintf(stderr, "cannot load %s\n", argv[1]);
    return 1;
  }
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(n + n_gen + 16);
  cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(n);
  cp.n_threads = cp.n_threads_batch = n_threads;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.type_k = GGML_TYPE_F32;
  cp.type_v = GGML_TYPE_F32;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    std::fprintf(stderr, "cannot create a context\n");
    return 1;
  }
  llama_batch batch = llama_batch_init(n, 0, 1);
  for (int i = 0; i < n; ++i) {
    batch.token[i] = ids[i];
    batch.pos[i] = i;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  batch.n_tokens = n;
  if (llama_decode(ctx, batch) != 0) {
    std::fprintf(stderr, "prompt decode failed\n");
    return 1;
  }
  std::printf("{\"n_vocab\": %d, \"logits\": [", n_vocab);
  for (int i = 0; i < n; ++i) {
    const float* row = llama_get_logits_ith(ctx, i);
    std::printf("%s[", i ? ",\n" : "\n");
    for (int v = 0; v < n_vocab; ++v) std::printf("%s%.9g", v ? "," : "", row[v]);
    std::printf("]");
  }
  std::printf("],\n\"greedy_ids\": [");
  llama_token next = argmax(llama_get_logits_ith(ctx, n - 1), n_vocab);
  for (int s = 0; s < n_gen; ++s) {
    std::printf("%s%d", s ? ", " : "", next);
    if (s + 1 == n_gen) break;
    if (llama_decode(ctx, llama_batch_get_one(&next, 1)) != 0) {
      std::fprintf(stderr, "decode failed\n");
      return 1;
    }
    next = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
  }
  std::printf("]}\n");
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
