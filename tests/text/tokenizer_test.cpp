// Tokenizer goldens: every encoding and decoding must equal the reference
// byte for byte (HF `tokenizers` for llama3/qwen3/gemma3 tokenizer.json,
// llama.cpp for SmolLM2's GGUF tokenizer). Goldens come from
// tools/make_tokenizer_goldens.py.
#include <gtest/gtest.h>

#include <chrono>

#include "text/detokenizer.h"
#include "text/tokenizer.h"
#include "text/unicode.h"
#include "tokenizer_test_util.h"

namespace rill {
namespace {

using testing::load_golden;
using testing::load_tokenizer;

std::string show(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t k = 0; k < ids.size(); ++k) s += (k ? "," : "") + std::to_string(ids[k]);
  return s + "]";
}

class TokenizerGolden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string error;
    tok_ = load_tokenizer(GetParam(), &error);
    ASSERT_TRUE(error.empty()) << error;
    if (tok_ == nullptr) GTEST_SKIP() << "tokenizer files for " << GetParam() << " are not available";
    golden_ = load_golden(GetParam());
  }
  const Tokenizer* tok_ = nullptr;
  nlohmann::json golden_;
};

TEST_P(TokenizerGolden, VocabularySize) {
  EXPECT_EQ(tok_->n_vocab(), golden_["n_vocab"].get<int32_t>());
}

TEST_P(TokenizerGolden, EncodeMatchesReference) {
  int n_checked = 0;
  for (const auto& c : golden_["encode"]) {
    const std::string text = c["text"];
    const auto want = c["ids"].get<std::vector<int32_t>>();
    const auto want_add = c["ids_add_special"].get<std::vector<int32_t>>();
    const auto want_plain = c["ids_no_parse"].get<std::vector<int32_t>>();
    EXPECT_EQ(show(tok_->encode(text, false, true)), show(want)) << "text: " << text;
    EXPECT_EQ(show(tok_->encode(text, true, true)), show(want_add)) << "add_special, text: " << text;
    EXPECT_EQ(show(tok_->encode(text, false, false)), show(want_plain)) << "no parse_special, text: " << text;
    ++n_checked;
  }
  EXPECT_GE(n_checked, 40);
}

TEST_P(TokenizerGolden, DecodeMatchesReference) {
  for (const auto& c : golden_["decode"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    const bool skip = c["skip_special"];
    EXPECT_EQ(tok_->decode(ids, skip), c["text"].get<std::string>()) << "ids " << show(ids) << " skip " << skip;
  }
}

// Streaming the same ids gives the same text, in valid UTF-8 pieces.
TEST_P(TokenizerGolden, IncrementalDecodeEqualsDecode) {
  for (const auto& c : golden_["decode"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    const bool skip = c["skip_special"];
    IncrementalDecoder dec(*tok_, skip);
    std::string all;
    for (int32_t id : ids) {
      const std::string delta = dec.push(id);
      EXPECT_TRUE(text::is_valid_utf8(delta)) << "ids " << show(ids);
      all += delta;
    }
    all += dec.flush();
    EXPECT_EQ(all, c["text"].get<std::string>()) << "ids " << show(ids) << " skip " << skip;
  }
}

// Decoding an encoding restores the text (all corpus texts are NFC-stable
// except the combining-mark lines, which NFC-normalizing models change).
TEST_P(TokenizerGolden, RoundTrip) {
  for (const auto& c : golden_["encode"]) {
    const std::string text = c["text"];
    if (text.find("\xCC\x81") != std::string::npos || text.find("\xCC\x8A") != std::string::npos) continue;
    EXPECT_EQ(tok_->decode(tok_->encode(text, false, true), false), text);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TokenizerGolden, ::testing::Values("llama3", "qwen3", "gemma3", "smollm2"));

TEST(SmolLM2Tokenizer, PiecesMatchLlamaCpp) {
  const Tokenizer* tok = load_tokenizer("smollm2");
  if (tok == nullptr) GTEST_SKIP() << "SmolLM2 GGUF not available";
  const auto golden = load_golden("smollm2");
  for (const auto& p : golden["pieces"]) {
    const std::string piece = tok->token_to_piece(p["id"].get<int32_t>());
    std::string hex;
    char buf[3];
    for (unsigned char ch : piece) std::snprintf(buf, sizeof(buf), "%02x", ch), hex += buf;
    EXPECT_EQ(hex, p["hex"].get<std::string>()) << "id " << p["id"];
  }
  EXPECT_EQ(tok->bos_id(), golden["bos"].get<int32_t>());
  EXPECT_EQ(tok->eos_id(), golden["eos"].get<int32_t>());
}

TEST(TokenizerSpecials, EndOfTurnTokens) {
  if (const Tokenizer* t = load_tokenizer("llama3")) {
    EXPECT_EQ(t->bos_id(), t->token_id("<|begin_of_text|>"));
    const auto& e = t->eos_ids();
    EXPECT_NE(std::find(e.begin(), e.end(), *t->token_id("<|eot_id|>")), e.end());
    EXPECT_NE(std::find(e.begin(), e.end(), *t->token_id("<|end_of_text|>")), e.end());
    EXPECT_TRUE(t->is_special(*t->token_id("<|eot_id|>")));
    EXPECT_FALSE(t->is_special(*t->token_id("Hello")));
    EXPECT_EQ(t->token_to_piece(*t->token_id("ĠHello")), " Hello");
  }
  if (const Tokenizer* t = load_tokenizer("qwen3")) {
    EXPECT_FALSE(t->bos_id().has_value());
    EXPECT_EQ(t->eos_id(), t->token_id("<|im_end|>"));
    const auto& e = t->eos_ids();
    EXPECT_NE(std::find(e.begin(), e.end(), *t->token_id("<|endoftext|>")), e.end());
    EXPECT_FALSE(t->is_special(*t->token_id("<think>")));  // added but not special
  }
  if (const Tokenizer* t = load_tokenizer("gemma3")) {
    EXPECT_EQ(t->bos_id(), 2);
    const auto& e = t->eos_ids();
    EXPECT_NE(std::find(e.begin(), e.end(), *t->token_id("<end_of_turn>")), e.end());
    EXPECT_NE(std::find(e.begin(), e.end(), *t->token_id("<eos>")), e.end());
    EXPECT_EQ(t->token_to_piece(*t->token_id("<0xE2>")), "\xE2");
    EXPECT_EQ(t->token_to_piece(*t->token_id("\xE2\x96\x81the")), " the");
  }
  if (const Tokenizer* t = load_tokenizer("smollm2")) {
    const auto& e = t->eos_ids();
    EXPECT_NE(std::find(e.begin(), e.end(), *t->token_id("<|im_end|>")), e.end());
  }
}

TEST(TokenizerFingerprint, StableAndDistinct) {
  std::vector<std::string> prints;
  for (const char* name : {"llama3", "qwen3", "gemma3", "smollm2"}) {
    if (const Tokenizer* t = load_tokenizer(name)) {
      EXPECT_EQ(t->fingerprint().size(), 16u);
      for (const auto& p : prints) EXPECT_NE(p, t->fingerprint()) << name;
      prints.push_back(t->fingerprint());
    }
  }
  // Loading again gives the same fingerprint.
  const std::string path = testing::shared_tokenizer_json("qwen3");
  if (!path.empty()) {
    auto again = Tokenizer::from_tokenizer_json(path);
    ASSERT_TRUE(again.ok()) << again.error().message;
    EXPECT_EQ((*again)->fingerprint(), load_tokenizer("qwen3")->fingerprint());
  }
}

// Ill-formed UTF-8 input is made valid first (one U+FFFD per ill-formed
// subpart), so it encodes like the replaced text and never crashes.
TEST(TokenizerInput, InvalidUtf8IsReplaced) {
  for (const char* name : {"llama3", "gemma3", "smollm2"}) {
    const Tokenizer* t = load_tokenizer(name);
    if (t == nullptr) continue;
    const std::string bad = "ab\xE2\x82 c\xFF\xC0\x80 d\xF0\x9F";
    const std::string fixed = "ab\xEF\xBF\xBD c\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD d\xEF\xBF\xBD";
    EXPECT_EQ(show(t->encode(bad, false, true)), show(t->encode(fixed, false, true))) << name;
  }
}

TEST(TokenizerErrors, MissingOrBrokenFiles) {
  auto missing = Tokenizer::from_tokenizer_json("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("/nonexistent/tokenizer.json"), std::string::npos);

  const std::string dir = testing::tokenizer_temp_dir();
  const std::string broken = dir + "/broken.json";
  std::ofstream(broken) << "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}";
  auto r = Tokenizer::from_tokenizer_json(broken);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("merge"), std::string::npos) << r.error().message;

  std::ofstream(broken) << "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}";
  r = Tokenizer::from_tokenizer_json(broken);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("Unigram"), std::string::npos) << r.error().message;

  std::ofstream(broken) << "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,";
  r = Tokenizer::from_tokenizer_json(broken);
  EXPECT_FALSE(r.ok());
}

}  // namespace
}  // namespace rill
