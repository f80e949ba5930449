// Token masks against real vocabularies (Llama-3 byte-level BPE, Qwen3,
// Gemma 3 SentencePiece with byte fallback): at each state of a walk
// through a valid text, a token is in the mask iff its bytes extend the
// accepted prefix (checked against the byte matcher for every token),
// special tokens never are unless the grammar names them, and EOS is
// exactly where the grammar may end.
#include "text/grammar/token_mask_cache.h"

#include <gtest/gtest.h>

#include "../../sanitizer_stride.h"
#include "../tokenizer_test_util.h"
#include "text/grammar/grammar_matcher.h"

namespace rill::grammar {
namespace {

constexpr const char* kJsonGrammar = R"g(root ::= object
value ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
array ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws ::= [ \t\n]{0,8}
)g";

bool bit(const std::vector<uint64_t>& mask, int32_t id) {
  return (mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1;
}

// Checks every token's mask bit against the byte matcher at every 7th
// prefix of `text` (every 28th under the sanitizers: sanitizer_stride.h).
void check_masks(const std::string& tokenizer, std::string_view grammar, const std::string& text, size_t key_frames) {
  const Tokenizer* tok = testing::load_tokenizer(tokenizer);
  if (tok == nullptr) GTEST_SKIP() << tokenizer << " tokenizer files missing";
  auto g = CompiledGrammar::from_gbnf(grammar);
  ASSERT_TRUE(g.ok()) << g.error().message;
  auto vocab = TokenVocabulary::from_tokenizer(*tok);
  auto cache = std::make_shared<TokenMaskCache>(*g, vocab, key_frames);
  std::vector<uint64_t> mask(vocab->mask_words());
  GrammarMatcher bytes(*g);
  size_t n_states = 0, n_allowed_total = 0;
  for (size_t i = 0; i <= text.size(); i += 7 * testing::kSanitizerStride) {
    const std::string prefix = text.substr(0, i);
    GrammarMatcher at(cache);
    ASSERT_TRUE(at.accept_bytes(prefix)) << prefix;
    ASSERT_TRUE(at.fill_mask(mask));
    size_t n_allowed = 0;
    for (int32_t id = 0; id < vocab->n_vocab(); ++id) {
      bool expected;
      if (vocab->is_eos(id)) {
        expected = at.can_end();
      } else if (tok->is_special(id) || !vocab->in_trie(id)) {
        expected = false;
      } else {
        GrammarMatcher probe = at;
        expected = !tok->token_to_piece(id).empty() && probe.accept_bytes(tok->token_to_piece(id));
      }
      ASSERT_EQ(bit(mask, id), expected) << "token " << id << " '" << tok->token_to_piece(id) << "' after '" << prefix
                                         << "'";
      if (expected) {  // an allowed token really is accepted, and then the state goes on
        GrammarMatcher step = at;
        ASSERT_TRUE(step.accept_token(id));
      }
      n_allowed += expected;
    }
    n_allowed_total += n_allowed;
    ++n_states;
  }
  EXPECT_GT(n_allowed_total, n_states);  // the masks are not trivially empty
  EXPECT_GT(cache->stats().hits + cache->stats().misses, 0u);
}

const std::string kDoc = R"({"name": "Zoë \"Z\" 中文", "n": [1, -2.5e3, {"deep": [[], {}]}], "ok": true, "x": null})";

TEST(TokenMask, Llama3JsonEveryTokenAgreesWithTheByteMatcher) {
  check_masks("llama3", kJsonGrammar, kDoc, kDefaultKeyFrames);
}
TEST(TokenMask, Llama3ShallowKeysNeedDependentChecks) {
  check_masks("llama3", kJsonGrammar, kDoc, 2);  // most stacks are cut: dependents carry the context
}
TEST(TokenMask, Qwen3Json) {
  check_masks("qwen3", kJsonGrammar, kDoc, kDefaultKeyFrames);
}
TEST(TokenMask, Gemma3SentencePieceJson) {
  check_masks("gemma3", kJsonGrammar, kDoc, 3);
}

TEST(TokenMask, SpecialTokensAndEos) {
  const Tokenizer* tok = testing::load_tokenizer("llama3");
  if (tok == nullptr) GTEST_SKIP() << "llama3 tokenizer files missing";
  auto g = CompiledGrammar::from_gbnf(R"g(root ::= "yes" | "no" | "<|eot_id|>x")g");
  ASSERT_TRUE(g.ok());
  auto cache = std::make_shared<TokenMaskCache>(*g, TokenVocabulary::from_tokenizer(*tok));
  GrammarMatcher m(cache);
  std::vector<uint64_t> mask(cache->vocab().mask_words());
  ASSERT_TRUE(m.fill_mask(mask));
  const int32_t eot = *tok->token_id("<|eot_id|>");
  EXPECT_FALSE(bit(mask, eot));  // a special token is never its text's bytes
  EXPECT_FALSE(bit(mask, *tok->eos_id()));
  EXPECT_TRUE(bit(mask, *tok->token_id("yes")));
  EXPECT_TRUE(bit(mask, *tok->token_id("y")));
  EXPECT_FALSE(bit(mask, *tok->token_id("Ġyes")));
  EXPECT_TRUE(m.accept_token(*tok->token_id("yes")));
  ASSERT_TRUE(m.fill_mask(mask));
  for (int32_t id : tok->eos_ids()) EXPECT_TRUE(bit(mask, id)) << id;
  size_t n = 0;
  for (auto w : mask) n += static_cast<size_t>(__builtin_popcountll(w));
  EXPECT_EQ(n, tok->eos_ids().size());  // complete: only the end
  EXPECT_TRUE(m.accept_token(eot));
  EXPECT_TRUE(m.terminated());
  EXPECT_FALSE(m.accept_token(*tok->token_id("y")));
  // Roll back over the end and the word: the start state again.
  EXPECT_TRUE(m.rollback(2));
  EXPECT_FALSE(m.terminated());
  EXPECT_TRUE(m.accept_token(*tok->token_id("no")));
  EXPECT_FALSE(m.rollback(3));
}

// A grammar that names a special token (<|start_header_id|>, an end-of-turn
// token) allows exactly that token id there, never its spelling's bytes as
// text, and no other special token.
TEST(TokenMask, NamedSpecialTokensAreTheirOwnIds) {
  const Tokenizer* tok = testing::load_tokenizer("llama3");
  if (tok == nullptr) GTEST_SKIP() << "llama3 tokenizer files missing";
  auto g = CompiledGrammar::from_gbnf(R"g(root ::= <|start_header_id|> "{}" <|eot_id|> "x")g");
  ASSERT_TRUE(g.ok()) << g.error().message;
  auto cache = std::make_shared<TokenMaskCache>(*g, TokenVocabulary::from_tokenizer(*tok));
  GrammarMatcher m(cache);
  std::vector<uint64_t> mask(cache->vocab().mask_words());
  auto allowed = [&] {
    EXPECT_TRUE(m.fill_mask(mask));
    std::vector<int32_t> ids;
    for (int32_t id = 0; id < cache->vocab().n_vocab(); ++id) {
      if (bit(mask, id)) ids.push_back(id);
    }
    return ids;
  };
  const int32_t header = *tok->token_id("<|start_header_id|>");
  const int32_t eot = *tok->token_id("<|eot_id|>");
  ASSERT_TRUE(tok->is_special(header));
  ASSERT_TRUE(cache->vocab().is_eos(eot));
  EXPECT_EQ(allowed(), std::vector<int32_t>{header});
  EXPECT_FALSE(m.accept_token(*tok->token_id("<")));  // the spelling as text is not the token
  EXPECT_FALSE(m.accept_bytes("<|start_header_id|>"));
  ASSERT_TRUE(m.accept_token(header));
  ASSERT_TRUE(m.accept_token(*tok->token_id("{}")));
  // The end-of-turn token where the grammar names it (it cannot end here): taken as the token.
  EXPECT_EQ(allowed(), std::vector<int32_t>{eot});
  ASSERT_TRUE(m.accept_token(eot));
  EXPECT_FALSE(m.terminated());
  EXPECT_EQ(allowed(), std::vector<int32_t>{*tok->token_id("x")});
  // Without the name, special tokens stay out of every mask (the JSON tests above check all tokens).
  auto plain = CompiledGrammar::from_gbnf(R"g(root ::= "<|start_header_id|>")g");
  ASSERT_TRUE(plain.ok());
  GrammarMatcher text(std::make_shared<TokenMaskCache>(*plain, TokenVocabulary::from_tokenizer(*tok)));
  EXPECT_FALSE(text.accept_token(header));
  EXPECT_TRUE(text.accept_token(*tok->token_id("<")));
}

}  // namespace
}  // namespace rill::grammar
