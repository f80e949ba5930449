#include "text/detokenizer.h"

namespace rill {

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tok_(&tokenizer), skip_special_(skip_special) {}

void IncrementalDecoder::reset() {
  utf8_ = text::Utf8Stream();
  run_.clear();
  n_pushed_ = 0;
  output_started_ = false;
}

// Every append to `out` is followed by this, so kOutputStart sees the true
// start of the text.
void IncrementalDecoder::mark_output(std::string& out, size_t before) {
  if (output_started_ || out.size() == before) return;
  output_started_ = true;
  if (tok_->leading_space_ == Tokenizer::LeadingSpace::kOutputStart && out[before] == ' ') out.erase(before, 1);
}

void IncrementalDecoder::flush_run(std::string& out) {
  if (run_.empty()) return;
  const size_t before = out.size();
  if (text::is_valid_utf8(run_)) {
    out += run_;
  } else {
    for (size_t k = 0; k < run_.size(); ++k) out += text::kReplacementUtf8;
  }
  run_.clear();
  mark_output(out, before);
}

void IncrementalDecoder::push(int32_t id, std::string& out) {
  const Tokenizer& t = *tok_;
  const bool first = n_pushed_++ == 0;
  if (id < 0 || id >= t.n_vocab()) return;
  if (skip_special_ && (t.flags_[id] & Tokenizer::kSpecial)) return;
  std::string_view piece(t.pieces_.data() + t.piece_offsets_[id], t.piece_offsets_[id + 1] - t.piece_offsets_[id]);
  if (first && t.leading_space_ == Tokenizer::LeadingSpace::kFirstToken && id != t.bos_id_ && !piece.empty() &&
      piece[0] == ' ')
    piece.remove_prefix(1);

  if (t.decode_style_ == Tokenizer::DecodeStyle::kByteFallbackRuns) {
    if (t.byte_value_[id] >= 0) {
      run_.push_back(static_cast<char>(t.byte_value_[id]));
      return;
    }
    flush_run(out);
    const size_t before = out.size();
    out += piece;  // pieces of non-byte tokens are valid UTF-8
    mark_output(out, before);
    return;
  }
  const size_t before = out.size();
  utf8_.push(piece, out);
  mark_output(out, before);
}

void IncrementalDecoder::flush(std::string& out) {
  flush_run(out);
  const size_t before = out.size();
  utf8_.finish(out);
  mark_output(out, before);
}

}  // namespace rill
