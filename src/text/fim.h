#pragma once
// Fill-in-the-middle prompts: a code model trained with FIM completes the
// text between a prefix and a suffix when prompted, in the
// prefix-suffix-middle order every FIM family shares,
//   [BOS] <prefix token> prefix <suffix token> suffix <middle token>
// and generates the middle. The three tokens are found in the vocabulary by
// the spellings the families use (Qwen2.5-Coder / Qwen3 <|fim_prefix|>,
// StarCoder / SmolLM <fim_prefix>, DeepSeek-Coder <｜fim▁begin｜>, Code Llama
// ▁<PRE>); a vocabulary with none of the sets has no FIM.
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "text/tokenizer.h"

namespace rill {

struct FimTokens {
  int32_t prefix = -1, suffix = -1, middle = -1;
};

// The FIM tokens of the vocabulary: the first family whose three tokens
// are all present; nullopt when none is.
std::optional<FimTokens> find_fim_tokens(const Tokenizer& tok);

// The prompt above. BOS (and whatever else the tokenizer adds in front of
// a text) as encode(add_special) adds it; prefix and suffix are encoded
// without parsing special tokens (a special token's spelling in code stays
// text; non-special added tokens are recognised, as in the references).
std::vector<int32_t> render_fim(const Tokenizer& tok, const FimTokens& fim, std::string_view prefix,
                                std::string_view suffix);

}  // namespace rill
