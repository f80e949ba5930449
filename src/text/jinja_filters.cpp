// jinja2's built-in filters (3.1 semantics) with transformers' tojson.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "text/jinja_builtins.h"
#include "text/jinja_string.h"

namespace rill::jinja {
namespace {

using FilterFn = Result<Value> (*)(Interpreter&, const Value&, const CallArgs&);

bool arg_true(const CallArgs& a, size_t i, std::string_view name, bool dflt = false) {
  const Value* v = a.get(i, name);
  return v ? truthy(*v) : dflt;
}

Result<int64_t> arg_int(const CallArgs& a, size_t i, std::string_view name, int64_t dflt) {
  const Value* v = a.get(i, name);
  if (!v) return dflt;
  if (!v->is_int()) return Error{"'" + type_name(*v) + "' object cannot be interpreted as an integer"};
  return v->as_int();
}

// str() as jinja's soft_str applies it (Undefined -> "").
std::string text_of(const Value& v) { return v.kind == Kind::kString ? v.s() : to_str(v); }

// jinja's make_attrgetter: "a.b.0" looks up each dotted part as an item
// (integer parts as indexes); Undefined results fall back to `dflt`.
Result<Value> attribute_of(Interpreter& in, const Value& item, const Value& attribute,
                           const Value* dflt) {
  Value cur = item;
  if (attribute.kind != Kind::kString) {
    RILL_ASSIGN_OR_RETURN(cur, in.get_item(cur, attribute));
  } else {
    for (const std::string& part : py_split(attribute.s(), std::string("."), -1, false)) {
      const bool is_index = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
      const Value key = is_index && part.size() < 18 ? Value::integer(std::stoll(part)) : Value::string(part);
      RILL_ASSIGN_OR_RETURN(cur, in.get_item(cur, key));
    }
  }
  if (cur.is_undefined() && dflt) return *dflt;
  return cur;
}

Value ignore_case(const Value& v) {
  return v.kind == Kind::kString ? Value::string(py_lower_str(v.s())) : v;
}

// Sort keys of `items` (attribute lookup and case folding as the filters ask).
Result<List> sort_keys(Interpreter& in, const List& items, const CallArgs& a, size_t attr_index,
                       size_t case_index) {
  const Value* attribute = a.get(attr_index, "attribute");
  const bool case_sensitive = arg_true(a, case_index, "case_sensitive");
  List keys;
  keys.reserve(items.size());
  for (const auto& item : items) {
    Value key = item;
    if (attribute && !attribute->is_none()) {
      RILL_ASSIGN_OR_RETURN(key, attribute_of(in, item, *attribute, nullptr));
    }
    keys.push_back(case_sensitive ? key : ignore_case(key));
  }
  return keys;
}

// Stable order of indexes by keys; reverse keeps equal items in input order.
Result<std::vector<size_t>> sorted_order(const List& keys, bool reverse) {
  std::vector<size_t> order(keys.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  Status failed;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    if (!failed.ok()) return false;
    auto lt = reverse ? less_than(keys[y], keys[x]) : less_than(keys[x], keys[y]);
    if (!lt.ok()) {
      failed = lt.error();
      return false;
    }
    return lt.value();
  });
  RILL_TRY(failed);
  return order;
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

Result<Value> f_batch(Interpreter& in, const Value& v, const CallArgs& a) {
  RILL_ASSIGN_OR_RETURN(int64_t n, arg_int(a, 0, "linecount", 0));
  if (n <= 0) return Error{"batch size must be positive"};
  const Value* fill = a.get(1, "fill_with");
  RILL_ASSIGN_OR_RETURN(List items, iterate(v));
  List out, row;
  for (auto& item : items) {
    row.push_back(std::move(item));
    if (int64_t(row.size()) == n) out.push_back(Value::make_list(std::exchange(row, {})));
  }
  if (!row.empty()) {
    if (fill && !fill->is_none()) {
      RILL_TRY(in.check_items(size_t(n)));
      while (int64_t(row.size()) < n) row.push_back(*fill);
    }
    out.push_back(Value::make_list(std::move(row)));
  }
  return Value::generator(std::move(out));
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

Result<Value> f_dictsort(Interpreter&, const Value& v, const CallArgs& a) {
  if (v.kind != Kind::kDict) return Error{"dictsort requires a mapping, not " + type_name(v)};
  const bool case_sensitive = arg_true(a, 0, "case_sensitive");
  const Value* by = a.get(1, "by");
  const bool by_value = by && by->kind == Kind::kString && by->s() == "value";
  if (by && !(by->kind == Kind::kString && (by->s() == "key" || by->s() == "value")))
    return Error{"You can only sort by either \"key\" or \"value\""};
  List keys, pairs;
  for (const auto& [k, val] : v.dict->items) {
    const Value& key = by_value ? val : k;
    keys.push_back(case_sensitive ? key : ignore_case(key));
    pairs.push_back(Value::make_tuple({k, val}));
  }
  RILL_ASSIGN_OR_RETURN(auto order, sorted_order(keys, arg_true(a, 2, "reverse")));
  List out;
  for (size_t i : order) out.push_back(pairs[i]);
  return Value::make_list(std::move(out));
}

Result<Value> f_escape(Interpreter&, const Value& v, const CallArgs&) {
  std::string out;
  for (char c : text_of(v)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return Value::string(std::move(out));
}

Result<Value> f_first(Interpreter&, const Value& v, const CallArgs&) {
  if (v.kind == Kind::kObject && !v.obj->namespace_items()) return Error{"'" + type_name(v) + "' object is not iterable"};
  RILL_ASSIGN_OR_RETURN(List items, iterate(v));
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Result<Value> f_last(Interpreter&, const Value& v, const CallArgs&) {
  if (v.kind == Kind::kGenerator) return Error{"'generator' object is not reversible"};
  RILL_ASSIGN_OR_RETURN(List items, iterate(v));
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
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

Result<Value> f_items(Interpreter&, const Value& v, const CallArgs&) {
  if (v.is_undefined()) return Value::generator({});
  if (v.kind != Kind::kDict) return Error{"Can only get item pairs from a mapping."};
  List out;
  for (const auto& [k, val] : v.dict->items) out.push_back(Value::make_tuple({k, val}));
  return Value::generator(std::move(out));
}

Result<Value> f_join(Interpreter& in, const Value& v, const CallArgs& a) {
  const Value* sep = a.get(0, "d");
  const Value* attribute = a.get(1, "attribute");
  RILL_ASSIGN_OR_RETURN(List items, iterate(v));
  std::string out;
  const std::string separator = sep ? text_of(*sep) : "";
  for (size_t k = 0; k < items.size(); ++k) {
    Value item = items[k];
    if (attribute && !attribute->is_none()) {
      RILL_ASSIGN_OR_RETURN(item, attribute_of(in, item, *attribute, nullptr));
    }
    if (k) out += separator;
    out += text_of(item);
    RILL_TRY(in.check_bytes(out.size()));
  }
  return Value::string(std::move(out));
}

Result<Value> f_length(Interpreter&, const Value& v, const CallArgs&) {
  switch (v.kind) {
    case Kind::kUndefined: return Value::integer(0);
    case Kind::kString: return Value::integer(int64_t(n_code_points(v.s())));
    case Kind::kList: case Kind::kTuple: return Value::integer(int64_t(v.list->size()));
    case Kind::kDict: return Value::integer(int64_t(v.dict->items.size()));
    default: return Error{"object of type '" + type_name(v) + "' has no len()"};
  }
}

Result<Value> f_list(Interpreter&, const Value& v, const CallArgs&) {
  RILL_ASSIGN_OR_RETURN(List items, iterate(v));
  return Value::make_list(std::move(items));
}

Result<Value> f_lower(Interpreter&, const Value& v, const CallArgs&) {
  return Value::string(py_lower_str(text_of(v)));
}

Result<Value> f_upper(Interpreter&, const Value& v, const CallArgs&) {
  return Value::string(py_upper_str(text_of(v)));
}

Result<Value> f_map(Interpreter& in, const Value& v, const CallArgs& a) {
  RILL_ASSIGN_OR_RETURN(List items, iterate(v));
  List out;
  if (const Value* attribute = a.kw("attribute")) {
    const Value* dflt = a.kw("default");
    for (const auto& item : items) {
      RILL_ASSIGN_OR_RETURN(Value x, attribute_of(in, item, *attribute, dflt));
      out.push_back(std::move(x));
    }
    return Value::generator(std::move(out));
  }
  if (a.positional.empty() || a.positional[0].kind != Kind::kString)
    return Error{"map requires a filter argument"};
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keyword = a.keyword;
  for (const auto& item : items) {
    RILL_ASSIGN_OR_RETURN(Value x, in.filter(a.positional[0].s(), item, rest));
    out.push_back(std::move(x));
  }
  return Value::generator(std::move(out));
}

Result<Value> min_max(Interpreter& in, const Value& v, const CallArgs& a, bool want_max) {
  RILL_ASSIGN_OR_RETURN(List items, iterate(v));
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  RILL_ASSIGN_OR_RETURN(List keys, sort_keys(in, items, a, 1, 0));
  size_t best = 0;
  for (size_t k = 1; k < items.size(); ++k) {
    RILL_ASSIGN_OR_RETURN(bool better, want_max ? less_than(keys[best], keys[k]) : less_than(keys[k], keys[best]));
    if (better) best = k;
  }
  return items[best];
}
Result<Value> f_max(Interpreter& in, const Value& v, const CallArgs& a) { return min_max(in, v, a, true); }
Result<Value> f_min(Interpreter& in, const Value& v, const CallArgs& a) { return min_max(in, v, a, false); }

// select/reject/selectattr/rejectattr.
Result<Value> select_impl(Interpreter& in, const Value& v, const CallArgs& a, bool keep, bool by_attr) {
  RILL_ASSIGN_OR_RETURN(List items, iterate(v));
  size_t next = 0;
  const Value* attribute = nullptr;
  if (by_attr) {
    if (a.positional.empty()) return Error{"Missing parameter for attribute name"};
    attribute = &a.positional[next++];
  }
  std::string test_name;
  CallArgs test_args;
  if (next < a.positional.size()) {
    if (a.positional[next].kind != Kind::kString) return Error{"test name must be a string"};
    test_name = a.positional[next++].s();
    test_args.positional.assign(a.positional.begin() + long(next), a.positional.end());
    test_args.keyword = a.keyword;
  }
  List out;
  for (const auto& item : items) {
    Value subject = item;
    if (attribute) {
      RILL_ASSIGN_OR_RETURN(subject, attribute_of(in, item, *attribute, nullptr));
    }
    bool ok = truthy(subject);
    if (!test_name.empty()) {
      RILL_ASSIGN_OR_RETURN(ok, in.test(test_name, subject, test_args));
    }
    if (ok == keep) out.push_back(item);
  }
  return Value::generator(std::move(out));
}
Result<Value> f_select(Interpreter& in, const Value& v, const CallArgs& a) { return select_impl(in, v, a, true, false); }
Result<Value> f_reject(Interpreter& in, const Value& v, const CallArgs& a) { return select_impl(in, v, a, false, false); }
Result<Value> f_selectattr(Interpreter& in, const Value& v, const CallArgs& a) { return select_impl(in, v, a, true, true); }
Result<Value> f_rejectattr(Interpreter& in, const Value& v, const CallArgs& a) { return select_impl(in, v, a, false, true); }

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

Result<Value> f_reverse(Interpreter&, const Value& v, const CallArgs&) {
  if (v.kind == Kind::kString) {
    std::u32string cps = decode_utf8(v.s());
    std::reverse(cps.begin(), cps.end());
    return Value::string(encode_utf8(cps));
  }
  RILL_ASSIGN_OR_RETURN(List items, iterate(v));
  std::reverse(items.begin(), items.end());
  return Value::generator(std::move(items));
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
  return v.kind == Kind::kString ? v : Value::string(text_of(v));
}

Result<Value> f_sort(Interpreter& in, const Value& v, const CallArgs& a) {
  RILL_ASSIGN_OR_RETURN(List items, iterate(v));
  RILL_ASSIGN_OR_RETURN(List keys, sort_keys(in, items, a, 2, 1));
  RILL_ASSIGN_OR_RETURN(auto order, sorted_order(keys, arg_true(a, 0, "reverse")));
  List out;
  for (size_t i : order) out.push_back(items[i]);
  return Value::make_list(std::move(out));
}

Result<Value> f_string(Interpreter&, const Value& v, const CallArgs&) {
  return v.kind == Kind::kString ? v : Value::string(to_str(v));
}

Result<Value> f_sum(Interpreter& in, const Value& v, const CallArgs& a) {
  const Value* attribute = a.get(0, "attribute");
  const Value* start = a.get(1, "start");
  RILL_ASSIGN_OR_RETURN(List items, iterate(v));
  Value total = start ? *start : Value::integer(0);
  for (const auto& item : items) {
    Value x = item;
    if (attribute && !attribute->is_none()) {
      RILL_ASSIGN_OR_RETURN(x, attribute_of(in, item, *attribute, nullptr));
    }
    RILL_ASSIGN_OR_RETURN(total, in.binary("+", total, x));
  }
  return total;
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
  const std::u32string cps = decode_utf8(text_of(v));
  if (int64_t(cps.size()) <= length + leeway) return Value::string(text_of(v));
  std::string head = encode_utf8(std::u32string_view(cps).substr(0, size_t(length - n_end)));
  if (!killwords) head = py_split(head, std::string(" "), 1, true)[0];
  return Value::string(head + end);
}

Result<Value> f_unique(Interpreter& in, const Value& v, const CallArgs& a) {
  RILL_ASSIGN_OR_RETURN(List items, iterate(v));
  RILL_ASSIGN_OR_RETURN(List keys, sort_keys(in, items, a, 1, 0));
  List out, seen;
  for (size_t k = 0; k < items.size(); ++k) {
    bool dup = false;
    for (const auto& s : seen) dup = dup || equals(s, keys[k]);
    if (dup) continue;
    seen.push_back(keys[k]);
    out.push_back(items[k]);
  }
  return Value::generator(std::move(out));
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

const std::pair<std::string_view, FilterFn> kFilters[] = {
    {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"capitalize", f_capitalize},
    {"center", f_center}, {"count", f_length}, {"d", f_default}, {"default", f_default},
    {"dictsort", f_dictsort}, {"e", f_escape}, {"escape", f_escape}, {"first", f_first},
    {"float", f_float}, {"forceescape", f_escape}, {"format", f_format}, {"indent", f_indent},
    {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last},
    {"length", f_length}, {"list", f_list}, {"lower", f_lower}, {"map", f_map},
    {"max", f_max}, {"min", f_min}, {"reject", f_reject}, {"rejectattr", f_rejectattr},
    {"replace", f_replace}, {"reverse", f_reverse}, {"round", f_round}, {"safe", f_safe},
    {"select", f_select}, {"selectattr", f_selectattr}, {"sort", f_sort}, {"string", f_string},
    {"sum", f_sum}, {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim},
    {"truncate", f_truncate}, {"unique", f_unique}, {"upper", f_upper},
    {"wordcount", f_wordcount},
};

}  // namespace

bool has_filter(std::string_view name) {
  for (const auto& [n, fn] : kFilters)
    if (n == name) return true;
  return false;
}

Result<Value> apply_filter(Interpreter& interp, std::string_view name, const Value& v,
                           const CallArgs& args) {
  for (const auto& [n, fn] : kFilters)
    if (n == name) return fn(interp, v, args);
  return Error{"no filter named '" + std::string(name) + "'"};
}

}  // namespace rill::jinja
