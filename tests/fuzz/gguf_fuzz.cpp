// Fuzz target: GgufFile::parse and everything derived from a parsed file
// (tensor names, ModelConfig, its raw JSON) must never crash or hang on any
// input; malformed input is an Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "loader/gguf.h"
#include "loader/gguf_names.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string kName = "fuzz.gguf";
  auto file = rill::GgufFile::parse(data, size, kName);
  if (!file.ok()) return 0;
  const rill::GgufFile& f = **file;
  // Touch every byte the reader claims is tensor data, so a bad bound shows
  // up under AddressSanitizer.
  volatile uint8_t sink = 0;
  const std::string arch = f.get_string("general.architecture").value_or("");
  for (const auto& t : f.tensors()) {
    (void)rill::gguf_to_hf_tensor_name(t.name, arch);
    (void)t.n_elements();
    if (t.data && t.n_bytes) sink = sink ^ t.data[0] ^ t.data[t.n_bytes - 1];
  }
  (void)f.get_string("general.architecture");
  (void)f.get_array("tokenizer.ggml.tokens");
  auto config = rill::gguf_model_config(f);
  if (config.ok()) (void)config->raw.dump();
  return 0;
}
