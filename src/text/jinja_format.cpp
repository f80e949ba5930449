// Python string formatting: `fmt % args` (and the format filter) and
// str.format. Numeric conversions go through snprintf, whose %d/%f/%e/%g
// output equals Python's for the same flags, width and precision.
#include <cmath>
#include <cstdio>

#include "text/jinja_builtins.h"
#include "text/jinja_string.h"

namespace rill::jinja {
namespace {

std::string c_format(const std::string& spec, double v) {
  char buf[512];
  std::snprintf(buf, sizeof buf, spec.c_str(), v);
  return buf;
}

std::string c_format_int(const std::string& spec, long long v) {
  char buf[512];
  std::snprintf(buf, sizeof buf, spec.c_str(), v);
  return buf;
}

// Pads `s` to `width` code points; left-aligned when `left`.
std::string pad_to(std::string s, int64_t width, bool left, const std::string& fill = " ") {
  const int64_t n = int64_t(n_code_points(s));
  if (width <= n) return s;
  std::string padding;
  for (int64_t k = 0; k < width - n; ++k) padding += fill;
  return left ? s + padding : padding + s;
}

std::string truncate_code_points(const std::string& s, int64_t n) {
  const std::u32string cps = decode_utf8(s);
  if (int64_t(cps.size()) <= n) return s;
  return encode_utf8(std::u32string_view(cps).substr(0, size_t(n)));
}

}  // namespace

Result<std::string> percent_format(Interpreter& interp, std::string_view fmt, const Value& args) {
  List positional;
  const Dict* mapping = nullptr;
  if (args.kind == Kind::kTuple)
    positional = *args.list;
  else
    positional.push_back(args);
  if (args.kind == Kind::kDict) mapping = args.dict.get();
  // Python treats any non-tuple, non-str object with __getitem__ (dict,
  // list) as a mapping: leftover arguments are then not an error.
  const bool mapping_like = args.kind == Kind::kDict || args.kind == Kind::kList;
  size_t next_arg = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) return Error{"incomplete format"};
    const Value* value = nullptr;
    Value key_value;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string_view::npos) return Error{"incomplete format key"};
      if (!mapping) return Error{"format requires a mapping"};
      const std::string key(fmt.substr(i + 1, close - i - 1));
      value = mapping->find(key);
      if (!value) return Error{"KeyError: '" + key + "'"};
      used_mapping = true;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string_view("-+ 0#").find(fmt[i]) != std::string_view::npos)
      flags.push_back(fmt[i++]);
    int64_t width = 0;
    while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') {
      width = width * 10 + (fmt[i++] - '0');
      if (width > 100000) return Error{"format width too large"};
    }
    int64_t precision = -1;
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      precision = 0;
      while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') {
        precision = precision * 10 + (fmt[i++] - '0');
        if (precision > 400) return Error{"format precision too large"};
      }
    }
    while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) return Error{"incomplete format"};
    const char conv = fmt[i];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (!value) {
      if (next_arg >= positional.size()) return Error{"not enough arguments for format string"};
      value = &positional[next_arg++];
    }
    const bool left = flags.find('-') != std::string::npos;
    std::string piece;
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        piece = conv == 's' ? to_str(*value) : repr(*value);
        if (precision >= 0) piece = truncate_code_points(piece, precision);
        piece = pad_to(piece, width, left);
        break;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'o': {
        long long n = 0;
        if (value->is_int())
          n = value->as_int();
        else if (value->kind == Kind::kFloat && (conv == 'd' || conv == 'i' || conv == 'u') &&
                 std::isfinite(value->f) && std::fabs(value->f) < 9.2e18)
          n = (long long)value->f;
        else
          return Error{std::string("%") + conv + " format: a real number is required, not " + type_name(*value)};
        std::string spec = "%" + flags + std::to_string(width);
        if (precision >= 0) spec += "." + std::to_string(precision);
        spec += "ll";
        spec.push_back(conv == 'i' || conv == 'u' ? 'd' : conv);
        piece = c_format_int(spec, n);
        break;
      }
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G': {
        if (!value->is_number()) return Error{"must be real number, not " + type_name(*value)};
        std::string spec = "%" + flags + std::to_string(width) + "." + std::to_string(precision < 0 ? 6 : precision);
        spec.push_back(conv);
        piece = c_format(spec, value->as_double());
        break;
      }
      case 'c': {
        if (value->kind == Kind::kString && n_code_points(value->s()) == 1)
          piece = value->s();
        else if (value->is_int() && value->as_int() >= 0 && value->as_int() <= 0x10FFFF)
          append_utf8(char32_t(value->as_int()), piece);
        else
          return Error{"%c requires int or char"};
        piece = pad_to(piece, width, left);
        break;
      }
      default:
        return Error{std::string("unsupported format character '") + conv + "'"};
    }
    out += piece;
    RILL_TRY(interp.check_bytes(out.size()));
  }
  if (!mapping_like && next_arg < positional.size())
    return Error{"not all arguments converted during string formatting"};
  (void)used_mapping;
  return out;
}

namespace {

// format(value, spec) for the subset [[fill]align][sign][0][width][.precision][type].
Result<std::string> format_field(const Value& v, std::string_view spec) {
  if (spec.empty()) return to_str(v);
  std::string fill = " ";
  char align = 0;
  size_t i = 0;
  const std::u32string cps = decode_utf8(spec);
  if (cps.size() >= 2 && (cps[1] == '<' || cps[1] == '>' || cps[1] == '^')) {
    fill.clear();
    append_utf8(cps[0], fill);
    align = char(cps[1]);
    i = fill.size() + 1;
  } else if (spec[0] == '<' || spec[0] == '>' || spec[0] == '^') {
    align = spec[0];
    i = 1;
  }
  std::string sign;
  if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) sign = spec[i++];
  bool zero = false;
  if (i < spec.size() && spec[i] == '0') {
    zero = true;
    ++i;
  }
  int64_t width = 0;
  while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9') {
    width = width * 10 + (spec[i++] - '0');
    if (width > 100000) return Error{"format width too large"};
  }
  int64_t precision = -1;
  if (i < spec.size() && spec[i] == '.') {
    ++i;
    precision = 0;
    while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9') {
      precision = precision * 10 + (spec[i++] - '0');
      if (precision > 400) return Error{"format precision too large"};
    }
  }
  char type = 0;
  if (i < spec.size()) type = spec[i++];
  if (i != spec.size()) return Error{"unsupported format specifier '" + std::string(spec) + "'"};
  std::string body;
  bool numeric = false;
  if (type == 0 || type == 's') {
    if (type == 's' && v.kind != Kind::kString)
      return Error{"Unknown format code 's' for object of type '" + type_name(v) + "'"};
    if (v.is_number() && type == 0 && (precision >= 0 || !sign.empty())) {
      numeric = true;
      body = v.kind == Kind::kFloat
                 ? c_format("%" + sign + "." + std::to_string(precision < 0 ? 12 : precision) + "g", v.f)
                 : c_format_int("%" + sign + "lld", v.as_int());
    } else {
      numeric = v.is_number();
      body = to_str(v);
      if (precision >= 0 && !numeric) body = truncate_code_points(body, precision);
    }
  } else if (type == 'd') {
    if (!v.is_int()) return Error{"Unknown format code 'd' for object of type '" + type_name(v) + "'"};
    numeric = true;
    body = c_format_int("%" + sign + "lld", v.as_int());
  } else if (std::string_view("eEfFgG%").find(type) != std::string_view::npos) {
    if (!v.is_number())
      return Error{std::string("Unknown format code '") + type + "' for object of type '" + type_name(v) + "'"};
    numeric = true;
    const double x = type == '%' ? v.as_double() * 100 : v.as_double();
    body = c_format("%" + sign + "." + std::to_string(precision < 0 ? 6 : precision) + (type == '%' ? 'f' : type), x);
    if (type == '%') body += "%";
  } else {
    return Error{std::string("unsupported format code '") + type + "'"};
  }
  if (!align) align = numeric ? '>' : '<';
  if (zero && !align) fill = "0";
  const int64_t n = int64_t(n_code_points(body));
  if (width <= n) return body;
  const int64_t total = width - n;
  const int64_t left = align == '<' ? 0 : align == '>' ? total : total / 2;
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += fill;
  out += body;
  for (int64_t k = 0; k < total - left; ++k) out += fill;
  return out;
}

}  // namespace

Result<std::string> brace_format(std::string_view fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  bool manual = false, automatic = false;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      return Error{"Single '}' encountered in format string"};
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string_view::npos) return Error{"expected '}' before end of string"};
    std::string_view field = fmt.substr(i + 1, close - i - 1);
    i = close;
    std::string_view spec, conversion;
    if (size_t colon = field.find(':'); colon != std::string_view::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    if (size_t bang = field.find('!'); bang != std::string_view::npos) {
      conversion = field.substr(bang + 1);
      field = field.substr(0, bang);
    }
    const Value* value = nullptr;
    if (field.empty()) {
      if (manual) return Error{"cannot switch from manual field specification to automatic field numbering"};
      automatic = true;
      if (auto_index >= args.positional.size())
        return Error{"Replacement index " + std::to_string(auto_index) + " out of range for positional args tuple"};
      value = &args.positional[auto_index++];
    } else if (field.find_first_not_of("0123456789") == std::string_view::npos) {
      if (automatic) return Error{"cannot switch from automatic field numbering to manual field specification"};
      manual = true;
      const size_t index = std::stoul(std::string(field.substr(0, 9)));
      if (index >= args.positional.size())
        return Error{"Replacement index " + std::string(field) + " out of range for positional args tuple"};
      value = &args.positional[index];
    } else {
      value = args.kw(field);
      if (!value) return Error{"KeyError: '" + std::string(field) + "'"};
    }
    Value converted = *value;
    if (conversion == "r" || conversion == "a")
      converted = Value::string(repr(*value));
    else if (conversion == "s")
      converted = Value::string(to_str(*value));
    else if (!conversion.empty())
      return Error{"Unknown conversion specifier " + std::string(conversion)};
    RILL_ASSIGN_OR_RETURN(std::string piece, format_field(converted, spec));
    out += piece;
  }
  return out;
}

}  // namespace rill::jinja
