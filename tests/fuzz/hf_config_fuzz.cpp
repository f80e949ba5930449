// Fuzz target: config.json / generation_config.json text. Any input must give
// a ModelConfig or an Error (also its quantization_config, as an Fp8Scheme
// or an Mxfp4Scheme, whose module patterns are then matched against a
// name); no nlohmann exception may escape, and a pattern that backtracks
// without bound is an error, not a hang (loader/module_pattern.h).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "loader/fp8_checkpoint.h"
#include "loader/hf_config.h"
#include "loader/mxfp4_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = rill::parse_hf_config_text(text, "fuzz/config.json");
  (void)config.ok();
  auto gen = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (!gen.is_discarded()) {
    rill::GenerationDefaults defaults;
    (void)rill::apply_generation_config(gen, "fuzz/generation_config.json", &defaults).ok();
    (void)rill::parse_fp8_scheme(gen, "fuzz/config.json").ok();
    auto mxfp4 = rill::parse_mxfp4_scheme(gen, "fuzz/config.json");
    if (mxfp4.ok()) (void)rill::mxfp4_converts(*mxfp4, "model.layers.11.mlp.experts");
  }
  return 0;
}
