#include "text/wordpiece.h"

#include <utf8proc.h>

#include "text/unicode.h"

namespace rill::text {
namespace {

// Decodes the next code point of valid UTF-8 at s[i]; advances i.
uint32_t next_cp(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i);
  utf8proc_int32_t cp = 0;
  const utf8proc_ssize_t n = utf8proc_iterate(p, static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
  if (n <= 0) {  // not reached for valid input; skip a byte
    ++i;
    return 0xFFFD;
  }
  i += static_cast<size_t>(n);
  return static_cast<uint32_t>(cp);
}

utf8proc_category_t category(uint32_t cp) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(cp));
}

// Unicode's White_Space property (Rust's char::is_whitespace).
bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// tokenizers' is_control: "other" categories (Cc, Cf, Cn, Co), except the
// white space characters \t \n \r.
bool is_control(uint32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  const utf8proc_category_t k = category(c);
  return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CN ||
         k == UTF8PROC_CATEGORY_CO;
}

// The CJK Unified Ideographs blocks BERT splits around (not kana or hangul).
bool is_chinese_char(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

bool is_punctuation(uint32_t c) {
  if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  const utf8proc_category_t k = category(c);
  return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

std::string map_code_points(std::string_view s, const auto& fn) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) fn(next_cp(s, i), out);
  return out;
}

}  // namespace

std::string WordPieceModel::normalize(std::string_view text) const {
  std::string s(text);
  if (options_.clean_text) {
    s = map_code_points(s, [](uint32_t c, std::string& out) {
      if (c == 0 || c == 0xFFFD || is_control(c)) return;
      append_utf8(out, is_white_space(c) ? ' ' : c);
    });
  }
  if (options_.handle_chinese_chars) {
    s = map_code_points(s, [](uint32_t c, std::string& out) {
      if (!is_chinese_char(c)) return append_utf8(out, c);
      out += ' ';
      append_utf8(out, c);
      out += ' ';
    });
  }
  if (options_.strip_accents) {
    utf8proc_uint8_t* nfd = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &nfd,
                     static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
    if (n >= 0 && nfd != nullptr) s.assign(reinterpret_cast<const char*>(nfd), static_cast<size_t>(n));
    std::free(nfd);
    s = map_code_points(s, [](uint32_t c, std::string& out) {
      if (category(c) != UTF8PROC_CATEGORY_MN) append_utf8(out, c);
    });
  }
  if (options_.lowercase) {
    s = map_code_points(s, [](uint32_t c, std::string& out) {
      append_utf8(out, static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    });
  }
  return s;
}

void WordPieceModel::encode(std::string_view text, std::vector<int32_t>& out) const {
  const std::string s = normalize(text);
  // BertPreTokenizer: words end at white space (dropped) and at punctuation
  // (kept, one character a word).
  size_t word = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    const uint32_t c = next_cp(s, i);
    const bool space = is_white_space(c), punct = !space && is_punctuation(c);
    if (!space && !punct) continue;
    if (at > word) encode_word(std::string_view(s).substr(word, at - word), out);
    if (punct) encode_word(std::string_view(s).substr(at, i - at), out);
    word = i;
  }
  if (word < s.size()) encode_word(std::string_view(s).substr(word), out);
}

void WordPieceModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  // Character boundaries of the word.
  std::vector<size_t> bounds;
  for (size_t i = 0; i < word.size();) {
    bounds.push_back(i);
    next_cp(word, i);
  }
  bounds.push_back(word.size());
  const size_t n_chars = bounds.size() - 1;
  if (static_cast<int64_t>(n_chars) > options_.max_input_chars_per_word) {
    out.push_back(options_.unk_id);
    return;
  }
  const size_t mark = out.size();
  std::string piece;
  for (size_t start = 0; start < n_chars;) {
    size_t end = n_chars;
    std::optional<int32_t> id;
    for (; end > start; --end) {
      piece.clear();
      if (start > 0) piece = options_.continuing_subword_prefix;
      piece.append(word.substr(bounds[start], bounds[end] - bounds[start]));
      if ((id = vocab_.find(piece))) break;
    }
    if (!id) {
      out.resize(mark);
      out.push_back(options_.unk_id);
      return;
    }
    out.push_back(*id);
    start = end;
  }
}

}  // namespace rill::text
