// Fill-in-the-middle prompts: the FIM tokens found in real vocabularies and
// the prefix-suffix-middle rendering held to Hugging Face tokenizers' ids
// (tests/data/tokenizer goldens) for the pieces between the FIM tokens.
#include "text/fim.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "tokenizer_test_util.h"

namespace rill {
namespace {

using testing::load_golden;
using testing::load_tokenizer;

const nlohmann::json& golden_entry(const nlohmann::json& golden, const std::string& text) {
  for (const auto& e : golden["encode"]) {
    if (e["text"] == text) return e;
  }
  static const nlohmann::json none;
  ADD_FAILURE() << "no golden entry for " << text;
  return none;
}

TEST(Fim, Qwen3HasTheFimTokensAndRendersPrefixSuffixMiddle) {
  const Tokenizer* tok = load_tokenizer("qwen3");
  if (tok == nullptr) GTEST_SKIP() << "shared qwen3 tokenizer missing";
  const auto fim = find_fim_tokens(*tok);
  ASSERT_TRUE(fim.has_value());
  // tokenizer.json's added_tokens.
  EXPECT_EQ(fim->prefix, 151659);
  EXPECT_EQ(fim->middle, 151660);
  EXPECT_EQ(fim->suffix, 151661);

  const nlohmann::json golden = load_golden("qwen3");
  const auto& before = golden_entry(golden, "Hello, world! How are you today?");
  const auto& after = golden_entry(golden, " Hello world");
  std::vector<int32_t> want = {151659};
  for (int id : before["ids_no_parse"]) want.push_back(id);
  want.push_back(151661);
  for (int id : after["ids_no_parse"]) want.push_back(id);
  want.push_back(151660);
  EXPECT_EQ(render_fim(*tok, *fim, before["text"].get<std::string>(), after["text"].get<std::string>()), want);
}

TEST(Fim, SpecialTokenSpellingsInTheCodeStayText) {
  const Tokenizer* tok = load_tokenizer("qwen3");
  if (tok == nullptr) GTEST_SKIP() << "shared qwen3 tokenizer missing";
  const auto fim = find_fim_tokens(*tok);
  ASSERT_TRUE(fim.has_value());
  const auto eot = tok->token_id("<|endoftext|>");
  ASSERT_TRUE(eot.has_value());
  const auto ids = render_fim(*tok, *fim, "s = '<|endoftext|>'", "");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *eot), 0);
  EXPECT_EQ(tok->decode(std::vector<int32_t>(ids.begin() + 1, ids.end() - 2), false), "s = '<|endoftext|>'");
  EXPECT_EQ(ids.back(), fim->middle);
  EXPECT_EQ(ids[ids.size() - 2], fim->suffix);  // an empty suffix encodes to nothing
}

TEST(Fim, Llama3HasNoFimTokens) {
  const Tokenizer* tok = load_tokenizer("llama3");
  if (tok == nullptr) GTEST_SKIP() << "shared llama3 tokenizer missing";
  EXPECT_FALSE(find_fim_tokens(*tok).has_value());
}

}  // namespace
}  // namespace rill
