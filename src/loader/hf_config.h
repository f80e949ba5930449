#pragma once
// Hugging Face config.json / generation_config.json -> ModelConfig.
//
// Both RoPE forms are read: transformers v4 (`rope_theta` + `rope_scaling`
// {type|rope_type, factor, ...}) and v5 (`rope_parameters` {rope_theta,
// rope_type, ...}, possibly per layer type {"full_attention": {...},
// "sliding_attention": {...}}, of which the full-attention one is used; the
// rest stays in `raw`). Multimodal configs whose text model lives under
// `text_config` are read from there. No nlohmann exception escapes: wrong
// types are Errors ("dir/config.json: field 'hidden_size' missing").
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/result.h"
#include "loader/model_config.h"

namespace rill {

// `name` is the file name used in errors. `raw` of the result is `config`.
Result<ModelConfig> parse_hf_config(const nlohmann::json& config, const std::string& name);
// Same, from the file's text (used by the fuzz target).
Result<ModelConfig> parse_hf_config_text(std::string_view text, const std::string& name);

// Overlays generation_config.json onto `out` (fields present there win).
Status apply_generation_config(const nlohmann::json& gen, const std::string& name, GenerationDefaults* out);

// Reads dir/config.json and, when present, dir/generation_config.json.
Result<ModelConfig> load_hf_config(const std::string& dir);

}  // namespace rill
