#include "text/jinja_string.h"

#include <utf8proc.h>

#include <algorithm>

namespace rill::jinja {

std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i);
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t n = utf8proc_iterate(p, utf8proc_ssize_t(s.size() - i), &cp);
    if (n <= 0) {  // invalid byte: surrogateescape
      out.push_back(char32_t(0xDC00 + static_cast<unsigned char>(s[i])));
      ++i;
    } else {
      out.push_back(char32_t(cp));
      i += size_t(n);
    }
  }
  return out;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {  // surrogateescape: the original byte
    out.push_back(char(cp - 0xDC00));
  } else if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

std::string encode_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) append_utf8(cp, out);
  return out;
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c & 0x80) == 0; });
}

size_t n_code_points(std::string_view s) {
  if (is_ascii(s)) return s.size();
  return decode_utf8(s).size();
}

bool py_isspace(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

static utf8proc_category_t category(char32_t cp) {
  if (cp > 0x10FFFF) return UTF8PROC_CATEGORY_CN;
  return utf8proc_category(utf8proc_int32_t(cp));
}

bool py_isalnum(char32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
  const auto c = category(cp);
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
         (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

bool py_isprintable(char32_t cp) {
  if (cp < 0x80) return cp >= 0x20 && cp < 0x7F;
  switch (category(cp)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

char32_t py_upper(char32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') ? cp - 32 : cp;
  if (cp > 0x10FFFF) return cp;
  return char32_t(utf8proc_toupper(utf8proc_int32_t(cp)));
}

char32_t py_lower(char32_t cp) {
  if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
  if (cp > 0x10FFFF) return cp;
  return char32_t(utf8proc_tolower(utf8proc_int32_t(cp)));
}

static char32_t py_titlecase(char32_t cp) {
  if (cp < 0x80 || cp > 0x10FFFF) return py_upper(cp);
  return char32_t(utf8proc_totitle(utf8proc_int32_t(cp)));
}

bool py_is_cased_upper(char32_t cp) {
  if (cp < 0x80) return cp >= 'A' && cp <= 'Z';
  return cp <= 0x10FFFF && utf8proc_isupper(utf8proc_int32_t(cp));
}

bool py_is_cased_lower(char32_t cp) {
  if (cp < 0x80) return cp >= 'a' && cp <= 'z';
  return cp <= 0x10FFFF && utf8proc_islower(utf8proc_int32_t(cp));
}

static bool is_cased(char32_t cp) {
  return py_is_cased_upper(cp) || py_is_cased_lower(cp) || category(cp) == UTF8PROC_CATEGORY_LT;
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::u32string cps = decode_utf8(s);
  std::u32string set;
  if (chars) set = decode_utf8(*chars);
  auto strip_it = [&](char32_t cp) { return chars ? set.find(cp) != std::u32string::npos : py_isspace(cp); };
  size_t begin = 0, end = cps.size();
  if (left)
    while (begin < end && strip_it(cps[begin])) ++begin;
  if (right)
    while (end > begin && strip_it(cps[end - 1])) --end;
  return encode_utf8(std::u32string_view(cps).substr(begin, end - begin));
}

std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit,
                                  bool from_right) {
  std::vector<std::string> parts;
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (sep) {
    const std::string& d = *sep;
    if (!from_right) {
      size_t pos = 0;
      for (int64_t n = 0; n < maxsplit; ++n) {
        const size_t at = s.find(d, pos);
        if (at == std::string_view::npos) break;
        parts.emplace_back(s.substr(pos, at - pos));
        pos = at + d.size();
      }
      parts.emplace_back(s.substr(pos));
    } else {
      size_t end = s.size();
      for (int64_t n = 0; n < maxsplit; ++n) {
        if (end < d.size()) break;
        const size_t at = s.rfind(d, end - d.size());
        if (at == std::string_view::npos) break;
        parts.emplace_back(s.substr(at + d.size(), end - at - d.size()));
        end = at;
      }
      parts.emplace_back(s.substr(0, end));
      std::reverse(parts.begin(), parts.end());
    }
    return parts;
  }
  // Whitespace split: runs of whitespace separate, no empty strings.
  const std::u32string cps = decode_utf8(s);
  const size_t n = cps.size();
  if (!from_right) {
    size_t i = 0;
    int64_t n_splits = 0;
    while (i < n) {
      while (i < n && py_isspace(cps[i])) ++i;
      if (i == n) break;
      if (n_splits == maxsplit) {
        size_t end = n;
        while (end > i && py_isspace(cps[end - 1])) --end;
        parts.push_back(encode_utf8(std::u32string_view(cps).substr(i, end - i)));
        break;
      }
      size_t j = i;
      while (j < n && !py_isspace(cps[j])) ++j;
      parts.push_back(encode_utf8(std::u32string_view(cps).substr(i, j - i)));
      ++n_splits;
      i = j;
    }
  } else {
    size_t i = n;
    int64_t n_splits = 0;
    while (i > 0) {
      while (i > 0 && py_isspace(cps[i - 1])) --i;
      if (i == 0) break;
      if (n_splits == maxsplit) {
        size_t begin = 0;
        while (begin < i && py_isspace(cps[begin])) ++begin;
        parts.push_back(encode_utf8(std::u32string_view(cps).substr(begin, i - begin)));
        break;
      }
      size_t j = i;
      while (j > 0 && !py_isspace(cps[j - 1])) --j;
      parts.push_back(encode_utf8(std::u32string_view(cps).substr(j, i - j)));
      ++n_splits;
      i = j;
    }
    std::reverse(parts.begin(), parts.end());
  }
  return parts;
}

static bool is_line_break(char32_t cp) {
  return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) || cp == 0x85 ||
         cp == 0x2028 || cp == 0x2029;
}

std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
  const std::u32string cps = decode_utf8(s);
  std::vector<std::string> lines;
  size_t i = 0, start = 0;
  while (i < cps.size()) {
    if (!is_line_break(cps[i])) {
      ++i;
      continue;
    }
    size_t eol = i + 1;
    if (cps[i] == '\r' && eol < cps.size() && cps[eol] == '\n') ++eol;
    const size_t end = keepends ? eol : i;
    lines.push_back(encode_utf8(std::u32string_view(cps).substr(start, end - start)));
    start = i = eol;
  }
  if (start < cps.size()) lines.push_back(encode_utf8(std::u32string_view(cps).substr(start)));
  return lines;
}

std::string py_replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  if (count < 0) count = INT64_MAX;
  std::string out;
  if (old.empty()) {  // inserts repl before every code point and at the end
    const std::u32string cps = decode_utf8(s);
    int64_t n = 0;
    for (char32_t cp : cps) {
      if (n < count) {
        out += repl;
        ++n;
      }
      append_utf8(cp, out);
    }
    if (n < count) out += repl;
    return out;
  }
  size_t pos = 0;
  for (int64_t n = 0; n < count; ++n) {
    const size_t at = s.find(old, pos);
    if (at == std::string_view::npos) break;
    out.append(s.substr(pos, at - pos));
    out.append(repl);
    pos = at + old.size();
  }
  out.append(s.substr(pos));
  return out;
}

// SpecialCasing.txt mappings that Python applies and a per-code-point map
// cannot express (ß -> SS, ligatures). Returns false for other code points.
static bool special_case(char32_t cp, bool title, std::string& out) {
  const char* upper = nullptr;
  const char* titled = nullptr;
  switch (cp) {
    case 0x00DF:
      upper = "SS";
      titled = "Ss";
      break;
    case 0xFB00:
      upper = "FF";
      titled = "Ff";
      break;
    case 0xFB01:
      upper = "FI";
      titled = "Fi";
      break;
    case 0xFB02:
      upper = "FL";
      titled = "Fl";
      break;
    case 0xFB03:
      upper = "FFI";
      titled = "Ffi";
      break;
    case 0xFB04:
      upper = "FFL";
      titled = "Ffl";
      break;
    case 0xFB05:
    case 0xFB06:
      upper = "ST";
      titled = "St";
      break;
    default:
      return false;
  }
  out += title ? titled : upper;
  return true;
}

static void append_lower(char32_t cp, std::string& out) {
  if (cp == 0x0130) {  // İ -> i + combining dot above
    out += "i\xCC\x87";
    return;
  }
  append_utf8(py_lower(cp), out);
}

std::string py_upper_str(std::string_view s) {
  std::string out;
  for (char32_t cp : decode_utf8(s))
    if (!special_case(cp, false, out)) append_utf8(py_upper(cp), out);
  return out;
}

std::string py_lower_str(std::string_view s) {
  std::string out;
  for (char32_t cp : decode_utf8(s)) append_lower(cp, out);
  return out;
}

std::string py_title(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (char32_t cp : decode_utf8(s)) {
    if (previous_cased)
      append_lower(cp, out);
    else if (!special_case(cp, true, out))
      append_utf8(py_titlecase(cp), out);
    previous_cased = is_cased(cp);
  }
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::string out;
  bool first = true;
  for (char32_t cp : decode_utf8(s)) {
    if (!first)
      append_lower(cp, out);
    else if (!special_case(cp, true, out))
      append_utf8(py_titlecase(cp), out);
    first = false;
  }
  return out;
}

int64_t py_find(std::string_view s, std::string_view sub, bool from_right) {
  const size_t at = from_right ? s.rfind(sub) : s.find(sub);
  if (at == std::string_view::npos) return -1;
  return int64_t(n_code_points(s.substr(0, at)));
}

int64_t py_count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return int64_t(n_code_points(s)) + 1;
  int64_t n = 0;
  for (size_t pos = s.find(sub); pos != std::string_view::npos; pos = s.find(sub, pos + sub.size())) ++n;
  return n;
}

std::string py_repr_string(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  static const char kHex[] = "0123456789abcdef";
  std::string out(1, quote);
  for (char32_t cp : decode_utf8(s)) {
    if (cp == char32_t(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(char(cp));
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7F) {
      out += "\\x";
      out.push_back(kHex[cp >> 4]);
      out.push_back(kHex[cp & 15]);
    } else if (cp < 0x7F || py_isprintable(cp)) {
      append_utf8(cp, out);
    } else {
      const int n_digits = cp <= 0xFF ? 2 : cp <= 0xFFFF ? 4 : 8;
      out += n_digits == 2 ? "\\x" : n_digits == 4 ? "\\u" : "\\U";
      for (int d = n_digits - 1; d >= 0; --d) out.push_back(kHex[(cp >> (4 * d)) & 15]);
    }
  }
  out.push_back(quote);
  return out;
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string decode_string_literal(std::string_view body) {
  std::string out;
  out.reserve(body.size());
  size_t i = 0;
  while (i < body.size()) {
    const char c = body[i];
    if (c != '\\' || i + 1 == body.size()) {
      out.push_back(c);
      ++i;
      continue;
    }
    const char e = body[i + 1];
    i += 2;
    switch (e) {
      case '\n':
        break;  // line continuation
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t n_digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        char32_t cp = 0;
        size_t k = 0;
        for (; k < n_digits && i + k < body.size() && hex_value(body[i + k]) >= 0; ++k)
          cp = cp * 16 + char32_t(hex_value(body[i + k]));
        if (k < n_digits || cp > 0x10FFFF) {  // Python raises; keep the text verbatim
          out.push_back('\\');
          out.push_back(e);
          break;
        }
        i += n_digits;
        append_utf8(cp, out);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          char32_t cp = char32_t(e - '0');
          for (int k = 0; k < 2 && i < body.size() && body[i] >= '0' && body[i] <= '7'; ++k, ++i)
            cp = cp * 8 + char32_t(body[i] - '0');
          append_utf8(cp, out);
        } else {
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

}  // namespace rill::jinja
