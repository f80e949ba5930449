#include "text/grammar/gbnf_parser.h"

#include <map>
#include <string>

#include "text/unicode.h"

namespace rill::grammar {
namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Result<GrammarAst> parse() {
    if (!text::is_valid_utf8(text_)) return Error{"grammar: the text is not valid UTF-8"};
    GrammarAst ast;
    std::map<std::string, uint32_t, std::less<>> defined;  // name -> line
    skip_space(true);
    while (pos_ < text_.size()) {
      const uint32_t line = line_, col = col_;
      std::string name = read_name();
      if (name.empty()) return error("expected a rule name");
      skip_space(false);
      if (text_.substr(pos_, 3) != "::=") return error("expected '::=' after rule name '" + name + "'");
      advance(3);
      if (auto it = defined.find(name); it != defined.end()) {
        return Error{at(line, col) + "rule '" + name + "' is defined twice (first on line " +
                     std::to_string(it->second) + ")"};
      }
      defined.emplace(name, line);
      skip_space(true);
      Expr body;
      if (!parse_alternatives(body, 0)) return Error{error_};
      ast.rules.push_back({std::move(name), std::move(body), line});
      skip_space(true);
    }
    if (!defined.contains("root")) return Error{"grammar: no rule named 'root' (the start rule)"};
    for (const auto& [name, line, col] : refs_) {
      if (!defined.contains(name)) return Error{at(line, col) + "rule '" + name + "' is used but not defined"};
    }
    return ast;
  }

 private:
  struct Ref {
    std::string name;
    uint32_t line, col;
  };

  std::string at(uint32_t line, uint32_t col) const {
    return "grammar line " + std::to_string(line) + ", column " + std::to_string(col) + ": ";
  }
  Error error(const std::string& what) const { return Error{at(line_, col_) + what}; }
  bool fail(const std::string& what) {
    error_ = at(line_, col_) + what;
    return false;
  }

  bool done() const { return pos_ >= text_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0'; }
  void advance(size_t n = 1) {
    for (size_t i = 0; i < n && pos_ < text_.size(); ++i, ++pos_) {
      if (text_[pos_] == '\n') {
        ++line_;
        col_ = 1;
      } else if ((static_cast<uint8_t>(text_[pos_]) & 0xC0) != 0x80) {
        ++col_;
      }
    }
  }

  // Skips blanks and comments; newlines too when `newline_ok`.
  void skip_space(bool newline_ok) {
    while (!done()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\r') {
        advance();
      } else if (c == '#') {
        while (!done() && peek() != '\n') advance();
      } else if (c == '\n' && newline_ok) {
        advance();
      } else {
        return;
      }
    }
  }

  // At a newline outside groups: true when the rule ends here (what follows
  // is the end of the text or `name ::=`).
  bool rule_ends_here() {
    const size_t pos = pos_;
    const uint32_t line = line_, col = col_;
    skip_space(true);
    bool ends = done();
    if (!ends && !read_name().empty()) {
      skip_space(false);
      ends = text_.substr(pos_, 3) == "::=";
    }
    pos_ = pos;
    line_ = line;
    col_ = col;
    return ends;
  }

  std::string read_name() {
    size_t start = pos_;
    while (!done() && is_name_char(peek())) advance();
    return std::string(text_.substr(start, pos_ - start));
  }

  // Skips space inside a sequence; false when the sequence ends (a newline
  // at depth 0 that ends the rule).
  bool skip_sequence_space(int depth) {
    while (true) {
      skip_space(depth > 0);
      if (peek() != '\n') return true;
      if (rule_ends_here()) return false;
      advance();
    }
  }

  bool parse_alternatives(Expr& out, int depth) {
    if (depth > kMaxNesting) return fail("groups nested deeper than " + std::to_string(kMaxNesting));
    out = Expr{};
    out.kind = Expr::Kind::kAlt;
    out.line = line_;
    out.col = col_;
    while (true) {
      Expr seq;
      if (!parse_sequence(seq, depth)) return false;
      out.children.push_back(std::move(seq));
      if (peek() != '|') break;
      advance();
      skip_space(true);
    }
    if (out.children.size() == 1) {
      Expr only = std::move(out.children[0]);
      out = std::move(only);
    }
    return true;
  }

  bool parse_sequence(Expr& out, int depth) {
    out.kind = Expr::Kind::kSeq;
    out.line = line_;
    out.col = col_;
    while (skip_sequence_space(depth) && !done()) {
      const char c = peek();
      if (c == '|' || c == ')') break;
      Expr item;
      if (!parse_primary(item, depth)) return false;
      if (!parse_postfix(item)) return false;
      out.children.push_back(std::move(item));
    }
    return true;
  }

  bool parse_primary(Expr& out, int depth) {
    out.line = line_;
    out.col = col_;
    const char c = peek();
    if (c == '"') {
      advance();
      out.kind = Expr::Kind::kLiteral;
      while (peek() != '"') {
        if (done() || peek() == '\n') return fail("unterminated string literal");
        uint32_t cp;
        if (!read_char(cp)) return false;
        append_utf8(out.text, cp);
      }
      advance();
      return true;
    }
    if (c == '<') {  // a special token by its spelling, brackets included: <|channel|>
      const size_t end = text_.find('>', pos_);
      const size_t newline = text_.find('\n', pos_);
      if (end == std::string_view::npos || (newline != std::string_view::npos && newline < end) || end == pos_ + 1) {
        return fail("expected a special token's spelling: <...> on one line");
      }
      out.kind = Expr::Kind::kLiteral;
      out.text = special_token_literal(text_.substr(pos_, end + 1 - pos_));
      while (pos_ <= end) advance();
      return true;
    }
    if (c == '[') {
      advance();
      out.kind = Expr::Kind::kClass;
      if (peek() == '^') {
        out.negated = true;
        advance();
      }
      while (peek() != ']') {
        if (done() || peek() == '\n') return fail("unterminated character class");
        uint32_t lo, hi;
        if (!read_char(lo)) return false;
        hi = lo;
        if (peek() == '-' && peek(1) != ']' && peek(1) != '\0') {
          advance();
          if (!read_char(hi)) return false;
          if (hi < lo) return fail("character range with its end before its start");
        }
        out.ranges.push_back({lo, hi});
      }
      advance();
      return true;
    }
    if (c == '.') {
      advance();
      out.kind = Expr::Kind::kClass;
      out.ranges.push_back({0, kMaxCodepoint});
      return true;
    }
    if (c == '(') {
      advance();
      skip_space(true);
      if (!parse_alternatives(out, depth + 1)) return false;
      skip_space(true);
      if (peek() != ')') return fail("expected ')'");
      advance();
      return true;
    }
    if (is_name_char(c)) {
      out.kind = Expr::Kind::kRef;
      out.text = read_name();
      refs_.push_back({out.text, out.line, out.col});
      return true;
    }
    if (c == '<') return fail("token references (<...>) are not supported; write the token's text as a literal");
    return fail(std::string("unexpected character '") + c + "'");
  }

  bool read_number(uint32_t& out) {
    if (!(peek() >= '0' && peek() <= '9')) return fail("expected a number");
    uint64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + static_cast<uint64_t>(peek() - '0');
      if (v > kMaxRepeat) return fail("repetition count above " + std::to_string(kMaxRepeat));
      advance();
    }
    out = static_cast<uint32_t>(v);
    return true;
  }

  bool parse_postfix(Expr& item) {
    // Each operator nests the item once more (lowering and ~Expr recurse per
    // level), so a chain like "a"???... counts as nesting.
    for (int n_ops = 0;; ++n_ops) {
      if (n_ops > kMaxNesting) return fail("repetition operators nested deeper than " + std::to_string(kMaxNesting));
      skip_space(false);
      const char c = peek();
      uint32_t min, max;
      const uint32_t line = line_, col = col_;
      if (c == '*' || c == '+' || c == '?') {
        advance();
        min = c == '+' ? 1 : 0;
        max = c == '?' ? 1 : kUnbounded;
      } else if (c == '{') {
        advance();
        skip_space(false);
        min = 0;
        if (peek() != ',' && !read_number(min)) return false;
        skip_space(false);
        max = min;
        if (peek() == ',') {
          advance();
          skip_space(false);
          max = kUnbounded;
          if (peek() != '}' && !read_number(max)) return false;
          skip_space(false);
        }
        if (peek() != '}') return fail("expected '}' to close the repetition");
        advance();
        if (max < min) return fail("repetition {m,n} with m > n");
      } else {
        return true;
      }
      Expr rep;
      rep.kind = Expr::Kind::kRepeat;
      rep.min = min;
      rep.max = max;
      rep.line = line;
      rep.col = col;
      rep.children.push_back(std::move(item));
      item = std::move(rep);
    }
  }

  // One character of a literal or class, escapes decoded.
  bool read_char(uint32_t& cp) {
    if (peek() != '\\') {
      const auto* p = reinterpret_cast<const uint8_t*>(text_.data() + pos_);
      const uint8_t b = p[0];
      size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
      cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
      for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (p[i] & 0x3F);
      advance(n);
      return true;
    }
    advance();
    const char e = peek();
    if (done()) return fail("escape at the end of the text");
    advance();
    switch (e) {
      case 'n':
        cp = '\n';
        return true;
      case 'r':
        cp = '\r';
        return true;
      case 't':
        cp = '\t';
        return true;
      case '\\':
      case '"':
      case '\'':
      case '[':
      case ']':
      case '-':
      case '^':
      case '/':
        cp = static_cast<uint8_t>(e);
        return true;
      case 'x':
      case 'u':
      case 'U': {
        const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        cp = 0;
        for (int i = 0; i < n; ++i) {
          const int h = hex_value(peek());
          if (h < 0) return fail(std::string("\\") + e + " needs " + std::to_string(n) + " hex digits");
          cp = cp * 16 + static_cast<uint32_t>(h);
          advance();
        }
        if (cp > kMaxCodepoint || (cp >= 0xD800 && cp <= 0xDFFF)) return fail("escape is not a Unicode scalar value");
        return true;
      }
      default:
        return fail(std::string("unknown escape '\\") + e + "'");
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
  uint32_t line_ = 1, col_ = 1;
  std::vector<Ref> refs_;
  std::string error_;
};

}  // namespace

Result<GrammarAst> parse_gbnf(std::string_view text) {
  return Parser(text).parse();
}

}  // namespace rill::grammar
