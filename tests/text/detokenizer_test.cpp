// UTF-8 replacement rules and the IncrementalDecoder's hold-back behaviour.
// Expected strings for ill-formed input follow Python's
// bytes.decode("utf-8", "replace") / Rust's from_utf8_lossy (one U+FFFD per
// maximal ill-formed subpart).
#include <gtest/gtest.h>

#include "text/detokenizer.h"
#include "text/unicode.h"
#include "tokenizer_test_util.h"

namespace rill {
namespace {

using testing::load_tokenizer;
constexpr const char* kR = "\xEF\xBF\xBD";  // U+FFFD

std::string r(int n) {
  std::string s;
  for (int k = 0; k < n; ++k) s += kR;
  return s;
}

TEST(Utf8Lossy, MaximalSubparts) {
  EXPECT_EQ(text::utf8_lossy("abc"), "abc");
  EXPECT_EQ(text::utf8_lossy("\xE2\x82\xAC"), "\xE2\x82\xAC");
  EXPECT_EQ(text::utf8_lossy("\xE2\x82"), r(1));  // truncated: one subpart
  EXPECT_EQ(text::utf8_lossy("\xE2\x82x"), r(1) + "x");
  EXPECT_EQ(text::utf8_lossy("\xE2(\xA1"), r(1) + "(" + r(1));
  EXPECT_EQ(text::utf8_lossy("\xC0\x80"), r(2));      // overlong lead never starts a char
  EXPECT_EQ(text::utf8_lossy("\xED\xA0\x80"), r(3));  // surrogate: ED then two strays
  EXPECT_EQ(text::utf8_lossy("\xF0\x9F\x98"), r(1));
  EXPECT_EQ(text::utf8_lossy("\xF4\x90\x80\x80"), r(4));  // above U+10FFFF
  EXPECT_EQ(text::utf8_lossy("\xFF\xFE"), r(2));
  EXPECT_FALSE(text::is_valid_utf8("\xE2\x82"));
  EXPECT_TRUE(text::is_valid_utf8("\xF0\x9F\x98\x80"));
}

// Any chunking of the input gives the same output as the one-shot function.
TEST(Utf8Lossy, StreamEqualsOneShot) {
  const std::string cases[] = {
      "a\xE2\x82\xAC"
      "b",
      "\xE2\x82",
      "\xE2(\xA1",
      "\xF0\x9F\x98\x80\xF0\x9F",
      "\xED\xA0\x80z",
      "\xC3\xA9\xC3",
      "\x80\x80\xE2\x82\xE2\x82\xAC"};
  for (const auto& s : cases) {
    for (size_t cut = 0; cut <= s.size(); ++cut) {
      text::Utf8Stream st;
      std::string out;
      st.push(std::string_view(s).substr(0, cut), out);
      EXPECT_TRUE(text::is_valid_utf8(out));
      st.push(std::string_view(s).substr(cut), out);
      st.finish(out);
      EXPECT_EQ(out, text::utf8_lossy(s)) << "cut " << cut;
    }
    text::Utf8Stream st;
    std::string out;
    for (char c : s) st.push(std::string_view(&c, 1), out);
    st.finish(out);
    EXPECT_EQ(out, text::utf8_lossy(s));
  }
}

// Byte-level BPE: the bytes of "€" arrive as three tokens; nothing is
// emitted until the character is complete.
TEST(IncrementalDecoder, HoldsSplitCharacterByteLevel) {
  const Tokenizer* tok = load_tokenizer("llama3");
  if (tok == nullptr) GTEST_SKIP();
  auto byte_token = [&](int b) {
    std::string s;
    text::append_utf8(s, text::byte_to_unicode()[b]);
    return *tok->token_id(s);
  };
  const int32_t e2 = byte_token(0xE2), x82 = byte_token(0x82), xac = byte_token(0xAC);
  const int32_t a = *tok->token_id("a");
  IncrementalDecoder dec(*tok);
  EXPECT_EQ(dec.push(a), "a");
  EXPECT_EQ(dec.push(e2), "");
  EXPECT_TRUE(dec.has_pending());
  EXPECT_EQ(dec.push(x82), "");
  EXPECT_EQ(dec.push(xac), "\xE2\x82\xAC");
  EXPECT_FALSE(dec.has_pending());
  // A broken sequence is replaced as soon as it is known to be broken.
  EXPECT_EQ(dec.push(e2), "");
  EXPECT_EQ(dec.push(a), std::string(kR) + "a");
  // An unfinished character at the end becomes one U+FFFD on flush.
  EXPECT_EQ(dec.push(e2), "");
  EXPECT_EQ(dec.push(x82), "");
  EXPECT_EQ(dec.flush(), kR);
  dec.reset();
  EXPECT_EQ(dec.push(a), "a");
}

// Byte fallback: a run of <0xXX> tokens is judged as a whole when it ends.
TEST(IncrementalDecoder, ByteFallbackRuns) {
  const Tokenizer* tok = load_tokenizer("gemma3");
  if (tok == nullptr) GTEST_SKIP();
  const int32_t e2 = *tok->token_id("<0xE2>"), x82 = *tok->token_id("<0x82>"), xac = *tok->token_id("<0xAC>");
  const int32_t the = *tok->token_id("\xE2\x96\x81the");
  IncrementalDecoder dec(*tok);
  EXPECT_EQ(dec.push(the), " the");
  EXPECT_EQ(dec.push(e2), "");
  EXPECT_EQ(dec.push(x82), "");
  EXPECT_EQ(dec.push(xac), "");
  EXPECT_EQ(dec.push(the), "\xE2\x82\xAC the");
  // An invalid run becomes one U+FFFD per byte (tokenizers' ByteFallback).
  EXPECT_EQ(dec.push(e2), "");
  EXPECT_EQ(dec.push(x82), "");
  EXPECT_EQ(dec.flush(), r(2));
  EXPECT_EQ(tok->decode(std::vector<int32_t>{e2, x82, the}, true), r(2) + " the");
}

TEST(IncrementalDecoder, SkipsSpecialTokensOnRequest) {
  const Tokenizer* tok = load_tokenizer("qwen3");
  if (tok == nullptr) GTEST_SKIP();
  const auto ids = tok->encode("<|im_start|>assistant\nHi<|im_end|>", false, true);
  IncrementalDecoder skip(*tok, true), keep(*tok, false);
  std::string a, b;
  for (int32_t id : ids) skip.push(id, a), keep.push(id, b);
  skip.flush(a), keep.flush(b);
  EXPECT_EQ(a, "assistant\nHi");
  EXPECT_EQ(b, "<|im_start|>assistant\nHi<|im_end|>");
  // Out-of-range ids are ignored, not fatal.
  EXPECT_EQ(skip.push(-5), "");
  EXPECT_EQ(skip.push(tok->n_vocab() + 3), "");
}

// Every prefix of a long mixed-script encoding streams to the same text.
TEST(IncrementalDecoder, AllModelsAllPrefixes) {
  const std::string text = "Héllo 世界 👨‍👩‍👧 <think> ok\n\tend";
  for (const char* name : {"llama3", "qwen3", "gemma3", "smollm2"}) {
    const Tokenizer* tok = load_tokenizer(name);
    if (tok == nullptr) continue;
    const auto ids = tok->encode(text, true, true);
    for (size_t n = 0; n <= ids.size(); ++n) {
      std::vector<int32_t> prefix(ids.begin(), ids.begin() + n);
      IncrementalDecoder dec(*tok, false);
      std::string out;
      for (int32_t id : prefix) {
        const size_t before = out.size();
        dec.push(id, out);
        EXPECT_TRUE(text::is_valid_utf8(std::string_view(out).substr(before)));
      }
      dec.flush(out);
      EXPECT_EQ(out, tok->decode(prefix, false)) << name << " prefix " << n;
    }
  }
}

}  // namespace
}  // namespace rill
