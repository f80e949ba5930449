#include "text/tokenizer.h"

#include <algorithm>

#include "text/detokenizer.h"
#include "text/unicode.h"

namespace rill {

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::string sanitized;
  if (!text::is_valid_utf8(text)) {
    sanitized = text::utf8_lossy(text);
    text = sanitized;
  }
  std::vector<int32_t> out;
  if (add_special) out = prefix_ids_;
  std::vector<text::Fragment> fragments;
  added_.split(text, parse_special, fragments);
  bool after_token_or_start = true;
  for (const auto& f : fragments) {
    if (f.id >= 0) {
      out.push_back(f.id);
      after_token_or_start = true;
    } else {
      encode_segment(f.text, f.text.data() == text.data(), after_token_or_start, out);
      after_token_or_start = false;
    }
  }
  if (add_special) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
  return out;
}

std::string Tokenizer::normalize(std::string_view text) const {
  std::string s(text);
  for (const auto& step : normalizer_) {
    switch (step.kind) {
      case NormalizerStep::Kind::kNfc:
        s = text::nfc(s);
        break;
      case NormalizerStep::Kind::kReplace: {
        if (step.from.empty() || s.find(step.from) == std::string::npos) break;
        std::string r;
        r.reserve(s.size() + s.size() / 2);
        size_t pos = 0;
        for (size_t m = s.find(step.from); m != std::string::npos; m = s.find(step.from, pos)) {
          r.append(s, pos, m - pos).append(step.to);
          pos = m + step.from.size();
        }
        r.append(s, pos, std::string::npos);
        s = std::move(r);
        break;
      }
      case NormalizerStep::Kind::kPrepend:
        if (!s.empty()) s.insert(0, step.to);
        break;
    }
  }
  return s;
}

void Tokenizer::encode_segment(std::string_view text, bool is_first, bool after_token_or_start,
                               std::vector<int32_t>& out) const {
  if (model_kind_ == ModelKind::kWordPiece) {
    wordpiece_->encode(text, out);
    return;
  }
  if (model_kind_ == ModelKind::kSpm) {
    std::string escaped;
    if (spm_add_space_prefix_ && after_token_or_start) escaped = "\xE2\x96\x81";
    for (char c : text) {
      if (c == ' ')
        escaped += "\xE2\x96\x81";
      else
        escaped += c;
    }
    spm_->encode(escaped, out);
    return;
  }
  const std::string normalized = normalize(text);
  if (normalized.empty()) return;
  if (pre_tokenizer_.empty()) {
    bpe_->encode_word(normalized, out);
    return;
  }
  std::vector<std::string> pieces;
  pre_tokenizer_.split(normalized, is_first, pieces);
  for (const auto& piece : pieces) bpe_->encode_word(piece, out);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  IncrementalDecoder decoder(*this, skip_special);
  std::string out;
  for (int32_t id : ids) decoder.push(id, out);
  decoder.flush(out);
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id) const {
  if (id < 0 || id >= n_vocab()) return {};
  return pieces_.substr(piece_offsets_[id], piece_offsets_[id + 1] - piece_offsets_[id]);
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token_text) const {
  if (auto id = text::find_token(added_index_, token_text)) return id;
  return text::find_token(vocab_, token_text);
}

std::string_view Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= n_vocab()) return {};
  return token_text_[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < n_vocab() && (flags_[id] & kSpecial);
}

// Pieces must be set in id order 0..n_vocab-1.
void Tokenizer::set_piece(int32_t id, std::string_view piece, int byte_value) {
  if (id == 0) {
    pieces_.clear();
    piece_offsets_.assign(1, 0);
    byte_value_.clear();
  }
  pieces_.append(piece);
  piece_offsets_.push_back(static_cast<uint32_t>(pieces_.size()));
  byte_value_.push_back(static_cast<int16_t>(byte_value));
}

void Tokenizer::finish_eos_ids() {
  eos_ids_.clear();
  if (eos_id_) eos_ids_.push_back(*eos_id_);
  // The end-of-turn names llama.cpp recognises, plus the common EOS names.
  static constexpr std::string_view kEndNames[] = {"<|eot_id|>",    "<|im_end|>", "<|end|>", "<end_of_turn>",
                                                   "<|endoftext|>", "<|eom_id|>", "<EOT>",   "<|end_of_text|>",
                                                   "<eos>",         "</s>"};
  for (auto name : kEndNames) {
    auto id = token_id(name);
    if (id && std::find(eos_ids_.begin(), eos_ids_.end(), *id) == eos_ids_.end()) eos_ids_.push_back(*id);
  }
}

Status Tokenizer::validate(const std::string& where) const {
  const size_t n = token_text_.size();
  if (n == 0) return Error{where + ": the vocabulary is empty"};
  if (piece_offsets_.size() != n + 1 || byte_value_.size() != n || flags_.size() != n)
    return Error{where + ": internal error building the decoding tables"};
  for (const auto& id : {bos_id_, eos_id_})
    if (id && (*id < 0 || static_cast<size_t>(*id) >= n))
      return Error{where + ": special token id " + std::to_string(*id) + " is outside the vocabulary"};
  for (int32_t id : prefix_ids_)
    if (id < 0 || static_cast<size_t>(id) >= n) return Error{where + ": BOS/prefix token outside the vocabulary"};
  for (int32_t id : suffix_ids_)
    if (id < 0 || static_cast<size_t>(id) >= n) return Error{where + ": EOS/suffix token outside the vocabulary"};
  return Status::Ok();
}

}  // namespace rill
