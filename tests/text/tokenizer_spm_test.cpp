// GGUF "llama" (SentencePiece, merge by score) tokenizer against llama.cpp.
// The vocabulary is Gemma 3's, written into an in-memory GGUF exactly as
// tools/make_tokenizer_goldens.py writes the file llama.cpp tokenized:
// special added tokens CONTROL, <0xXX> BYTE, the rest NORMAL, score -id,
// BOS 2, EOS 1, UNK 3, PAD 0.
#include <gtest/gtest.h>

#include <cstring>
#include <regex>

#include "text/detokenizer.h"
#include "tokenizer_test_util.h"

namespace rill {
namespace {

class GgufImage {
 public:
  GgufImage() { u32(0x46554747), u32(3), u64(0), u64(0); }  // n_kv patched in finish()
  void key(const std::string& k, uint32_t type) { str(k), u32(type), ++n_kv_; }
  void u32_kv(const std::string& k, uint32_t v) { key(k, 4), u32(v); }
  void string_kv(const std::string& k, const std::string& v) { key(k, 8), str(v); }
  void strings_kv(const std::string& k, const std::vector<std::string>& v) {
    key(k, 9), u32(8), u64(v.size());
    for (const auto& s : v) str(s);
  }
  template <typename T>
  void array_kv(const std::string& k, uint32_t elem_type, const std::vector<T>& v) {
    key(k, 9), u32(elem_type), u64(v.size());
    put(v.data(), v.size() * sizeof(T));
  }
  std::vector<uint8_t> finish() {
    std::memcpy(bytes_.data() + 16, &n_kv_, 8);
    while (bytes_.size() % 32) bytes_.push_back(0);
    return bytes_;
  }

 private:
  void put(const void* p, size_t n) {
    bytes_.insert(bytes_.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  }
  void u32(uint32_t x) { put(&x, 4); }
  void u64(uint64_t x) { put(&x, 8); }
  void str(const std::string& s) { u64(s.size()), put(s.data(), s.size()); }
  std::vector<uint8_t> bytes_;
  uint64_t n_kv_ = 0;
};

const Tokenizer* spm_tokenizer() {
  static std::unique_ptr<Tokenizer> tok = []() -> std::unique_ptr<Tokenizer> {
    const Tokenizer* gemma = testing::load_tokenizer("gemma3");
    if (gemma == nullptr) return nullptr;
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    std::vector<float> scores;
    const std::regex byte_token("<0x[0-9A-F]{2}>");
    for (int32_t i = 0; i < gemma->n_vocab(); ++i) {
      const std::string t(gemma->token_text(i));
      tokens.push_back(t);
      types.push_back(gemma->is_special(i) ? 3 : std::regex_match(t, byte_token) ? 6 : 1);
      scores.push_back(-static_cast<float>(i));
    }
    GgufImage img;
    img.string_kv("general.architecture", "llama");
    img.string_kv("tokenizer.ggml.model", "llama");
    img.strings_kv("tokenizer.ggml.tokens", tokens);
    img.array_kv("tokenizer.ggml.token_type", 5, types);
    img.array_kv("tokenizer.ggml.scores", 6, scores);
    img.u32_kv("tokenizer.ggml.bos_token_id", 2);
    img.u32_kv("tokenizer.ggml.eos_token_id", 1);
    img.u32_kv("tokenizer.ggml.unknown_token_id", 3);
    img.u32_kv("tokenizer.ggml.padding_token_id", 0);
    const std::vector<uint8_t> bytes = img.finish();
    auto gguf = GgufFile::parse(bytes.data(), bytes.size(), "spm.gguf");
    EXPECT_TRUE(gguf.ok()) << gguf.error().message;
    if (!gguf.ok()) return nullptr;
    auto t = Tokenizer::from_gguf(*gguf.value());
    EXPECT_TRUE(t.ok()) << t.error().message;
    return t.ok() ? std::move(t).value() : nullptr;
  }();
  return tok.get();
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + ",";
  return s;
}

TEST(SpmGguf, EncodeMatchesLlamaCpp) {
  const Tokenizer* tok = spm_tokenizer();
  if (tok == nullptr) GTEST_SKIP() << "Gemma 3 tokenizer not available";
  const auto golden = testing::load_golden("gemma3_spm_gguf");
  EXPECT_EQ(tok->n_vocab(), golden["n_vocab"].get<int32_t>());
  for (const auto& c : golden["encode"]) {
    const std::string text = c["text"];
    EXPECT_EQ(show(tok->encode(text, false, true)), show(c["ids"])) << text;
    EXPECT_EQ(show(tok->encode(text, true, true)), show(c["ids_add_special"])) << text;
    EXPECT_EQ(show(tok->encode(text, false, false)), show(c["ids_no_parse"])) << text;
  }
}

TEST(SpmGguf, DecodeMatchesLlamaCpp) {
  const Tokenizer* tok = spm_tokenizer();
  if (tok == nullptr) GTEST_SKIP() << "Gemma 3 tokenizer not available";
  const auto golden = testing::load_golden("gemma3_spm_gguf");
  for (const auto& c : golden["decode"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    const bool skip = c["skip_special"];
    EXPECT_EQ(tok->decode(ids, skip), c["text"].get<std::string>()) << show(ids) << " skip " << skip;
    IncrementalDecoder dec(*tok, skip);
    std::string streamed;
    for (int32_t id : ids) dec.push(id, streamed);
    dec.flush(streamed);
    EXPECT_EQ(streamed, c["text"].get<std::string>()) << show(ids);
  }
}

}  // namespace
}  // namespace rill
