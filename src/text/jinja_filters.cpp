// jinja2's built-in filters (3.1 semantics) with transformers' tojson.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "text/jinja_builtins.h"
#include "text/jinja_filters_impl.h"
#include "text/jinja_string.h"

namespace rill::jinja {
namespace filters {
// Helpers shared with jinja_filters_seq.cpp (declared in jinja_filters_impl.h).

bool arg_true(const CallArgs& a, size_t i, std::string_view name, bool dflt) {
  const Value* v = a.get(i, name);
  return v ? truthy(*v) : dflt;
}

Result<int64_t> arg_int(const CallArgs& a, size_t i, std::string_view name, int64_t dflt) {
  const Value* v = a.get(i, name);
  if (!v) return dflt;
  if (!v->is_int()) return Error{"'" + type_name(*v) + "' object cannot be interpreted as an integer"};
  return v->as_int();
}

std::string text_of(const Value& v) {
  return v.kind == Kind::kString ? v.s() : to_str(v);
}

Result<Value> f_abs(Interpreter&, const Value& v, const CallArgs&) {
  if (v.kind == Kind::kFloat) return Value::number(std::fabs(v.f));
  if (v.is_int()) {
    if (v.as_int() == INT64_MIN) return Error{"integer overflow"};
    return Value::integer(std::llabs(v.as_int()));
  }
  if (v.is_undefined()) return Error{v.undefined_message()};
  return Error{"bad operand type for abs(): '" + type_name(v) + "'"};
}

Result<Value> f_attr(Interpreter& in, const Value& v, const CallArgs& a) {
  const Value* name = a.get(0, "name");
  if (!name || name->kind != Kind::kString) return Error{"attr filter needs a string name"};
  // Python attributes only (methods, object fields), never dict items.
  if (v.is_undefined()) return Error{v.undefined_message()};
  if (v.kind == Kind::kObject) return in.get_attr(v, name->s());
  if (auto m = method_of(v, name->s())) return *m;
  return Value::undefined("'" + type_name(v) + " object' has no attribute '" + name->s() + "'");
}

Result<Value> f_capitalize(Interpreter&, const Value& v, const CallArgs&) {
  return Value::string(py_capitalize(text_of(v)));
}

Result<Value> f_center(Interpreter& in, const Value& v, const CallArgs& a) {
  RILL_ASSIGN_OR_RETURN(int64_t width, arg_int(a, 0, "width", 80));
  const std::string s = text_of(v);
  const int64_t n = int64_t(n_code_points(s));
  if (width <= n) return Value::string(s);
  RILL_TRY(in.check_bytes(size_t(width)));
  const int64_t total = width - n;
  const int64_t left = total / 2 + (total & width & 1);
  return Value::string(std::string(size_t(left), ' ') + s + std::string(size_t(total - left), ' '));
}

Result<Value> f_default(Interpreter&, const Value& v, const CallArgs& a) {
  const Value* dflt = a.get(0, "default_value");
  const bool boolean = arg_true(a, 1, "boolean");
  if (v.is_undefined() || (boolean && !truthy(v))) return dflt ? *dflt : Value::string("");
  return v;
}

Result<Value> f_escape(Interpreter&, const Value& v, const CallArgs&) {
  if (v.kind == Kind::kString && v.markup) return v;  // already escaped
  Value out = Value::string(html_escape(text_of(v)));
  out.markup = true;
  return out;
}

Result<Value> f_forceescape(Interpreter&, const Value& v, const CallArgs&) {
  Value out = Value::string(html_escape(text_of(v)));
  out.markup = true;
  return out;
}

Result<Value> f_float(Interpreter&, const Value& v, const CallArgs& a) {
  const Value* dflt = a.get(0, "default");
  if (v.is_undefined()) return Error{v.undefined_message()};
  if (v.is_number()) return Value::number(v.as_double());
  if (v.kind == Kind::kString)
    if (auto d = parse_py_float(v.s())) return Value::number(*d);
  return dflt ? *dflt : Value::number(0.0);
}

Result<Value> f_format(Interpreter& in, const Value& v, const CallArgs& a) {
  if (!a.positional.empty() && !a.keyword.empty())
    return Error{"can't handle positional and keyword arguments at the same time"};
  Value args;
  if (!a.keyword.empty()) {
    Dict d;
    for (const auto& [k, val] : a.keyword) d.set(Value::string(k), val);
    args = Value::make_dict(std::move(d));
  } else {
    args = Value::make_tuple(a.positional);
  }
  RILL_ASSIGN_OR_RETURN(std::string out, percent_format(in, text_of(v), args));
  return Value::string(std::move(out));
}

Result<Value> f_indent(Interpreter& in, const Value& v, const CallArgs& a) {
  std::string unit = "    ";
  if (const Value* w = a.get(0, "width")) {
    if (w->kind == Kind::kString) {
      unit = w->s();
    } else if (w->is_int()) {
      RILL_TRY(in.check_bytes(size_t(std::max<int64_t>(0, w->as_int()))));
      unit.assign(size_t(std::max<int64_t>(0, w->as_int())), ' ');
    } else {
      return Error{"indent width must be an integer or a string"};
    }
  }
  if (v.is_undefined()) return Error{v.undefined_message()};
  if (v.kind != Kind::kString)  // jinja does `s += "\n"` without str()
    return Error{"unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'"};
  const bool first = arg_true(a, 1, "first"), blank = arg_true(a, 2, "blank");
  const std::vector<std::string> lines = py_splitlines(text_of(v) + "\n", false);
  std::string out;
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k) {
      out += "\n";
      if (blank || !lines[k].empty()) out += unit;
    }
    out += lines[k];
    RILL_TRY(in.check_bytes(out.size()));
  }
  if (first) out = unit + out;
  return Value::string(std::move(out));
}

Result<Value> f_int(Interpreter&, const Value& v, const CallArgs& a) {
  const Value* dflt = a.get(0, "default");
  RILL_ASSIGN_OR_RETURN(int64_t base, arg_int(a, 1, "base", 10));
  if (v.is_undefined()) return Error{v.undefined_message()};
  if (v.is_int()) return Value::integer(v.as_int());
  if (v.kind == Kind::kFloat) {
    if (!std::isfinite(v.f)) return Error{"cannot convert float infinity or NaN to integer"};
    if (std::fabs(v.f) >= 9.2e18) return Error{"integer overflow"};
    return Value::integer(int64_t(v.f));
  }
  if (v.kind == Kind::kString) {
    if (auto i = parse_py_int(v.s(), int(base))) return Value::integer(*i);
    if (auto d = parse_py_float(v.s())) {
      if (!std::isfinite(*d)) return Error{"cannot convert float infinity or NaN to integer"};
      if (std::fabs(*d) < 9.2e18) return Value::integer(int64_t(*d));
    }
  }
  return dflt ? *dflt : Value::integer(0);
}

Result<Value> f_lower(Interpreter&, const Value& v, const CallArgs&) {
  return Value::string(py_lower_str(text_of(v)));
}

Result<Value> f_upper(Interpreter&, const Value& v, const CallArgs&) {
  return Value::string(py_upper_str(text_of(v)));
}

Result<Value> f_replace(Interpreter& in, const Value& v, const CallArgs& a) {
  const Value* old = a.get(0, "old");
  const Value* repl = a.get(1, "new");
  if (!old || !repl) return Error{"replace filter needs old and new"};
  RILL_ASSIGN_OR_RETURN(int64_t count, arg_int(a, 2, "count", -1));
  const Value* c = a.get(2, "count");
  if (c && c->is_none()) count = -1;
  std::string out = py_replace(text_of(v), text_of(*old), text_of(*repl), count);
  RILL_TRY(in.check_bytes(out.size()));
  return Value::string(std::move(out));
}

// Python's round(x, n) for floats: correctly rounded, ties to even; glibc's
// printf rounds the exact binary value the same way.
double py_round(double x, int64_t digits) {
  if (!std::isfinite(x) || digits > 300) return x;
  if (digits < 0) {
    const double p = std::pow(10.0, double(-digits));
    return std::nearbyint(x / p) * p;
  }
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.*f", int(digits), x);
  return std::strtod(buf, nullptr);
}

Result<Value> f_round(Interpreter&, const Value& v, const CallArgs& a) {
  RILL_ASSIGN_OR_RETURN(int64_t precision, arg_int(a, 0, "precision", 0));
  const Value* method = a.get(1, "method");
  const std::string m = method ? text_of(*method) : "common";
  if (m != "common" && m != "ceil" && m != "floor") return Error{"method must be common, ceil or floor"};
  if (v.is_undefined()) return Error{v.undefined_message()};
  if (!v.is_number()) return Error{"type " + type_name(v) + " doesn't define __round__ method"};
  if (m == "common") {
    if (v.is_int()) return Value::integer(v.as_int());  // round(int, n>=0) is the int itself
    return Value::number(py_round(v.f, precision));
  }
  const double p = std::pow(10.0, double(precision));
  const double scaled = v.as_double() * p;
  return Value::number((m == "ceil" ? std::ceil(scaled) : std::floor(scaled)) / p);
}

Result<Value> f_safe(Interpreter&, const Value& v, const CallArgs&) {
  Value out = v.kind == Kind::kString ? v : Value::string(text_of(v));
  out.markup = true;
  return out;
}

Result<Value> f_string(Interpreter&, const Value& v, const CallArgs&) {
  return v.kind == Kind::kString ? v : Value::string(to_str(v));
}

Result<Value> f_title(Interpreter&, const Value& v, const CallArgs&) {
  // jinja's do_title: capitalise each chunk that follows [-\s({\[<]+.
  const std::u32string cps = decode_utf8(text_of(v));
  std::u32string out;
  bool at_word_start = true;
  for (char32_t cp : cps) {
    const bool sep = py_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
    if (sep) {
      out.push_back(cp);
      at_word_start = true;
    } else {
      out.push_back(at_word_start ? py_upper(cp) : py_lower(cp));
      at_word_start = false;
    }
  }
  return Value::string(encode_utf8(out));
}

Result<Value> f_tojson(Interpreter& in, const Value& v, const CallArgs& a) {
  JsonOptions opt;
  opt.ensure_ascii = arg_true(a, 0, "ensure_ascii");
  if (const Value* indent = a.get(1, "indent"); indent && !indent->is_none()) {
    if (indent->kind == Kind::kString) {
      opt.indent = indent->s();
    } else if (indent->is_int()) {
      RILL_TRY(in.check_bytes(size_t(std::max<int64_t>(0, indent->as_int()))));
      opt.indent = std::string(size_t(std::max<int64_t>(0, indent->as_int())), ' ');
    } else {
      return Error{"tojson indent must be an integer or a string"};
    }
    opt.item_sep = ",";
  }
  if (const Value* seps = a.get(2, "separators"); seps && !seps->is_none()) {
    if (!seps->is_sequence() || seps->list->size() != 2 || (*seps->list)[0].kind != Kind::kString ||
        (*seps->list)[1].kind != Kind::kString)
      return Error{"tojson separators must be a (item_separator, key_separator) pair"};
    opt.item_sep = (*seps->list)[0].s();
    opt.key_sep = (*seps->list)[1].s();
  }
  opt.sort_keys = arg_true(a, 3, "sort_keys");
  RILL_ASSIGN_OR_RETURN(std::string out, to_json(v, opt));
  RILL_TRY(in.check_bytes(out.size()));
  return Value::string(std::move(out));
}

Result<Value> f_trim(Interpreter&, const Value& v, const CallArgs& a) {
  std::optional<std::string> chars;
  if (const Value* c = a.get(0, "chars"); c && !c->is_none()) chars = text_of(*c);
  return Value::string(py_strip(text_of(v), chars, true, true));
}

Result<Value> f_truncate(Interpreter&, const Value& v, const CallArgs& a) {
  RILL_ASSIGN_OR_RETURN(int64_t length, arg_int(a, 0, "length", 255));
  const bool killwords = arg_true(a, 1, "killwords");
  const Value* end_v = a.get(2, "end");
  const std::string end = end_v ? text_of(*end_v) : "...";
  RILL_ASSIGN_OR_RETURN(int64_t leeway, arg_int(a, 3, "leeway", 5));
  const int64_t n_end = int64_t(n_code_points(end));
  if (length < n_end) return Error{"expected length >= " + std::to_string(n_end) + ", got " + std::to_string(length)};
  if (leeway < 0) return Error{"expected leeway >= 0, got " + std::to_string(leeway)};
  if (v.kind != Kind::kString) {  // jinja returns short sequences unchanged, fails on others
    RILL_ASSIGN_OR_RETURN(int64_t n, py_len(v));
    if (n <= length + leeway) return v;
    return Error{"'" + type_name(v) + "' object has no attribute 'rsplit'"};
  }
  const std::u32string cps = decode_utf8(v.s());
  if (int64_t(cps.size()) <= length + leeway) return v;
  std::string head = encode_utf8(std::u32string_view(cps).substr(0, size_t(length - n_end)));
  if (!killwords) head = py_split(head, std::string(" "), 1, true)[0];
  return Value::string(head + end);
}

Result<Value> f_wordcount(Interpreter&, const Value& v, const CallArgs&) {
  int64_t n = 0;
  bool in_word = false;
  for (char32_t cp : decode_utf8(text_of(v))) {
    const bool w = py_isalnum(cp) || cp == '_';
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

struct FilterDef {
  std::string_view name;
  FilterFn fn;
  std::vector<std::string_view> params;  // after the value, as jinja2 declares them
  bool variadic = false;                 // *args/**kwargs: checked by the filter
};

const std::vector<FilterDef>& filters() {
  static const std::vector<FilterDef> kFilters = {
      {"abs", f_abs, {}},
      {"attr", f_attr, {"name"}},
      {"batch", f_batch, {"linecount", "fill_with"}},
      {"capitalize", f_capitalize, {}},
      {"center", f_center, {"width"}},
      {"count", f_length, {}},
      {"d", f_default, {"default_value", "boolean"}},
      {"default", f_default, {"default_value", "boolean"}},
      {"dictsort", f_dictsort, {"case_sensitive", "by", "reverse"}},
      {"e", f_escape, {}},
      {"escape", f_escape, {}},
      {"first", f_first, {}},
      {"float", f_float, {"default"}},
      {"forceescape", f_forceescape, {}},
      {"format", f_format, {}, true},
      {"indent", f_indent, {"width", "first", "blank"}},
      {"int", f_int, {"default", "base"}},
      {"items", f_items, {}},
      {"join", f_join, {"d", "attribute"}},
      {"last", f_last, {}},
      {"length", f_length, {}},
      {"list", f_list, {}},
      {"lower", f_lower, {}},
      {"map", f_map, {}, true},
      {"max", f_max, {"case_sensitive", "attribute"}},
      {"min", f_min, {"case_sensitive", "attribute"}},
      {"reject", f_reject, {}, true},
      {"rejectattr", f_rejectattr, {}, true},
      {"replace", f_replace, {"old", "new", "count"}},
      {"reverse", f_reverse, {}},
      {"round", f_round, {"precision", "method"}},
      {"safe", f_safe, {}},
      {"select", f_select, {}, true},
      {"selectattr", f_selectattr, {}, true},
      {"sort", f_sort, {"reverse", "case_sensitive", "attribute"}},
      {"string", f_string, {}},
      {"sum", f_sum, {"attribute", "start"}},
      {"title", f_title, {}},
      {"tojson", f_tojson, {"ensure_ascii", "indent", "separators", "sort_keys"}},
      {"trim", f_trim, {"chars"}},
      {"truncate", f_truncate, {"length", "killwords", "end", "leeway"}},
      {"unique", f_unique, {"case_sensitive", "attribute"}},
      {"upper", f_upper, {}},
      {"wordcount", f_wordcount, {}},
  };
  return kFilters;
}

// Python's argument binding errors for a filter's signature.
Status check_signature(const FilterDef& f, const CallArgs& args) {
  if (f.variadic) return {};
  if (args.positional.size() > f.params.size())
    return Error{"filter '" + std::string(f.name) + "' takes at most " + std::to_string(f.params.size()) +
                 " argument(s), " + std::to_string(args.positional.size()) + " given"};
  for (const auto& [key, value] : args.keyword) {
    const auto it = std::find(f.params.begin(), f.params.end(), key);
    if (it == f.params.end())
      return Error{"filter '" + std::string(f.name) + "' got an unexpected keyword argument '" + key + "'"};
    if (size_t(it - f.params.begin()) < args.positional.size())
      return Error{"filter '" + std::string(f.name) + "' got multiple values for argument '" + key + "'"};
  }
  return {};
}

}  // namespace filters

bool has_filter(std::string_view name) {
  for (const auto& f : filters::filters())
    if (f.name == name) return true;
  return false;
}

Result<Value> apply_filter(Interpreter& interp, std::string_view name, const Value& v, const CallArgs& args) {
  for (const auto& f : filters::filters()) {
    if (f.name != name) continue;
    RILL_TRY(filters::check_signature(f, args));
    return f.fn(interp, v, args);
  }
  return Error{"no filter named '" + std::string(name) + "'"};
}

}  // namespace rill::jinja
