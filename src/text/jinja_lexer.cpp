#include "text/jinja_lexer.h"

#include <cerrno>
#include <cstdlib>

#include "text/jinja_string.h"

namespace rill::jinja {
namespace {

// "\r\n" and "\r" become "\n"; one trailing newline is dropped
// (keep_trailing_newline=False).
std::string normalize_newlines(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out.push_back(src[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Length in bytes of the whitespace code point at p (Python's \s), or 0.
size_t whitespace_at(std::string_view s, size_t p) {
  if (p >= s.size()) return 0;
  const auto c = static_cast<unsigned char>(s[p]);
  if (c < 0x80) return py_isspace(c) ? 1 : 0;
  size_t n = (c >= 0xF0) ? 4 : (c >= 0xE0) ? 3 : (c >= 0xC0) ? 2 : 1;
  if (p + n > s.size()) return 0;
  const std::u32string cp = decode_utf8(s.substr(p, n));
  return (cp.size() == 1 && py_isspace(cp[0])) ? n : 0;
}

size_t skip_whitespace(std::string_view s, size_t p) {
  while (size_t n = whitespace_at(s, p)) p += n;
  return p;
}

bool is_all_whitespace(std::string_view s) {
  size_t p = 0;
  while (p < s.size()) {
    const size_t n = whitespace_at(s, p);
    if (!n) return false;
    p += n;
  }
  return true;
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

// Digits with single underscores between them: (\d+_)*\d+. Returns the end or npos.
size_t match_digits(std::string_view s, size_t p) {
  if (p >= s.size() || !is_digit(s[p])) return std::string_view::npos;
  while (p < s.size()) {
    if (is_digit(s[p]))
      ++p;
    else if (s[p] == '_' && p + 1 < s.size() && is_digit(s[p + 1]))
      p += 2;
    else
      break;
  }
  return p;
}

size_t match_exponent(std::string_view s, size_t p) {
  if (p >= s.size() || (s[p] != 'e' && s[p] != 'E')) return std::string_view::npos;
  ++p;
  if (p < s.size() && (s[p] == '+' || s[p] == '-')) ++p;
  return match_digits(s, p);
}

std::string without_underscores(std::string_view s) {
  std::string out;
  for (char c : s)
    if (c != '_') out.push_back(c);
  return out;
}

// float_re of jinja2's lexer; npos when no float starts at p.
size_t match_float(std::string_view s, size_t p) {
  constexpr size_t npos = std::string_view::npos;
  if (p > 0 && s[p - 1] == '.') return npos;
  const size_t q1 = match_digits(s, p);
  if (q1 == npos) return npos;
  if (q1 < s.size() && s[q1] == '.') {
    const size_t q2 = match_digits(s, q1 + 1);
    if (q2 != npos) {
      const size_t q3 = match_exponent(s, q2);
      return q3 != npos ? q3 : q2;
    }
  }
  return match_exponent(s, q1);
}

// integer_re: 0b/0o/0x prefixed, [1-9](_?\d)*, or 0(_?0)*. Sets *base.
size_t match_integer(std::string_view s, size_t p, int* base) {
  constexpr size_t npos = std::string_view::npos;
  auto run = [&](size_t q, auto is_ok) {  // (_?X)+
    size_t end = npos;
    while (q < s.size()) {
      if (is_ok(s[q])) {
        ++q;
        end = q;
      } else if (s[q] == '_' && q + 1 < s.size() && is_ok(s[q + 1])) {
        q += 2;
        end = q;
      } else
        break;
    }
    return end;
  };
  if (s[p] == '0' && p + 1 < s.size()) {
    const char x = char(s[p + 1] | 0x20);
    size_t end = npos;
    if (x == 'b') {
      *base = 2;
      end = run(p + 2, [](char c) { return c == '0' || c == '1'; });
    }
    if (x == 'o') {
      *base = 8;
      end = run(p + 2, [](char c) { return c >= '0' && c <= '7'; });
    }
    if (x == 'x') {
      *base = 16;
      end = run(p + 2, [](char c) { return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); });
    }
    if (end != npos) return end;
  }
  *base = 10;
  if (s[p] >= '1' && s[p] <= '9') {
    const size_t end = run(p + 1, is_digit);
    return end == npos ? p + 1 : end;
  }
  if (s[p] == '0') {
    const size_t end = run(p + 1, [](char c) { return c == '0'; });
    return end == npos ? p + 1 : end;
  }
  return npos;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  Result<std::vector<Token>> run() {
    size_t pos = 0;
    bool line_starting = true;
    const std::string_view s = src_;
    while (pos < s.size()) {
      size_t t = pos;
      while (true) {
        t = s.find('{', t);
        if (t == std::string_view::npos || t + 1 >= s.size()) {
          t = std::string_view::npos;
          break;
        }
        const char k = s[t + 1];
        if (k == '{' || k == '%' || k == '#') break;
        ++t;
      }
      if (t == std::string_view::npos) {
        emit_data(s.substr(pos), pos);
        break;
      }
      const char kind = s[t + 1];
      size_t after = t + 2;
      char sign = 0;
      if (after < s.size() && (s[after] == '-' || s[after] == '+')) sign = s[after++];
      size_t raw_end = match_raw_begin(kind, after);

      std::string_view text = s.substr(pos, t - pos);
      if (sign == '-') {
        const std::string stripped = py_strip(text, std::nullopt, false, true);
        text = text.substr(0, stripped.size());
      } else if (sign != '+' && kind != '{') {      // lstrip_blocks: blocks and comments only
        const size_t l_pos = text.rfind('\n') + 1;  // npos + 1 == 0
        if ((l_pos > 0 || line_starting) && l_pos < text.size() && is_all_whitespace(text.substr(l_pos)))
          text = text.substr(0, l_pos);
      }
      emit_data(text, pos);

      size_t end = 0;
      if (raw_end != std::string_view::npos) {
        RILL_ASSIGN_OR_RETURN(end, lex_raw(raw_end));
      } else if (kind == '#') {
        RILL_ASSIGN_OR_RETURN(end, lex_comment(after));
      } else {
        RILL_ASSIGN_OR_RETURN(end, lex_tag(kind == '%', t, after));
      }
      line_starting = end > 0 && s[end - 1] == '\n';
      pos = end;
    }
    Token eof;
    eof.type = TokenType::kEof;
    eof.line = line_at(s.size());
    tokens_.push_back(std::move(eof));
    return std::move(tokens_);
  }

 private:
  int line_at(size_t pos) {
    for (; line_pos_ < pos && line_pos_ < src_.size(); ++line_pos_)
      if (src_[line_pos_] == '\n') ++line_;
    return line_;
  }

  Error fail(size_t pos, const std::string& what) {
    return Error{"line " + std::to_string(line_at(pos)) + ": " + what};
  }

  void emit_data(std::string_view text, size_t pos) {
    if (text.empty()) return;
    Token tok;
    tok.type = TokenType::kData;
    tok.text = std::string(text);
    tok.line = line_at(pos);
    tokens_.push_back(std::move(tok));
  }

  void emit(TokenType type, std::string text, size_t pos) {
    Token tok;
    tok.type = type;
    tok.text = std::move(text);
    tok.line = line_at(pos);
    tokens_.push_back(std::move(tok));
  }

  // {%[-+]?\s*raw\s*(-%}\s*|%}) : returns where the raw body starts, or npos.
  size_t match_raw_begin(char kind, size_t after) const {
    const std::string_view s = src_;
    if (kind != '%') return std::string_view::npos;
    size_t p = skip_whitespace(s, after);
    if (s.compare(p, 3, "raw") != 0) return std::string_view::npos;
    p = skip_whitespace(s, p + 3);
    if (s.compare(p, 3, "-%}") == 0) return skip_whitespace(s, p + 3);
    if (s.compare(p, 2, "%}") == 0) return p + 2;
    return std::string_view::npos;
  }

  // Body up to {% endraw %}, with the same whitespace control as other tags.
  Result<size_t> lex_raw(size_t body) {
    const std::string_view s = src_;
    if (body == s.size()) return body;  // as for comments: a quiet stop at EOF
    for (size_t t = s.find("{%", body); t != std::string_view::npos; t = s.find("{%", t + 1)) {
      size_t p = t + 2;
      char sign = 0;
      if (p < s.size() && (s[p] == '-' || s[p] == '+')) sign = s[p++];
      p = skip_whitespace(s, p);
      if (s.compare(p, 6, "endraw") != 0) continue;
      p = skip_whitespace(s, p + 6);
      size_t end;
      if (s.compare(p, 3, "+%}") == 0)
        end = p + 3;
      else if (s.compare(p, 3, "-%}") == 0)
        end = skip_whitespace(s, p + 3);
      else if (s.compare(p, 2, "%}") == 0)
        end = p + 2 + (p + 2 < s.size() && s[p + 2] == '\n');
      else
        continue;
      std::string_view text = s.substr(body, t - body);
      if (sign == '-') {
        text = text.substr(0, py_strip(text, std::nullopt, false, true).size());
      } else if (sign != '+') {
        const size_t l_pos = text.rfind('\n') + 1;
        if (l_pos > 0 && l_pos < text.size() && is_all_whitespace(text.substr(l_pos))) text = text.substr(0, l_pos);
      }
      emit_data(text, body);
      return end;
    }
    return fail(body, "Missing end of raw directive");
  }

  Result<size_t> lex_comment(size_t after) {
    const std::string_view s = src_;
    if (after == s.size()) return after;  // jinja2's lexer stops quietly at EOF here
    const size_t q = s.find("#}", after);
    if (q == std::string_view::npos) return fail(after, "Missing end of comment tag");
    if (q > after && s[q - 1] == '-') return skip_whitespace(s, q + 2);
    if (q > after && s[q - 1] == '+') return q + 2;
    return q + 2 + (q + 2 < s.size() && s[q + 2] == '\n');
  }

  // Tokens of {{ ... }} or {% ... %}; returns the position after the end tag.
  Result<size_t> lex_tag(bool is_block, size_t begin, size_t p) {
    const std::string_view s = src_;
    emit(is_block ? TokenType::kBlockBegin : TokenType::kVariableBegin, "", begin);
    std::string balance;  // expected closing brackets
    while (true) {
      if (p >= s.size()) return fail(p, "unexpected end of template, the tag is not closed");
      if (balance.empty()) {
        size_t end = std::string_view::npos;
        if (is_block) {
          if (s.compare(p, 3, "+%}") == 0)
            end = p + 3;
          else if (s.compare(p, 3, "-%}") == 0)
            end = skip_whitespace(s, p + 3);
          else if (s.compare(p, 2, "%}") == 0)
            end = p + 2 + (p + 2 < s.size() && s[p + 2] == '\n');
        } else {
          if (s.compare(p, 3, "-}}") == 0)
            end = skip_whitespace(s, p + 3);
          else if (s.compare(p, 2, "}}") == 0)
            end = p + 2;
        }
        if (end != std::string_view::npos) {
          emit(is_block ? TokenType::kBlockEnd : TokenType::kVariableEnd, "", p);
          return end;
        }
      }
      if (size_t q = skip_whitespace(s, p); q != p) {
        p = q;
        continue;
      }
      if (size_t q = match_float(s, p); q != std::string_view::npos) {
        Token tok;
        tok.type = TokenType::kFloat;
        tok.float_value = std::strtod(without_underscores(s.substr(p, q - p)).c_str(), nullptr);
        tok.line = line_at(p);
        tokens_.push_back(std::move(tok));
        p = q;
        continue;
      }
      if (is_digit(s[p])) {
        int base = 10;
        const size_t q = match_integer(s, p, &base);
        std::string digits = without_underscores(s.substr(p, q - p));
        if (base != 10) digits = digits.substr(2);
        errno = 0;
        char* endp = nullptr;
        const unsigned long long v = std::strtoull(digits.c_str(), &endp, base);
        if (errno == ERANGE || v > uint64_t(INT64_MAX))
          return fail(p, "integer literal too large: " + std::string(s.substr(p, q - p)));
        Token tok;
        tok.type = TokenType::kInteger;
        tok.int_value = int64_t(v);
        tok.line = line_at(p);
        tokens_.push_back(std::move(tok));
        p = q;
        continue;
      }
      if (is_name_start(s[p])) {
        size_t q = p + 1;
        while (q < s.size() && is_name_char(s[q])) ++q;
        emit(TokenType::kName, std::string(s.substr(p, q - p)), p);
        p = q;
        continue;
      }
      if (s[p] == '\'' || s[p] == '"') {
        size_t q = p + 1;
        while (q < s.size() && s[q] != s[p]) q += (s[q] == '\\') ? 2 : 1;
        if (q < s.size()) {
          emit(TokenType::kString, decode_string_literal(s.substr(p + 1, q - p - 1)), p);
          p = q + 1;
          continue;
        }
        return fail(p, std::string("unexpected char '") + s[p] + "'");
      }
      static const char* const kTwoCharOps[] = {"//", "**", "==", "!=", ">=", "<="};
      std::string op;
      for (const char* two : kTwoCharOps)
        if (s.compare(p, 2, two) == 0) op = two;
      if (op.empty() && std::string_view("+-/*%~[](){}=<>.:|,;").find(s[p]) != std::string_view::npos)
        op = std::string(1, s[p]);
      if (op.empty()) return fail(p, std::string("unexpected char '") + s[p] + "'");
      if (op == "(" || op == "[" || op == "{") {
        balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
      } else if (op == ")" || op == "]" || op == "}") {
        if (balance.empty()) return fail(p, "unexpected '" + op + "'");
        if (balance.back() != op[0]) return fail(p, "unexpected '" + op + "', expected '" + balance.back() + "'");
        balance.pop_back();
      }
      emit(TokenType::kOperator, op, p);
      p += op.size();
    }
  }

  std::string src_;
  std::vector<Token> tokens_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

}  // namespace

Result<std::vector<Token>> tokenize(std::string_view source) {
  Lexer lexer(normalize_newlines(source));
  return lexer.run();
}

}  // namespace rill::jinja
