#include "text/json_call_reader.h"

#include <nlohmann/json.hpp>

#include "core/json_parse.h"

namespace rill {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

bool is_number_char(char c) {
  return is_digit(c) || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// RFC 8259 number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
bool is_json_number(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  if (i < n && s[i] == '-') ++i;
  if (i >= n) return false;
  if (s[i] == '0') {
    ++i;
  } else if (is_digit(s[i])) {
    while (i < n && is_digit(s[i])) ++i;
  } else {
    return false;
  }
  if (i < n && s[i] == '.') {
    const size_t first = ++i;
    while (i < n && is_digit(s[i])) ++i;
    if (i == first) return false;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < n && (s[i] == '+' || s[i] == '-')) ++i;
    const size_t first = i;
    while (i < n && is_digit(s[i])) ++i;
    if (i == first) return false;
  }
  return i == n;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// The code point as nlohmann's dump writes it inside a string
// (ensure_ascii off: only '"', '\' and control characters are escaped).
void append_escaped(std::string& out, uint32_t cp) {
  switch (cp) {
    case '"':
      out += "\\\"";
      return;
    case '\\':
      out += "\\\\";
      return;
    case '\b':
      out += "\\b";
      return;
    case '\f':
      out += "\\f";
      return;
    case '\n':
      out += "\\n";
      return;
    case '\r':
      out += "\\r";
      return;
    case '\t':
      out += "\\t";
      return;
    default:
      break;
  }
  if (cp < 0x20) {
    static constexpr char kHex[] = "0123456789abcdef";
    out += "\\u00";
    out += kHex[cp >> 4];
    out += kHex[cp & 0xF];
    return;
  }
  append_utf8(out, cp);
}

}  // namespace

size_t JsonCallReader::read(std::string_view text) {
  size_t i = 0;
  for (; i < text.size() && status_ == Status::kReading; ++i) {
    if (!step(text[i])) {
      status_ = Status::kInvalid;
      return i;
    }
  }
  return i;
}

void JsonCallReader::finish() {
  if (status_ == Status::kReading) status_ = Status::kInvalid;
}

std::string JsonCallReader::take_arguments() {
  std::string piece = arguments_.substr(n_taken_);
  n_taken_ = arguments_.size();
  return piece;
}

bool JsonCallReader::step(char c) {
  if (in_string_) return string_byte(static_cast<unsigned char>(c));
  if (!number_.empty()) {
    if (is_number_char(c)) {
      number_ += c;
      return true;
    }
    if (!number_end()) return false;  // then c is read as what follows the number
  }
  if (!literal_.empty()) {
    if (c != literal_[literal_pos_]) return false;
    if (++literal_pos_ < literal_.size()) return true;
    if (capturing()) arguments_ += literal_;
    literal_.clear();
    return end_value();
  }
  if (is_space(c)) return true;
  auto close = [&](char open) {
    if (stack_.empty() || stack_.back() != open) return false;
    const bool closes_arguments = capture_depth_ == stack_.size();
    if (capturing()) arguments_ += c;
    stack_.pop_back();
    if (closes_arguments) {
      capture_depth_ = 0;
      if (arguments_only_) return complete_arguments_only();
    }
    if (stack_.empty()) {
      complete_object();
      return true;
    }
    return end_value();
  };
  auto begin_key = [&] {
    in_string_ = string_is_key_ = true;
    sink_ = stack_.size() == 1 ? Sink::kKey : capturing() ? Sink::kArgumentsJson : Sink::kNone;
    if (sink_ == Sink::kArgumentsJson) arguments_ += '"';
    key_.clear();
    return true;
  };
  switch (expect_) {
    case Expect::kObjectOpen:
      if (arguments_only_) {
        if (c != '{' && c != '"') return false;
        stack_.push_back('{');  // the value sits where a call object's arguments would
        value_role_ = Role::kArguments;
        name_done_ = true;
        return begin_value(c);
      }
      if (c != '{') return false;
      stack_.push_back('{');
      expect_ = Expect::kKeyOrClose;
      return true;
    case Expect::kKeyOrClose:
      if (c == '}') return close('{');
      [[fallthrough]];
    case Expect::kKey:
      return c == '"' && begin_key();
    case Expect::kColon:
      if (c != ':') return false;
      if (capturing()) arguments_ += c;
      expect_ = Expect::kValue;
      return true;
    case Expect::kValueOrClose:
      if (c == ']') return close('[');
      [[fallthrough]];
    case Expect::kValue:
      return begin_value(c);
    case Expect::kCommaOrClose:
      if (c == '}') return close('{');
      if (c == ']') return close('[');
      if (c != ',') return false;
      if (capturing()) arguments_ += c;
      expect_ = stack_.back() == '{' ? Expect::kKey : Expect::kValue;
      return true;
    case Expect::kDone:
      return false;
  }
  return false;
}

bool JsonCallReader::begin_value(char c) {
  const Role role = stack_.size() == 1 ? value_role_ : Role::kOther;
  if (role == Role::kName && c != '"') return false;
  if (role == Role::kArguments) {
    if (c == '{') {
      stack_.push_back('{');
      capture_depth_ = stack_.size();
      arguments_ += '{';
      arguments_begun_ = true;
      expect_ = Expect::kKeyOrClose;
      update_is_call();
      return true;
    }
    if (c == '"') {
      in_string_ = true;
      string_is_key_ = false;
      sink_ = Sink::kArgumentsText;
      arguments_begun_ = true;
      update_is_call();
      return true;
    }
    if (c != 'n') return false;  // an array, a number or a boolean is no arguments
    arguments_null_ = true;
  }
  switch (c) {
    case '{':
    case '[':
      if (stack_.size() >= size_t(kMaxJsonDepth)) return false;
      if (capturing()) arguments_ += c;
      stack_.push_back(c);
      expect_ = c == '{' ? Expect::kKeyOrClose : Expect::kValueOrClose;
      return true;
    case '"':
      in_string_ = true;
      string_is_key_ = false;
      sink_ = role == Role::kName ? Sink::kName : capturing() ? Sink::kArgumentsJson : Sink::kNone;
      if (sink_ == Sink::kArgumentsJson) arguments_ += '"';
      return true;
    case 't':
      literal_ = "true";
      break;
    case 'f':
      literal_ = "false";
      break;
    case 'n':
      literal_ = "null";
      break;
    default:
      if (c != '-' && !is_digit(c)) return false;
      number_.assign(1, c);
      return true;
  }
  literal_pos_ = 1;
  return true;
}

bool JsonCallReader::end_value() {
  expect_ = stack_.empty() ? Expect::kDone : Expect::kCommaOrClose;
  return true;
}

bool JsonCallReader::number_end() {
  if (!is_json_number(number_)) return false;
  if (capturing()) {
    // nlohmann's own formatting, so the text is what its dump would give.
    const auto value = nlohmann::ordered_json::parse(number_, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) return false;
    arguments_ += value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  }
  number_.clear();
  return end_value();
}

bool JsonCallReader::string_byte(unsigned char c) {
  if (escape_ > 0) return escape_byte(char(c));
  if (utf8_need_ > 0) {
    if (c < utf8_lo_ || c > utf8_hi_) return false;
    utf8_ += char(c);
    utf8_lo_ = 0x80;
    utf8_hi_ = 0xBF;
    if (--utf8_need_ > 0) return true;
    emit_bytes(utf8_);
    utf8_.clear();
    return true;
  }
  if (want_low_ && c != '\\') return false;
  if (c == '\\') {
    escape_ = 1;
    return true;
  }
  if (c == '"') return string_end();
  if (c < 0x20) return false;
  if (c < 0x80) {
    emit_codepoint(c);
    return true;
  }
  // The lead byte of a multi-byte character (RFC 3629's well-formed table).
  utf8_lo_ = 0x80;
  utf8_hi_ = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    utf8_need_ = 1;
  } else if (c == 0xE0) {
    utf8_need_ = 2;
    utf8_lo_ = 0xA0;
  } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
    utf8_need_ = 2;
  } else if (c == 0xED) {
    utf8_need_ = 2;
    utf8_hi_ = 0x9F;
  } else if (c == 0xF0) {
    utf8_need_ = 3;
    utf8_lo_ = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3) {
    utf8_need_ = 3;
  } else if (c == 0xF4) {
    utf8_need_ = 3;
    utf8_hi_ = 0x8F;
  } else {
    return false;
  }
  utf8_.assign(1, char(c));
  return true;
}

bool JsonCallReader::escape_byte(char c) {
  if (escape_ == 1) {
    if (want_low_ && c != 'u') return false;
    uint32_t cp = 0;
    switch (c) {
      case '"':
      case '\\':
      case '/':
        cp = uint32_t(c);
        break;
      case 'b':
        cp = '\b';
        break;
      case 'f':
        cp = '\f';
        break;
      case 'n':
        cp = '\n';
        break;
      case 'r':
        cp = '\r';
        break;
      case 't':
        cp = '\t';
        break;
      case 'u':
        escape_ = 2;
        hex_ = 0;
        return true;
      default:
        return false;
    }
    escape_ = 0;
    emit_codepoint(cp);
    return true;
  }
  const int v = hex_value(c);
  if (v < 0) return false;
  hex_ = hex_ * 16 + uint32_t(v);
  if (++escape_ < 6) return true;
  escape_ = 0;
  if (want_low_) {
    if (hex_ < 0xDC00 || hex_ > 0xDFFF) return false;
    want_low_ = false;
    emit_codepoint(0x10000 + ((high_surrogate_ - 0xD800) << 10) + (hex_ - 0xDC00));
    return true;
  }
  if (hex_ >= 0xD800 && hex_ <= 0xDBFF) {
    high_surrogate_ = hex_;
    want_low_ = true;
    return true;
  }
  if (hex_ >= 0xDC00 && hex_ <= 0xDFFF) return false;  // a low half alone
  emit_codepoint(hex_);
  return true;
}

bool JsonCallReader::string_end() {
  in_string_ = false;
  switch (sink_) {
    case Sink::kArgumentsJson:
      arguments_ += '"';
      break;
    case Sink::kArgumentsText:
      if (arguments_only_) return complete_arguments_only();
      break;
    case Sink::kName:
      if (name_.empty()) return false;  // a call needs a name
      name_done_ = true;
      update_is_call();
      break;
    case Sink::kKey:
      value_role_ = Role::kOther;
      if (key_ == "name" && !have_name_key_) {
        have_name_key_ = true;
        value_role_ = Role::kName;
      } else if ((key_ == "arguments" || key_ == "parameters") && !have_arguments_key_) {
        have_arguments_key_ = true;
        value_role_ = Role::kArguments;
      }
      break;
    case Sink::kNone:
      break;
  }
  if (string_is_key_) {
    expect_ = Expect::kColon;
    return true;
  }
  return end_value();
}

void JsonCallReader::emit_codepoint(uint32_t cp) {
  switch (sink_) {
    case Sink::kKey:
      append_utf8(key_, cp);
      break;
    case Sink::kName:
      append_utf8(name_, cp);
      break;
    case Sink::kArgumentsText:
      append_utf8(arguments_, cp);
      break;
    case Sink::kArgumentsJson:
      append_escaped(arguments_, cp);
      break;
    case Sink::kNone:
      break;
  }
}

void JsonCallReader::emit_bytes(std::string_view utf8) {
  switch (sink_) {
    case Sink::kKey:
      key_ += utf8;
      break;
    case Sink::kName:
      name_ += utf8;
      break;
    case Sink::kArgumentsText:
    case Sink::kArgumentsJson:
      arguments_ += utf8;
      break;
    case Sink::kNone:
      break;
  }
}

void JsonCallReader::update_is_call() {
  if (name_done_ && (!require_arguments_ || arguments_begun_)) is_call_ = true;
}

bool JsonCallReader::complete_arguments_only() {
  stack_.clear();
  in_string_ = false;
  expect_ = Expect::kDone;
  status_ = Status::kComplete;
  return true;
}

void JsonCallReader::complete_object() {
  expect_ = Expect::kDone;
  const bool has_arguments = arguments_begun_ && !arguments_null_;
  if (!name_done_ || (require_arguments_ && !has_arguments)) {
    status_ = Status::kInvalid;
    return;
  }
  if (!has_arguments) arguments_ = "{}";
  is_call_ = true;
  status_ = Status::kComplete;
}

}  // namespace rill
