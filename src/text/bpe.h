#pragma once
// BPE models. BpeModel follows tokenizers' BPE exactly (merges applied by
// rank, leftmost first, byte fallback, unk fusing, ignore_merges); it serves
// tokenizer.json files and GGUF "gpt2" vocabularies. SpmModel is llama.cpp's
// SentencePiece merge-by-score tokenizer for GGUF "llama" vocabularies.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "text/token_index.h"

namespace rill::text {

struct BpeOptions {
  bool byte_fallback = false;
  std::optional<int32_t> unk_id;
  bool fuse_unk = false;
  bool ignore_merges = false;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
};

class BpeModel {
 public:
  // `vocab` maps token text to id. Merges are added afterwards in rank order.
  BpeModel(const TokenIndex* vocab, BpeOptions options);

  // Adds the merge (left, right) with priority `rank` (lower merges first).
  // A repeated pair keeps the last rank when `replace` (tokenizers builds a
  // map from the list), else the first (llama.cpp). Errors name `where` when
  // a part or the merged token is not in the vocabulary.
  Status add_merge(std::string_view left, std::string_view right, int32_t rank, bool replace, const std::string& where);
  size_t n_merges() const { return merges_.size(); }
  void reserve_merges(size_t n) { merges_.reserve(n); }

  // Appends the ids of one pre-tokenized word.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

 private:
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  const TokenIndex* vocab_;
  BpeOptions options_;
  PairMap merges_;                       // (left id, right id) -> (rank, merged id)
  std::array<int32_t, 256> byte_ids_{};  // "<0xXX>" token ids, -1 when absent
};

// llama.cpp's SPM tokenizer: repeatedly merges the adjacent pair whose
// concatenation is the highest-scoring vocabulary entry, then re-segments
// pieces that are not tokens; unknown bytes become <0xXX> tokens.
class SpmModel {
 public:
  SpmModel(const TokenIndex* vocab, std::vector<float> scores, std::optional<int32_t> unk_id);
  // `text` has spaces already escaped to U+2581.
  void encode(std::string_view text, std::vector<int32_t>& out) const;

 private:
  const TokenIndex* vocab_;
  std::vector<float> scores_;
  std::optional<int32_t> unk_id_;
  std::array<int32_t, 256> byte_ids_{};
};

}  // namespace rill::text
