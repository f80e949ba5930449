// Methods of str, dict, list and tuple values (what `x.strip()` or
// `d.get(k)` call), namespaces, and Python's string formatting operators.
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "text/jinja_builtins.h"
#include "text/jinja_string.h"

namespace rill::jinja {

Value make_builtin(std::string name, NativeFn fn) {
  return Value::object(std::make_shared<Builtin>(std::move(name), std::move(fn)));
}

std::string Namespace::repr() const {
  if (in_repr_) return "<Namespace {...}>";
  in_repr_ = true;
  std::string out = "<Namespace " + dict_repr(attrs_) + ">";
  in_repr_ = false;
  return out;
}

std::optional<Value> Namespace::attr(std::string_view name) const {
  if (const Value* v = attrs_.find(name)) return *v;
  return std::nullopt;
}

Status Namespace::set_attr(std::string_view name, Value value) {
  attrs_.set(Value::string(std::string(name)), std::move(value));
  return {};
}

namespace {

Result<std::string> str_arg(const CallArgs& args, size_t index, std::string_view name, std::string_view method) {
  const Value* v = args.get(index, name);
  if (!v) return Error{std::string(method) + "() missing required argument '" + std::string(name) + "'"};
  if (v->kind != Kind::kString) return Error{std::string(method) + "() argument must be str, not " + type_name(*v)};
  return v->s();
}

// None or absent -> nullopt (Python's chars=None / sep=None).
Result<std::optional<std::string>> opt_str_arg(const CallArgs& args, size_t index, std::string_view name,
                                               std::string_view method) {
  const Value* v = args.get(index, name);
  if (!v || v->is_none()) return std::optional<std::string>();
  if (v->kind != Kind::kString)
    return Error{std::string(method) + "() argument must be str or None, not " + type_name(*v)};
  return std::optional<std::string>(v->s());
}

Result<int64_t> int_arg(const CallArgs& args, size_t index, std::string_view name, int64_t dflt) {
  const Value* v = args.get(index, name);
  if (!v) return dflt;
  if (!v->is_int()) return Error{"'" + type_name(*v) + "' object cannot be interpreted as an integer"};
  return v->as_int();
}

Value str_list(const std::vector<std::string>& parts) {
  List out;
  out.reserve(parts.size());
  for (const auto& p : parts) out.push_back(Value::string(p));
  return Value::make_list(std::move(out));
}

Result<Value> affix_test(const std::string& self, const CallArgs& args, bool prefix) {
  const char* method = prefix ? "startswith" : "endswith";
  const Value* a = args.get(0, "prefix");
  if (!a) return Error{std::string(method) + "() takes at least 1 argument (0 given)"};
  List candidates;
  if (a->kind == Kind::kTuple)
    candidates = *a->list;
  else
    candidates.push_back(*a);
  for (const auto& c : candidates) {
    if (c.kind != Kind::kString)
      return Error{std::string(method) + " first arg must be str or a tuple of str, not " + type_name(c)};
    const std::string& x = c.s();
    const bool hit = prefix ? self.compare(0, x.size(), x) == 0 && self.size() >= x.size()
                            : self.size() >= x.size() && self.compare(self.size() - x.size(), x.size(), x) == 0;
    if (hit) return Value::boolean(true);
  }
  return Value::boolean(false);
}

template <typename Pred>
Value all_code_points(const std::string& s, Pred pred) {
  const std::u32string cps = decode_utf8(s);
  if (cps.empty()) return Value::boolean(false);
  for (char32_t cp : cps)
    if (!pred(cp)) return Value::boolean(false);
  return Value::boolean(true);
}

Result<Value> pad(Interpreter& interp, const std::string& self, const CallArgs& args, int align) {
  RILL_ASSIGN_OR_RETURN(int64_t width, int_arg(args, 0, "width", 0));
  std::string fill = " ";
  if (const Value* f = args.get(1, "fillchar")) {
    if (f->kind != Kind::kString || n_code_points(f->s()) != 1)
      return Error{"The fill character must be exactly one character long"};
    fill = f->s();
  }
  const int64_t n = int64_t(n_code_points(self));
  if (width <= n) return Value::string(self);
  RILL_TRY(interp.check_bytes(size_t(width) * fill.size()));
  const int64_t total = width - n;
  // str.center puts the extra space on the right when the text length is even.
  int64_t left = align < 0 ? 0 : align > 0 ? total : total / 2 + (total & width & 1);
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += fill;
  out += self;
  for (int64_t k = 0; k < total - left; ++k) out += fill;
  return Value::string(std::move(out));
}

std::optional<Value> string_method(const Value& self_value, std::string_view name) {
  const std::string& self = self_value.s();
  auto bind = [&](NativeFn fn) { return make_builtin(std::string(name), std::move(fn)); };
  auto keep = self_value;  // keeps the string alive inside the closure
  if (name == "startswith" || name == "endswith") {
    const bool prefix = name == "startswith";
    return bind([keep, prefix](Interpreter&, const CallArgs& a) { return affix_test(keep.s(), a, prefix); });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    return bind([keep, left, right](Interpreter&, const CallArgs& a) -> Result<Value> {
      RILL_ASSIGN_OR_RETURN(auto chars, opt_str_arg(a, 0, "chars", "strip"));
      return Value::string(py_strip(keep.s(), chars, left, right));
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool from_right = name == "rsplit";
    return bind([keep, from_right](Interpreter& in, const CallArgs& a) -> Result<Value> {
      RILL_ASSIGN_OR_RETURN(auto sep, opt_str_arg(a, 0, "sep", "split"));
      RILL_ASSIGN_OR_RETURN(int64_t maxsplit, int_arg(a, 1, "maxsplit", -1));
      if (sep && sep->empty()) return Error{"empty separator"};
      auto parts = py_split(keep.s(), sep, maxsplit, from_right);
      RILL_TRY(in.check_items(parts.size()));
      return str_list(parts);
    });
  }
  if (name == "splitlines") {
    return bind([keep](Interpreter&, const CallArgs& a) -> Result<Value> {
      const Value* k = a.get(0, "keepends");
      return str_list(py_splitlines(keep.s(), k && truthy(*k)));
    });
  }
  if (name == "replace") {
    return bind([keep](Interpreter& in, const CallArgs& a) -> Result<Value> {
      RILL_ASSIGN_OR_RETURN(std::string old, str_arg(a, 0, "old", "replace"));
      RILL_ASSIGN_OR_RETURN(std::string repl, str_arg(a, 1, "new", "replace"));
      RILL_ASSIGN_OR_RETURN(int64_t count, int_arg(a, 2, "count", -1));
      std::string out = py_replace(keep.s(), old, repl, count);
      RILL_TRY(in.check_bytes(out.size()));
      return Value::string(std::move(out));
    });
  }
  using StrFn = std::string (*)(std::string_view);
  StrFn unary = nullptr;
  if (name == "lower" || name == "casefold") unary = py_lower_str;
  if (name == "upper") unary = py_upper_str;
  if (name == "title") unary = py_title;
  if (name == "capitalize") unary = py_capitalize;
  if (unary) {
    return bind(
        [keep, unary](Interpreter&, const CallArgs&) -> Result<Value> { return Value::string(unary(keep.s())); });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    const std::string method(name);
    return bind([keep, method](Interpreter&, const CallArgs& a) -> Result<Value> {
      RILL_ASSIGN_OR_RETURN(std::string sub, str_arg(a, 0, "sub", method));
      if (method == "count") return Value::integer(py_count(keep.s(), sub));
      const int64_t at = py_find(keep.s(), sub, method[0] == 'r');
      if (at < 0 && method.find("index") != std::string::npos) return Error{"substring not found"};
      return Value::integer(at);
    });
  }
  if (name == "format") {
    return bind([keep](Interpreter& in, const CallArgs& a) -> Result<Value> {
      RILL_ASSIGN_OR_RETURN(std::string out, brace_format(keep.s(), a));
      RILL_TRY(in.check_bytes(out.size()));
      return Value::string(std::move(out));
    });
  }
  if (name == "join") {
    return bind([keep](Interpreter& in, const CallArgs& a) -> Result<Value> {
      const Value* seq = a.get(0, "iterable");
      if (!seq) return Error{"join() takes exactly one argument (0 given)"};
      RILL_ASSIGN_OR_RETURN(List items, iterate(*seq));
      std::string out;
      for (size_t k = 0; k < items.size(); ++k) {
        if (items[k].kind != Kind::kString)
          return Error{"sequence item " + std::to_string(k) + ": expected str instance, " + type_name(items[k]) +
                       " found"};
        if (k) out += keep.s();
        out += items[k].s();
        RILL_TRY(in.check_bytes(out.size()));
      }
      return Value::string(std::move(out));
    });
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    const int align = name == "center" ? 0 : name == "ljust" ? -1 : 1;
    return bind([keep, align](Interpreter& in, const CallArgs& a) { return pad(in, keep.s(), a, align); });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const bool prefix = name == "removeprefix";
    return bind([keep, prefix](Interpreter&, const CallArgs& a) -> Result<Value> {
      RILL_ASSIGN_OR_RETURN(std::string x, str_arg(a, 0, prefix ? "prefix" : "suffix", "remove"));
      const std::string& s = keep.s();
      if (prefix && s.compare(0, x.size(), x) == 0) return Value::string(s.substr(x.size()));
      if (!prefix && s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
        return Value::string(s.substr(0, s.size() - x.size()));
      return Value::string(s);
    });
  }
  if (name == "partition" || name == "rpartition") {
    const bool from_right = name == "rpartition";
    return bind([keep, from_right](Interpreter&, const CallArgs& a) -> Result<Value> {
      RILL_ASSIGN_OR_RETURN(std::string sep, str_arg(a, 0, "sep", "partition"));
      if (sep.empty()) return Error{"empty separator"};
      const std::string& s = keep.s();
      const size_t at = from_right ? s.rfind(sep) : s.find(sep);
      if (at == std::string::npos)
        return Value::make_tuple(from_right ? List{Value::string(""), Value::string(""), keep}
                                            : List{keep, Value::string(""), Value::string("")});
      return Value::make_tuple(
          {Value::string(s.substr(0, at)), Value::string(sep), Value::string(s.substr(at + sep.size()))});
    });
  }
  using Pred = bool (*)(char32_t);
  Pred pred = nullptr;
  if (name == "isspace") pred = py_isspace;
  if (name == "isalnum") pred = py_isalnum;
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric")
    pred = [](char32_t c) { return c >= '0' && c <= '9'; };
  if (name == "isalpha") pred = [](char32_t c) { return py_isalnum(c) && !(c >= '0' && c <= '9'); };
  if (pred) {
    return bind(
        [keep, pred](Interpreter&, const CallArgs&) -> Result<Value> { return all_code_points(keep.s(), pred); });
  }
  if (name == "isupper" || name == "islower") {
    const bool upper = name == "isupper";
    return bind([keep, upper](Interpreter&, const CallArgs&) -> Result<Value> {
      bool any_cased = false;
      for (char32_t cp : decode_utf8(keep.s())) {
        if (upper ? py_is_cased_lower(cp) : py_is_cased_upper(cp)) return Value::boolean(false);
        any_cased |= py_is_cased_lower(cp) || py_is_cased_upper(cp);
      }
      return Value::boolean(any_cased);
    });
  }
  (void)self;
  return std::nullopt;
}

Value unsafe(const Value& self, std::string_view name) {
  return Value::undefined("access to attribute '" + std::string(name) + "' of '" + type_name(self) +
                          "' object is unsafe.");
}

std::optional<Value> dict_method(const Value& self, std::string_view name) {
  auto bind = [&](NativeFn fn) { return make_builtin(std::string(name), std::move(fn)); };
  if (name == "get") {
    return bind([self](Interpreter&, const CallArgs& a) -> Result<Value> {
      const Value* key = a.get(0, "key");
      if (!key) return Error{"get expected at least 1 argument, got 0"};
      if (const Value* v = self.dict->find(*key)) return *v;
      const Value* dflt = a.get(1, "default");
      return dflt ? *dflt : Value::none();
    });
  }
  if (name == "items" || name == "keys" || name == "values") {
    const int which = name == "items" ? 0 : name == "keys" ? 1 : 2;
    return bind([self, which](Interpreter&, const CallArgs&) -> Result<Value> {
      List out;
      for (const auto& [k, v] : self.dict->items)
        out.push_back(which == 0 ? Value::make_tuple({k, v}) : which == 1 ? k : v);
      return Value::make_list(std::move(out));
    });
  }
  if (name == "copy") return bind([self](Interpreter&, const CallArgs&) -> Result<Value> { return self; });
  if (name == "clear" || name == "pop" || name == "popitem" || name == "setdefault" || name == "update")
    return unsafe(self, name);
  return std::nullopt;
}

std::optional<Value> list_method(const Value& self, std::string_view name) {
  auto bind = [&](NativeFn fn) { return make_builtin(std::string(name), std::move(fn)); };
  if (name == "count" || name == "index") {
    const bool count = name == "count";
    return bind([self, count](Interpreter&, const CallArgs& a) -> Result<Value> {
      const Value* x = a.get(0, "value");
      if (!x) return Error{"expected 1 argument, got 0"};
      int64_t n = 0;
      for (size_t k = 0; k < self.list->size(); ++k) {
        if (!equals((*self.list)[k], *x)) continue;
        if (!count) return Value::integer(int64_t(k));
        ++n;
      }
      if (!count) return Error{repr(*x) + " is not in " + type_name(self)};
      return Value::integer(n);
    });
  }
  if (self.kind == Kind::kList) {
    if (name == "copy") return bind([self](Interpreter&, const CallArgs&) -> Result<Value> { return self; });
    if (name == "append" || name == "clear" || name == "extend" || name == "insert" || name == "pop" ||
        name == "remove" || name == "reverse" || name == "sort")
      return unsafe(self, name);
  }
  return std::nullopt;
}

}  // namespace

std::optional<Value> method_of(const Value& self, std::string_view name) {
  switch (self.kind) {
    case Kind::kString:
      return string_method(self, name);
    case Kind::kDict:
      return dict_method(self, name);
    case Kind::kList:
    case Kind::kTuple:
      return list_method(self, name);
    default:
      return std::nullopt;
  }
}

// ---- conversions and formatting ----

static std::string clean_number(std::string_view s, bool* ok) {
  const std::string stripped = py_strip(s, std::nullopt, true, true);
  std::string out;
  *ok = !stripped.empty();
  for (size_t k = 0; k < stripped.size(); ++k) {
    const char c = stripped[k];
    if (c == '_') {  // only between two digits
      if (k == 0 || k + 1 == stripped.size() || !std::isxdigit(static_cast<unsigned char>(stripped[k - 1])) ||
          !std::isxdigit(static_cast<unsigned char>(stripped[k + 1])))
        *ok = false;
      continue;
    }
    out.push_back(c);
  }
  return out;
}

std::optional<int64_t> parse_py_int(std::string_view s, int base) {
  bool ok = false;
  std::string t = clean_number(s, &ok);
  if (!ok || base < 2 || base > 36) return std::nullopt;
  size_t start = (t[0] == '+' || t[0] == '-') ? 1 : 0;
  if (start == t.size()) return std::nullopt;
  for (size_t k = start; k < t.size(); ++k)
    if (!std::isalnum(static_cast<unsigned char>(t[k]))) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(t.c_str(), &end, base);
  if (errno == ERANGE || *end != '\0') return std::nullopt;
  return int64_t(v);
}

std::optional<double> parse_py_float(std::string_view s) {
  bool ok = false;
  std::string t = clean_number(s, &ok);
  if (!ok) return std::nullopt;
  for (char c : t)
    if (c == 'x' || c == 'X' || c == 'p' || c == 'P') return std::nullopt;  // no hex floats
  std::string lower = py_lower_str(t);
  const size_t sign = (lower[0] == '+' || lower[0] == '-') ? 1 : 0;
  const std::string body = lower.substr(sign);
  if (body == "inf" || body == "infinity" || body == "nan") {
    const double v = body == "nan" ? NAN : INFINITY;
    return lower[0] == '-' ? -v : v;
  }
  if (body.empty() || !(std::isdigit(static_cast<unsigned char>(body[0])) || body[0] == '.')) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (*end != '\0') return std::nullopt;
  return v;
}

}  // namespace rill::jinja
