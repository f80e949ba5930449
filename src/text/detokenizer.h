#pragma once
// IncrementalDecoder: turns a stream of generated token ids into text
// deltas. Guarantees: every delta is valid UTF-8 and never ends inside a
// character; the concatenation of all push() results and flush() equals
// Tokenizer::decode() of all ids (with the same skip_special) byte for byte.
// Bytes that may still become part of a character (a split multi-byte
// character, an unfinished run of <0xXX> byte-fallback tokens) are held back
// until the character completes or flush() is called.
#include <cstdint>
#include <string>

#include "text/tokenizer.h"
#include "text/unicode.h"

namespace rill {

class IncrementalDecoder {
 public:
  // `tokenizer` must outlive the decoder.
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = true);

  // Appends to `out` the text that became final with `id`.
  void push(int32_t id, std::string& out);
  std::string push(int32_t id) {
    std::string out;
    push(id, out);
    return out;
  }
  // Ends the stream: held bytes are released (ill-formed ones as U+FFFD).
  void flush(std::string& out);
  std::string flush() {
    std::string out;
    flush(out);
    return out;
  }
  // Starts a new stream.
  void reset();

  // True while some bytes are held back.
  bool has_pending() const { return !run_.empty() || utf8_.has_pending(); }

 private:
  void mark_output(std::string& out, size_t before);
  void flush_run(std::string& out);

  const Tokenizer* tok_;
  bool skip_special_;
  text::Utf8Stream utf8_;
  std::string run_;  // pending byte-fallback bytes (kByteFallbackRuns)
  size_t n_pushed_ = 0;
  bool output_started_ = false;
};

}  // namespace rill
