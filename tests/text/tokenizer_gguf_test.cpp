// GGUF tokenizers by pre-tokenizer type against llama.cpp: MiniCPM5's
// `minicpm5` (digit runs cut in threes before llama3's pattern with whole
// digit runs; a piece that is a whole token skips the merges), on a
// synthetic byte-level BPE vocabulary whose merges and whole-word tokens
// make every cut show (tests/data/tokenizer/minicpm5_vocab.gguf), held to
// the ids llama.cpp gives for texts of digits, contractions, spaces, tabs,
// newlines, non-Latin digits, CJK and accents
// (tools/make_minicpm5_tokenizer_golden.py).
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loader/gguf.h"
#include "text/tokenizer.h"

namespace rill {
namespace {

TEST(TokenizerGguf, Minicpm5PreTokenizerMatchesLlamaCpp) {
  const std::string dir = std::string(RILL_TEST_DATA) + "/tokenizer/";
  auto gguf = GgufFile::open(dir + "minicpm5_vocab.gguf");
  ASSERT_TRUE(gguf.ok()) << gguf.error().message;
  auto tok = Tokenizer::from_gguf(**gguf);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  std::ifstream in(dir + "minicpm5_gguf.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  ASSERT_GE(golden["cases"].size(), 10u);
  for (const auto& c : golden["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ((*tok)->encode(text, /*add_special=*/false, /*parse_special=*/false),
              c["ids"].get<std::vector<int32_t>>())
        << text;
  }
}

}  // namespace
}  // namespace rill
