// llama.cpp's token ids for texts, through its C API with the model loaded
// vocab-only, for rill's tokenizer goldens of GGUF pre-tokenizer types
// (tools/make_minicpm5_tokenizer_golden.py builds and runs it). Texts come
// on stdin separated by NUL bytes; prints one JSON array of ids per text,
// one per line (no BOS/EOS, special tokens not parsed).
//
//   printf 'a\0b' | llamacpp_tokenize MODEL
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "llama.h"

namespace {

void quiet(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MODEL < texts separated by NUL\n", argv[0]);
    return 2;
  }
  llama_log_set(quiet, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) {
    std::fprintf(stderr, "cannot load %s\n", argv[1]);
    return 1;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  size_t start = 0;
  while (start <= input.size()) {
    size_t end = input.find('\0', start);
    if (end == std::string::npos) end = input.size();
    const std::string text = input.substr(start, end - start);
    std::vector<llama_token> ids(text.size() + 8);
    const int n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                                 static_cast<int32_t>(ids.size()), /*add_special=*/false, /*parse_special=*/false);
    if (n < 0) {
      std::fprintf(stderr, "tokenize failed\n");
      return 1;
    }
    std::printf("[");
    for (int i = 0; i < n; ++i) std::printf(i ? ",%d" : "%d", ids[static_cast<size_t>(i)]);
    std::printf("]\n");
    start = end + 1;
  }
  llama_model_free(model);
  return 0;
}
