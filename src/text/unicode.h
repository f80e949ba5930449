#pragma once
// UTF-8 helpers shared by the tokenizers and the detokenizer: decoding with
// the exact replacement rules of the references, the GPT-2 byte-level
// alphabet, and NFC normalization.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace rill::text {

inline constexpr uint32_t kReplacementChar = 0xFFFD;
inline constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

// Appends the UTF-8 encoding of `cp` (must be a Unicode scalar value).
void append_utf8(std::string& out, uint32_t cp);

// Length of the longest prefix of `s` (at most 4 bytes) that is the start of
// a well-formed UTF-8 sequence, and whether that prefix is a complete
// character. `valid_prefix_len == 0` means s[0] can start no character.
struct Utf8Probe {
  size_t valid_prefix_len = 0;
  bool complete = false;
  uint32_t cp = 0;  // meaningful only when complete
};
Utf8Probe probe_utf8(std::string_view s);

bool is_valid_utf8(std::string_view s);

// Converts arbitrary bytes to valid UTF-8 the way Rust's
// String::from_utf8_lossy and Python's bytes.decode(errors="replace") do:
// each maximal ill-formed subpart becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// Streaming form of utf8_lossy: feed bytes in any chunking; the concatenated
// output equals utf8_lossy of the concatenated input after finish(). Never
// emits part of a character: an incomplete tail is held back.
class Utf8Stream {
 public:
  // Appends to `out` all text that is final given the bytes seen so far.
  void push(std::string_view bytes, std::string& out);
  // Ends the stream: a held incomplete sequence becomes one U+FFFD.
  void finish(std::string& out);
  bool has_pending() const { return n_pending_ > 0; }

 private:
  char pending_[4] = {};
  size_t n_pending_ = 0;
};

// GPT-2 byte-level alphabet: every byte maps to one printable code point.
const std::array<uint32_t, 256>& byte_to_unicode();
// Inverse of byte_to_unicode; -1 for code points outside the alphabet.
int unicode_to_byte(uint32_t cp);
// Maps each byte of `bytes` to its byte-level character (as UTF-8).
void append_byte_level(std::string& out, std::string_view bytes);

// Unicode NFC of valid UTF-8 `s` (returns `s` unchanged if utf8proc fails).
std::string nfc(std::string_view s);

}  // namespace rill::text
