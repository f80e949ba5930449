#include "text/grammar/regex_grammar.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "text/grammar/compiled_grammar.h"
#include "text/grammar/gbnf_parser.h"
#include "text/grammar/grammar_ast.h"
#include "text/unicode.h"

namespace rill::grammar {
namespace {

using Ranges = std::vector<CodepointRange>;

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end(), [](auto& a, auto& b) { return a.lo < b.lo; });
  Ranges out;
  for (auto x : r) {
    if (!out.empty() && x.lo <= out.back().hi + 1) {
      out.back().hi = std::max(out.back().hi, x.hi);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges n = normalize(r), out;
  uint32_t next = 0;
  for (auto x : n) {
    if (x.lo > next) out.push_back({next, x.lo - 1});
    next = x.hi + 1;
  }
  if (next <= kMaxCodepoint) out.push_back({next, kMaxCodepoint});
  return out;
}

Ranges digit() {
  return {{'0', '9'}};
}
Ranges word() {
  return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
}
Ranges space() {  // ECMA-262 WhiteSpace and LineTerminator
  return {{0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
          {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
}
Ranges dot() {
  return complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}});
}

std::string class_text(const Ranges& r) {
  std::string s = "[";
  char buf[16];
  for (auto x : r) {
    std::snprintf(buf, sizeof buf, "\\U%08X", x.lo);
    s += buf;
    if (x.hi != x.lo) {
      std::snprintf(buf, sizeof buf, "-\\U%08X", x.hi);
      s += buf;
    }
  }
  return s + "]";
}

std::string literal_text(std::string_view bytes) {
  std::string s = "\"";
  char buf[8];
  for (char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    if (b >= 0x20 && b < 0x7F && c != '"' && c != '\\') {
      s += c;
    } else if (b < 0x80) {
      std::snprintf(buf, sizeof buf, "\\x%02X", b);
      s += buf;
    } else {
      s += c;  // UTF-8 passes through
    }
  }
  return s + "\"";
}

// The characters of `r` as they appear in the output: a class, plus (in a
// JSON string) the escapes of ", \ and U+0000..U+001F.
std::string chars_expression(const Ranges& in, RegexOutput output) {
  const Ranges r = normalize(in);
  if (r.empty()) return "[^\\U00000000-\\U0010FFFF]";
  if (output == RegexOutput::kRaw) return class_text(r);
  auto contains = [&](uint32_t cp) {
    for (auto x : r)
      if (cp >= x.lo && cp <= x.hi) return true;
    return false;
  };
  Ranges plain;
  for (auto x : r) {  // minus 0x00-0x1F, '"', '\\'
    auto add = [&](uint32_t lo, uint32_t hi) {
      if (lo <= hi) plain.push_back({lo, hi});
    };
    const uint32_t lo = std::max<uint32_t>(x.lo, 0x20);
    if (lo > x.hi) continue;
    uint32_t a = lo;
    for (uint32_t cut : {uint32_t{'"'}, uint32_t{'\\'}}) {
      if (cut >= a && cut <= x.hi) {
        add(a, cut - 1);
        a = cut + 1;
      }
    }
    add(a, x.hi);
  }
  std::vector<std::string> alts;
  if (!plain.empty()) alts.push_back(class_text(plain));
  if (contains('"')) alts.push_back("\"\\\\\\\"\"");            // \"
  if (contains('\\')) alts.push_back("\"\\\\\\\\\"");           // \\.
  const char* short_escapes[] = {"b", "t", "n", "", "f", "r"};  // 0x08..0x0D
  char buf[32];
  for (uint32_t c = 0; c < 0x20; ++c) {
    if (!contains(c)) continue;
    if (c >= 0x08 && c <= 0x0D && short_escapes[c - 8][0] != '\0') {
      std::snprintf(buf, sizeof buf, "\"\\\\%s\"", short_escapes[c - 8]);
    } else {
      std::snprintf(buf, sizeof buf, "\"\\\\u%04x\"", c);
    }
    alts.push_back(buf);
  }
  if (alts.size() == 1) return alts[0];
  std::string s = "(";
  for (size_t i = 0; i < alts.size(); ++i) s += (i ? " | " : "") + alts[i];
  return s + ")";
}

class RegexParser {
 public:
  RegexParser(std::string_view re, RegexOutput output) : re_(re), output_(output) {}

  Result<std::string> parse(RegexAnchoring anchoring) {
    if (!text::is_valid_utf8(re_)) return Error{"regex: not valid UTF-8"};
    bool start_anchor = false, end_anchor = false;
    if (!re_.empty() && re_[0] == '^') {
      start_anchor = true;
      pos_ = 1;
    }
    std::string body = alternation(0);
    if (!error_.empty()) return Error{error_};
    if (pos_ < re_.size() && re_[pos_] == '$') {
      end_anchor = true;
      ++pos_;
    }
    if (pos_ < re_.size()) {
      return Error{"regex: " + std::string(re_[pos_] == ')' ? "unbalanced ')'" : "'$' before the end") + " at offset " +
                   std::to_string(pos_)};
    }
    if (anchoring == RegexAnchoring::kWhole) return body;
    const std::string any = chars_expression({{0, kMaxCodepoint}}, output_) + "*";
    return (start_anchor ? "" : any + " ") + "(" + body + ")" + (end_anchor ? "" : " " + any);
  }

 private:
  bool done() const { return pos_ >= re_.size(); }
  void fail(const std::string& what) {
    if (error_.empty()) error_ = "regex: " + what + " at offset " + std::to_string(pos_);
  }

  std::string alternation(int depth) {
    if (depth > 100) {
      fail("groups nested too deep");
      return "";
    }
    std::vector<std::string> alts{sequence(depth)};
    while (!done() && re_[pos_] == '|' && error_.empty()) {
      ++pos_;
      alts.push_back(sequence(depth));
    }
    if (alts.size() == 1) return alts[0];
    std::string s = "(";
    for (size_t i = 0; i < alts.size(); ++i) s += (i ? " | " : "") + alts[i];
    return s + ")";
  }

  std::string sequence(int depth) {
    std::string s = "\"\"";
    while (!done() && error_.empty()) {
      const char c = re_[pos_];
      if (c == '|' || c == ')') break;
      if (c == '$' && pos_ + 1 == re_.size() && depth == 0) break;
      std::string atom = parse_atom(depth);
      if (!error_.empty()) return "";
      s += " " + quantified(atom);
    }
    return s;
  }

  std::string quantified(const std::string& atom) {
    if (done()) return atom;
    const char c = re_[pos_];
    std::string q;
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      q = c;
    } else if (c == '{' && pos_ + 1 < re_.size() && std::isdigit(static_cast<unsigned char>(re_[pos_ + 1]))) {
      const size_t close = re_.find('}', pos_);
      if (close == std::string_view::npos) {
        fail("'{' without '}'");
        return "";
      }
      q = std::string(re_.substr(pos_, close - pos_ + 1));
      const std::string inner = q.substr(1, q.size() - 2);
      const size_t comma = inner.find(',');
      const std::string lo_text = inner.substr(0, comma);
      const std::string hi_text = comma == std::string::npos ? lo_text : inner.substr(comma + 1);
      auto number = [](const std::string& t, uint64_t& v) {
        if (t.empty() || t.size() > 9 || t.find_first_not_of("0123456789") != std::string::npos) return false;
        v = std::stoull(t);
        return true;
      };
      uint64_t lo = 0, hi = 0;
      const bool open_ended = comma != std::string::npos && hi_text.empty();
      if (!number(lo_text, lo) || (!open_ended && !number(hi_text, hi))) {
        fail("malformed quantifier " + q);
        return "";
      }
      if (lo > kMaxRepeat || (!open_ended && hi > kMaxRepeat)) {
        fail("quantifier " + q + " above " + std::to_string(kMaxRepeat));
        return "";
      }
      if (!open_ended && hi < lo) {
        fail("quantifier " + q + " with min > max");
        return "";
      }
      pos_ = close + 1;
    } else {
      return atom;
    }
    if (!done() && re_[pos_] == '?') ++pos_;  // lazy: the same strings
    if (!done() && re_[pos_] == '+') {
      fail("possessive quantifiers are not supported");
      return "";
    }
    if (!done() && (re_[pos_] == '*' || re_[pos_] == '+' || re_[pos_] == '?' || re_[pos_] == '{')) {
      if (re_[pos_] != '{' || (pos_ + 1 < re_.size() && std::isdigit(static_cast<unsigned char>(re_[pos_ + 1])))) {
        fail("nothing to repeat");
        return "";
      }
    }
    return "(" + atom + ")" + q;
  }

  uint32_t read_codepoint() {
    const auto* p = reinterpret_cast<const uint8_t*>(re_.data() + pos_);
    const uint8_t b = p[0];
    const size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
    for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (p[i] & 0x3F);
    pos_ += n;
    return cp;
  }

  uint32_t read_hex(int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      if (done() || !std::isxdigit(static_cast<unsigned char>(re_[pos_]))) {
        fail("\\x/\\u needs hex digits");
        return 0;
      }
      const char c = re_[pos_++];
      v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
  }

  // After a backslash: a class escape (into `ranges`, returns true) or one
  // character (into `cp`, returns false).
  bool escape(Ranges& ranges, uint32_t& cp, bool in_class) {
    if (done()) {
      fail("'\\' at the end");
      return false;
    }
    const char c = re_[pos_++];
    switch (c) {
      case 'd':
        ranges = digit();
        return true;
      case 'D':
        ranges = complement(digit());
        return true;
      case 'w':
        ranges = word();
        return true;
      case 'W':
        ranges = complement(word());
        return true;
      case 's':
        ranges = space();
        return true;
      case 'S':
        ranges = complement(space());
        return true;
      case 'n':
        cp = '\n';
        return false;
      case 't':
        cp = '\t';
        return false;
      case 'r':
        cp = '\r';
        return false;
      case 'f':
        cp = '\f';
        return false;
      case 'v':
        cp = '\v';
        return false;
      case '0':
        cp = 0;
        return false;
      case 'x':
        cp = read_hex(2);
        return false;
      case 'u':
        cp = read_hex(4);
        return false;
      case 'b':
        if (in_class) {
          cp = '\b';
          return false;
        }
        fail("word boundaries (\\b) are not supported");
        return false;
      case 'B':
        fail("word boundaries (\\B) are not supported");
        return false;
      case 'k':
        fail("backreferences (\\k) are not supported");
        return false;
      default:
        if (c >= '1' && c <= '9') {
          fail("backreferences (\\" + std::string(1, c) + ") are not supported");
          return false;
        }
        if (std::isalnum(static_cast<unsigned char>(c))) {
          fail(std::string("unknown escape \\") + c);
          return false;
        }
        --pos_;
        cp = read_codepoint();
        return false;
    }
  }

  std::string parse_class() {
    ++pos_;  // [
    bool negated = false;
    if (!done() && re_[pos_] == '^') {
      negated = true;
      ++pos_;
    }
    Ranges r;
    bool first = true;
    while (!done() && (re_[pos_] != ']' || first) && error_.empty()) {
      first = false;
      uint32_t lo = 0;
      Ranges cls;
      if (re_[pos_] == '\\') {
        ++pos_;
        if (escape(cls, lo, true)) {
          r.insert(r.end(), cls.begin(), cls.end());
          continue;
        }
        if (!error_.empty()) return "";
      } else {
        lo = read_codepoint();
      }
      uint32_t hi = lo;
      if (pos_ + 1 < re_.size() && re_[pos_] == '-' && re_[pos_ + 1] != ']') {
        ++pos_;
        if (re_[pos_] == '\\') {
          ++pos_;
          if (escape(cls, hi, true)) {
            fail("a class escape cannot end a range");
            return "";
          }
        } else {
          hi = read_codepoint();
        }
        if (hi < lo) {
          fail("range out of order in character class");
          return "";
        }
      }
      r.push_back({lo, hi});
    }
    if (done()) {
      fail("'[' without ']'");
      return "";
    }
    ++pos_;  // ]
    return chars_expression(negated ? complement(r) : r, output_);
  }

  std::string parse_atom(int depth) {
    const char c = re_[pos_];
    switch (c) {
      case '(': {
        ++pos_;
        if (re_.substr(pos_, 2) == "?:") {
          pos_ += 2;
        } else if (re_.substr(pos_, 2) == "?=" || re_.substr(pos_, 2) == "?!" || re_.substr(pos_, 3) == "?<=" ||
                   re_.substr(pos_, 3) == "?<!") {
          fail("lookaround assertions are not supported");
          return "";
        } else if (re_.substr(pos_, 2) == "?<") {
          const size_t close = re_.find('>', pos_);
          if (close == std::string_view::npos) {
            fail("unterminated group name");
            return "";
          }
          pos_ = close + 1;
        } else if (!done() && re_[pos_] == '?') {
          fail("unsupported group syntax (?");
          return "";
        }
        std::string inner = alternation(depth + 1);
        if (done() || re_[pos_] != ')') {
          fail("'(' without ')'");
          return "";
        }
        ++pos_;
        return "(" + inner + ")";
      }
      case '[':
        return parse_class();
      case '.':
        ++pos_;
        return chars_expression(dot(), output_);
      case '^':
        fail("'^' is supported only at the start");
        return "";
      case '$':
        fail("'$' is supported only at the end");
        return "";
      case '*':
      case '+':
      case '?':
        fail("nothing to repeat");
        return "";
      case '\\': {
        ++pos_;
        Ranges cls;
        uint32_t cp = 0;
        if (escape(cls, cp, false)) return chars_expression(cls, output_);
        if (!error_.empty()) return "";
        return chars_expression({{cp, cp}}, output_);
      }
      default: {
        const uint32_t cp = read_codepoint();
        if (output_ == RegexOutput::kRaw || (cp >= 0x20 && cp != '"' && cp != '\\')) {
          std::string bytes;
          const size_t n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
          bytes = std::string(re_.substr(pos_ - n, n));
          return literal_text(bytes);
        }
        return chars_expression({{cp, cp}}, output_);
      }
    }
  }

  std::string_view re_;
  RegexOutput output_;
  size_t pos_ = 0;
  std::string error_;
};

}  // namespace

Result<std::string> regex_to_gbnf_expression(std::string_view regex, RegexAnchoring anchoring, RegexOutput output) {
  auto e = RegexParser(regex, output).parse(anchoring);
  if (!e) return e;
  // A quantified group that can match nothing ((a*)*, ()+, (a?){2,5}) is
  // refused by the grammar compiler as ambiguous; say so in the regex's
  // terms instead of handing out a grammar that does not compile.
  auto g = CompiledGrammar::from_gbnf("root ::= " + *e + "\n");
  if (!g && g.error().message.find("can match the empty string") != std::string::npos) {
    return Error{"regex: a repeated group that can match the empty string (such as (a*)*) is not supported"};
  }
  return e;
}

Result<std::string> regex_to_gbnf(std::string_view regex) {
  auto e = regex_to_gbnf_expression(regex, RegexAnchoring::kWhole, RegexOutput::kRaw);
  if (!e) return e.error();
  return "root ::= " + *e + "\n";
}

}  // namespace rill::grammar
