#include "text/fim.h"

#include <array>

namespace rill {
namespace {

struct FimSpelling {
  std::string_view prefix, suffix, middle;
};

// In the order tried. Code Llama's SentencePiece pieces carry the "▁" its
// vocabulary stores them with.
constexpr std::array<FimSpelling, 4> kSpellings = {{
    {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"},
    {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"},
    {"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"},
    {"▁<PRE>", "▁<SUF>", "▁<MID>"},
}};

}  // namespace

std::optional<FimTokens> find_fim_tokens(const Tokenizer& tok) {
  for (const FimSpelling& s : kSpellings) {
    const auto p = tok.token_id(s.prefix), x = tok.token_id(s.suffix), m = tok.token_id(s.middle);
    if (p && x && m) return FimTokens{*p, *x, *m};
  }
  return std::nullopt;
}

std::vector<int32_t> render_fim(const Tokenizer& tok, const FimTokens& fim, std::string_view prefix,
                                std::string_view suffix) {
  std::vector<int32_t> ids = tok.encode("", /*add_special=*/true, /*parse_special=*/false);
  ids.push_back(fim.prefix);
  const std::vector<int32_t> p = tok.encode(prefix, /*add_special=*/false, /*parse_special=*/false);
  ids.insert(ids.end(), p.begin(), p.end());
  ids.push_back(fim.suffix);
  const std::vector<int32_t> s = tok.encode(suffix, /*add_special=*/false, /*parse_special=*/false);
  ids.insert(ids.end(), s.begin(), s.end());
  ids.push_back(fim.middle);
  return ids;
}

}  // namespace rill
