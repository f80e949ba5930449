#pragma once
// Tokenizer: text <-> token ids, exactly as the reference implementations do
// it: Hugging Face `tokenizers` for tokenizer.json files (byte-level BPE such
// as Llama-3 and Qwen3; SentencePiece-style BPE with byte fallback such as
// Gemma 3) and llama.cpp for GGUF vocabularies ("gpt2" byte-level BPE with
// the named pre-tokenizer, "llama" SentencePiece merging by score).
//
// Encoding: added/special tokens are cut out first (special ones only when
// parse_special), then each remaining segment is normalized, pre-tokenized
// and run through the model. Invalid UTF-8 input is first made valid (each
// ill-formed subpart becomes U+FFFD). Decoding returns valid UTF-8 with the
// reference's replacement rules; see IncrementalDecoder for streaming.
// A Tokenizer is immutable after loading and safe to use from many threads.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/result.h"
#include "text/bpe.h"
#include "text/pretokenizer.h"
#include "text/special_tokens.h"
#include "text/wordpiece.h"

namespace rill {

class GgufFile;

class Tokenizer {
 public:
  // Reads tokenizer.json (plain JSON) and, when present beside it,
  // tokenizer_config.json (bos/eos token strings, add_bos_token).
  static Result<std::unique_ptr<Tokenizer>> from_tokenizer_json(const std::string& path);
  // Reads the tokenizer.ggml.* metadata of a GGUF file.
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const GgufFile& gguf);

  // `add_special`: add BOS/EOS the way the reference does for this model
  // (tokenizer.json post_processor, GGUF add_bos/add_eos). `parse_special`:
  // recognise special tokens written in the text; non-special added tokens
  // (e.g. Qwen's <think>) are always recognised, as in the references.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;
  // `skip_special`: drop special tokens (tokenizers' skip_special_tokens;
  // llama.cpp control tokens). Ids outside the vocabulary are ignored.
  std::string decode(std::span<const int32_t> ids, bool skip_special) const;
  // The raw bytes one token stands for (a byte-fallback token gives its
  // byte; a special token its text). Empty for an id outside the vocabulary.
  std::string token_to_piece(int32_t id) const;

  int32_t n_vocab() const { return static_cast<int32_t>(token_text_.size()); }
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  // Id of a token given its text as stored in the vocabulary (byte-level
  // form for byte-level BPE, e.g. "Ġthe"), added tokens included.
  std::optional<int32_t> token_id(std::string_view token_text) const;
  // The token's text as stored in the vocabulary.
  std::string_view token_text(int32_t id) const;
  bool is_special(int32_t id) const;
  // Tokens that end generation: EOS plus the end-of-turn tokens the
  // vocabulary declares (<|eot_id|>, <|im_end|>, <end_of_turn>, ...).
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  // Stable hash of the vocabulary, merges/scores, added tokens and the
  // algorithm settings (for cache namespaces), as 16 hex digits.
  const std::string& fingerprint() const { return fingerprint_; }

 private:
  friend class IncrementalDecoder;
  Tokenizer() = default;

  enum class ModelKind { kBpe, kSpm, kWordPiece };
  // How token pieces combine into text. kByteStream: concatenate bytes, then
  // replace ill-formed UTF-8 (ByteLevel decoder, llama.cpp). kByteFallbackRuns:
  // a run of <0xXX> tokens is kept if valid UTF-8, else each byte becomes
  // U+FFFD (tokenizers' ByteFallback decoder).
  enum class DecodeStyle { kByteStream, kByteFallbackRuns };
  // kFirstToken: llama.cpp drops one leading space of the first token's
  // piece unless that token is BOS. kOutputStart: one leading space of the
  // whole text is dropped (tokenizers' Strip / Metaspace decoders).
  enum class LeadingSpace { kKeep, kFirstToken, kOutputStart };
  struct NormalizerStep {
    enum class Kind { kNfc, kReplace, kPrepend } kind;
    std::string from, to;
  };
  enum TokenFlag : uint8_t { kSpecial = 1 };

  // `is_first`: the segment starts the input; `after_token_or_start`: it
  // follows a token or starts the input (llama.cpp SPM space prefix).
  void encode_segment(std::string_view text, bool is_first, bool after_token_or_start, std::vector<int32_t>& out) const;
  std::string normalize(std::string_view text) const;
  // Fills the decoding tables from token_text_ and the flags.
  void set_piece(int32_t id, std::string_view piece, int byte_value);
  // eos_ids_ = EOS plus the end-of-turn tokens present in the vocabulary.
  void finish_eos_ids();
  // tokenizer.json with a WordPiece model: its options from the model and
  // the BertNormalizer; errors name `path`.
  Status load_wordpiece(const nlohmann::json& root, const std::string& path);
  // Common checks after loading; errors name `where`.
  Status validate(const std::string& where) const;

  ModelKind model_kind_ = ModelKind::kBpe;
  text::TokenIndex vocab_;               // model vocabulary: text -> id
  std::vector<std::string> token_text_;  // [n_vocab] text as stored
  std::unique_ptr<text::BpeModel> bpe_;
  std::unique_ptr<text::SpmModel> spm_;
  std::unique_ptr<text::WordPieceModel> wordpiece_;  // kWordPiece: normalizes and splits itself
  std::string wordpiece_prefix_;                     // its continuing_subword_prefix ("##")
  std::vector<NormalizerStep> normalizer_;
  text::PreTokenizer pre_tokenizer_;
  text::AddedTokenMatcher added_;
  text::TokenIndex added_index_;                  // added token text -> id
  bool spm_add_space_prefix_ = false;             // llama.cpp SPM: " " before text after a token
  std::vector<int32_t> prefix_ids_, suffix_ids_;  // added when add_special

  DecodeStyle decode_style_ = DecodeStyle::kByteStream;
  LeadingSpace leading_space_ = LeadingSpace::kKeep;
  std::string pieces_;                   // all pieces, concatenated
  std::vector<uint32_t> piece_offsets_;  // [n_vocab + 1] into pieces_
  std::vector<int16_t> byte_value_;      // [n_vocab] byte of a <0xXX> token or -1
  std::vector<uint8_t> flags_;           // [n_vocab] TokenFlag bits

  std::optional<int32_t> bos_id_, eos_id_;
  std::vector<int32_t> eos_ids_;
  std::string fingerprint_;
};

}  // namespace rill
