#pragma once
// WordPiece: the BERT tokenizer as Hugging Face `tokenizers` runs it for a
// tokenizer.json whose model is "WordPiece" (BertNormalizer, BertPreTokenizer,
// WordPiece), e.g. all-MiniLM-L6-v2:
//  - normalize: drop NUL, U+FFFD and control characters (Cc/Cf/Cn/Co but
//    \t \n \r), map white space to ' ' (clean_text); surround CJK ideographs
//    with spaces (handle_chinese_chars); NFD and drop nonspacing marks
//    (strip_accents, which defaults to lowercase); lowercase;
//  - pre-tokenize: split at white space, and split off every punctuation
//    character (ASCII punctuation or a Unicode P* category) as a word;
//  - each word: greedy longest match from the start, continuation pieces
//    looked up with the "##" prefix; a word with a piece that matches
//    nothing, or longer than max_input_chars_per_word characters, is the
//    unknown token.
// Immutable after construction; safe from many threads.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/token_index.h"

namespace rill::text {

struct WordPieceOptions {
  bool clean_text = true;
  bool handle_chinese_chars = true;
  bool strip_accents = true;
  bool lowercase = true;
  std::string continuing_subword_prefix = "##";
  int32_t max_input_chars_per_word = 100;
  int32_t unk_id = -1;  // the unknown token; required
};

class WordPieceModel {
 public:
  // `vocab` maps token text to id (the same index the Tokenizer keeps).
  WordPieceModel(const TokenIndex& vocab, WordPieceOptions options) : vocab_(vocab), options_(std::move(options)) {}

  // Normalizes, pre-tokenizes and appends the ids of `text` (valid UTF-8).
  void encode(std::string_view text, std::vector<int32_t>& out) const;
  // The BertNormalizer step alone (exposed for tests).
  std::string normalize(std::string_view text) const;

 private:
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  const TokenIndex& vocab_;
  WordPieceOptions options_;
};

}  // namespace rill::text
