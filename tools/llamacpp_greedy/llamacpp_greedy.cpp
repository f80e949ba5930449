// Greedy decoding through llama.cpp's C API, for rill's GGUF parity goldens
// (tools/make_iquant_parity_goldens.py builds and runs it): reads prompts as
// token ids, feeds each prompt in one batch, then decodes --n-gen tokens one
// at a time taking the argmax of the logits (no sampler), and prints JSON:
// per prompt the greedy ids, each step's top 5 (id, logit), and the full
// logits row of the first step. Flash attention off, as llama-cpp-python's
// default (the rill parity goldens of tools/make_llamacpp_goldens.py).
//
//   llamacpp_greedy MODEL N_GEN THREADS EXTRA_BUFTS(0|1) "1,2,3" ["4,5" ...]
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

void quiet(ggml_log_level, const char*, void*) {}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s MODEL N_GEN THREADS EXTRA_BUFTS PROMPT_IDS...\n", argv[0]);
    return 2;
  }
  const int n_gen = std::atoi(argv[2]), n_threads = std::atoi(argv[3]);
  llama_log_set(quiet, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.use_extra_bufts = std::atoi(argv[4]) != 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) {
    std::fprintf(stderr, "cannot load %s\n", argv[1]);
    return 1;
  }
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::printf("{\"n_vocab\": %d, \"prompts\": [", n_vocab);
  for (int p = 5; p < argc; ++p) {
    std::vector<llama_token> ids = parse_ids(argv[p]);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = static_cast<uint32_t>(ids.size() + n_gen + 16);
    cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(ids.size());
    cp.n_threads = cp.n_threads_batch = n_threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;  // as llama-cpp-python's default
    llama_context* ctx = llama_init_from_model(model, cp);
    if (!ctx || llama_decode(ctx, llama_batch_get_one(ids.data(), static_cast<int32_t>(ids.size()))) != 0) {
      std::fprintf(stderr, "prompt %d failed\n", p - 5);
      return 1;
    }
    std::printf("%s{\"prompt_ids\": [", p > 5 ? ", " : "");
    for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? ", " : "", ids[i]);
    std::printf("], \"steps\": [");
    for (int s = 0; s < n_gen; ++s) {
      const float* logits = llama_get_logits_ith(ctx, -1);
      std::vector<int> top;
      for (int k = 0; k < 5; ++k) {
        int best = -1;
        for (int v = 0; v < n_vocab; ++v) {
          bool taken = false;
          for (int t : top) taken = taken || t == v;
          if (!taken && (best < 0 || logits[v] > logits[best])) best = v;
        }
        top.push_back(best);
      }
      std::printf("%s{\"id\": %d, \"top5\": [", s ? ", " : "", top[0]);
      for (int k = 0; k < 5; ++k) std::printf("%s[%d, %.9g]", k ? ", " : "", top[k], logits[top[k]]);
      std::printf("]");
      if (s == 0) {
        std::printf(", \"logits\": [");
        for (int v = 0; v < n_vocab; ++v) std::printf("%s%.9g", v ? ", " : "", logits[v]);
        std::printf("]");
      }
      std::printf("}");
      llama_token next = top[0];
      if (s + 1 < n_gen && llama_decode(ctx, llama_batch_get_one(&next, 1)) != 0) {
        std::fprintf(stderr, "decode failed\n");
        return 1;
      }
    }
    std::printf("]}");
    llama_free(ctx);
  }
  std::printf("]}\n");
  llama_model_free(model);
  return 0;
}
