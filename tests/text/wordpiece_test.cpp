// WordPiece (BERT) tokenization against Hugging Face's tokenizer for
// all-MiniLM-L6-v2 (the ids recorded by tools/make_embedding_goldens.py).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

namespace rill {
namespace {

const std::string kTokenizer = std::string(RILL_MODEL_DIR) + "/all-MiniLM-L6-v2/tokenizer.json";
const std::string kGolden = std::string(RILL_TEST_DATA) + "/embeddings/all-minilm-l6-v2.json";

TEST(WordPiece, MatchesHuggingFaceOnTheGoldenTexts) {
  if (!std::filesystem::exists(kTokenizer)) GTEST_SKIP() << kTokenizer << " not found (run scripts/setup.sh)";
  auto tok = Tokenizer::from_tokenizer_json(kTokenizer);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  std::ifstream in(kGolden);
  ASSERT_TRUE(in) << kGolden;
  const nlohmann::json golden = nlohmann::json::parse(in);
  ASSERT_GE(golden["cases"].size(), 10u);
  for (const auto& c : golden["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ((*tok)->encode(text, true, true), c["ids"].get<std::vector<int32_t>>()) << text;
  }
}

TEST(WordPiece, NormalizesSplitsAndFallsBackToUnknown) {
  if (!std::filesystem::exists(kTokenizer)) GTEST_SKIP() << kTokenizer << " not found (run scripts/setup.sh)";
  auto tok = Tokenizer::from_tokenizer_json(kTokenizer);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  const Tokenizer& t = **tok;
  auto id = [&](const char* s) { return *t.token_id(s); };
  // Lowercased, accents stripped, punctuation split off, [CLS] ... [SEP].
  EXPECT_EQ(t.encode("Café!", true, false), (std::vector<int32_t>{id("[CLS]"), id("cafe"), id("!"), id("[SEP]")}));
  // A word continues with "##" pieces.
  const std::vector<int32_t> pieces = t.encode("tokenization", false, false);
  ASSERT_GE(pieces.size(), 2u);
  EXPECT_EQ(t.token_text(pieces[1]).substr(0, 2), "##");
  // Longer than max_input_chars_per_word (100): the unknown token.
  EXPECT_EQ(t.encode(std::string(101, 'a'), false, false), std::vector<int32_t>{id("[UNK]")});
  EXPECT_TRUE(t.encode(" \t\n ", false, false).empty());
  EXPECT_EQ(t.decode(t.encode("hello world", false, false), true), "hello world");
}

}  // namespace
}  // namespace rill
