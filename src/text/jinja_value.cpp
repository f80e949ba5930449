#include "text/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "text/jinja_string.h"

namespace rill::jinja {

// ---- construction ----

Value Value::undefined(std::string error_on_use) {
  Value v;
  v.kind = Kind::kUndefined;
  v.str = std::make_shared<const std::string>(std::move(error_on_use));
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::kBool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::kInt;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.kind = Kind::kString;
  v.str = std::make_shared<const std::string>(std::move(x));
  return v;
}
static uint32_t max_depth(const List& items) {
  uint32_t d = 0;
  for (const auto& item : items) d = std::max(d, item.depth);
  return d;
}

static Value list_like(Kind kind, List x) {
  Value v;
  v.kind = kind;
  v.depth = 1 + max_depth(x);
  v.list = std::make_shared<const List>(std::move(x));
  return v;
}
Value Value::make_list(List x) {
  return list_like(Kind::kList, std::move(x));
}
Value Value::make_tuple(List x) {
  return list_like(Kind::kTuple, std::move(x));
}
Value Value::generator(std::shared_ptr<Generator> g) {
  Value v;
  v.kind = Kind::kGenerator;
  v.depth = 1;
  v.gen = std::move(g);
  return v;
}

Value Value::generator(List x) {
  auto items = std::make_shared<const List>(std::move(x));
  size_t pos = 0;
  return generator(std::make_shared<Generator>(
      [items, pos]() mutable -> Result<std::optional<Value>> {
        if (pos >= items->size()) return std::optional<Value>();
        return std::optional<Value>((*items)[pos++]);
      },
      0));
}

Result<std::optional<Value>> Generator::next() {
  if (done_) return std::optional<Value>();
  auto r = step_();
  if (!r.ok() || !r.value().has_value()) done_ = true;
  return r;
}

int generator_chain(const Value& v) {
  return v.kind == Kind::kGenerator ? v.gen->chain() : 0;
}

Generator::Step iterator_of(const Value& v) {
  if (v.kind == Kind::kGenerator) {
    auto g = v.gen;
    return [g]() { return g->next(); };
  }
  size_t pos = 0;
  std::shared_ptr<List> items;  // built on the first pull
  return [v, pos, items]() mutable -> Result<std::optional<Value>> {
    if (!items) {
      RILL_ASSIGN_OR_RETURN(List all, iterate(v));
      items = std::make_shared<List>(std::move(all));
    }
    if (pos >= items->size()) return std::optional<Value>();
    return std::optional<Value>((*items)[pos++]);
  };
}
Value Value::make_dict(Dict x) {
  Value v;
  v.kind = Kind::kDict;
  v.depth = 1;
  for (const auto& [key, value] : x.items) v.depth = std::max(v.depth, 1 + std::max(key.depth, value.depth));
  v.dict = std::make_shared<const Dict>(std::move(x));
  return v;
}
Value Value::object(std::shared_ptr<Object> o) {
  Value v;
  v.kind = Kind::kObject;
  v.obj = std::move(o);
  return v;
}

std::string Value::undefined_message() const {
  return str && !str->empty() ? *str : std::string("value is undefined");
}

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : items)
    if (equals(k, key)) return &v;
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k.kind == Kind::kString && *k.str == key) return &v;
  return nullptr;
}

void Dict::set(Value key, Value value) {
  for (auto& [k, v] : items) {
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

const Value* CallArgs::kw(std::string_view name) const {
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return nullptr;
}

const Value* CallArgs::get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  return kw(name);
}

Result<Value> Object::call(Interpreter&, const CallArgs&) const {
  return Error{"'" + type_name() + "' object is not callable"};
}

Status Object::set_attr(std::string_view, Value) {
  return Error{"can only assign attributes of a namespace, not of a '" + type_name() + "'"};
}

// ---- Python semantics ----

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.b;
    case Kind::kInt:
      return v.i != 0;
    case Kind::kFloat:
      return v.f != 0.0;
    case Kind::kString:
      return !v.str->empty();
    case Kind::kList:
    case Kind::kTuple:
      return !v.list->empty();
    case Kind::kDict:
      return !v.dict->items.empty();
    case Kind::kGenerator:
    case Kind::kObject:
      return true;
  }
  return false;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view sci(buf, size_t(res.ptr - buf));  // [-]d[.ddd]e[+-]XX
  std::string out;
  if (sci.front() == '-') {
    out.push_back('-');
    sci.remove_prefix(1);
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos))
    if (c != '.') digits.push_back(c);
  int exp = 0;
  std::from_chars(sci.data() + e_pos + 1 + (sci[e_pos + 1] == '+'), sci.data() + sci.size(), exp);
  const int decpt = exp + 1;
  const int n_digits = int(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out.push_back(digits[0]);
    if (n_digits > 1) {
      out.push_back('.');
      out.append(digits, 1);
    }
    char e_buf[16];
    std::snprintf(e_buf, sizeof e_buf, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += e_buf;
  } else if (decpt <= 0) {
    out += "0.";
    out.append(size_t(-decpt), '0');
    out += digits;
  } else if (decpt >= n_digits) {
    out += digits;
    out.append(size_t(decpt - n_digits), '0');
    out += ".0";
  } else {
    out.append(digits, 0, size_t(decpt));
    out.push_back('.');
    out.append(digits, size_t(decpt));
  }
  return out;
}

static std::string join_repr(const List& items, const char* open, const char* close, bool one_tuple) {
  std::string out = open;
  for (size_t k = 0; k < items.size(); ++k) {
    if (k) out += ", ";
    out += repr(items[k]);
  }
  if (one_tuple && items.size() == 1) out += ",";
  out += close;
  return out;
}

std::string dict_repr(const Dict& d) {
  std::string out = "{";
  for (size_t k = 0; k < d.items.size(); ++k) {
    if (k) out += ", ";
    out += repr(d.items[k].first);
    out += ": ";
    out += repr(d.items[k].second);
  }
  return out + "}";
}

namespace {
// Objects (namespaces) can nest without bound; printing stops at this depth.
constexpr int kMaxPrintDepth = 512;
thread_local int print_depth = 0;
struct PrintDepth {
  PrintDepth() { ++print_depth; }
  ~PrintDepth() { --print_depth; }
};
}  // namespace

std::string to_str(const Value& v) {
  PrintDepth guard;
  if (print_depth > kMaxPrintDepth) return "...";
  switch (v.kind) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return v.b ? "True" : "False";
    case Kind::kInt:
      return std::to_string(v.i);
    case Kind::kFloat:
      return float_repr(v.f);
    case Kind::kString:
      return *v.str;
    case Kind::kList:
      return join_repr(*v.list, "[", "]", false);
    case Kind::kTuple:
      return join_repr(*v.list, "(", ")", true);
    case Kind::kDict:
      return dict_repr(*v.dict);
    case Kind::kGenerator:
      return "<generator object>";
    case Kind::kObject:
      return v.obj->repr();
  }
  return "";
}

std::string repr(const Value& v) {
  if (v.kind == Kind::kString) return py_repr_string(*v.str);
  if (v.kind == Kind::kUndefined) return "Undefined";
  return to_str(v);
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kDict:
      return "dict";
    case Kind::kGenerator:
      return "generator";
    case Kind::kObject:
      return v.obj->type_name();
  }
  return "object";
}

static bool lists_equal(const List& a, const List& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k)
    if (!equals(a[k], b[k])) return false;
  return true;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_int() && b.is_int()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return *a.str == *b.str;
    case Kind::kList:
    case Kind::kTuple:
      return lists_equal(*a.list, *b.list);
    case Kind::kDict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* other = b.dict->find(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    }
    case Kind::kGenerator:
      return a.gen == b.gen;
    case Kind::kObject:
      return a.obj == b.obj;
    default:
      return false;
  }
}

Result<bool> less_than(const Value& a, const Value& b) {
  if (a.is_undefined()) return Error{a.undefined_message()};
  if (b.is_undefined()) return Error{b.undefined_message()};
  if (a.is_number() && b.is_number()) {
    if (a.is_int() && b.is_int()) return a.as_int() < b.as_int();
    return a.as_double() < b.as_double();
  }
  if (a.kind == b.kind) {
    if (a.kind == Kind::kString) return *a.str < *b.str;  // UTF-8 byte order = code point order
    if (a.kind == Kind::kList || a.kind == Kind::kTuple) {
      const List& x = *a.list;
      const List& y = *b.list;
      for (size_t k = 0; k < x.size() && k < y.size(); ++k)
        if (!equals(x[k], y[k])) return less_than(x[k], y[k]);
      return x.size() < y.size();
    }
  }
  return Error{"'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'"};
}

Result<List> iterate(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return List{};
    case Kind::kString: {
      List out;
      for (char32_t cp : decode_utf8(*v.str)) {
        std::string one;
        append_utf8(cp, one);
        out.push_back(Value::string(std::move(one)));
      }
      return out;
    }
    case Kind::kList:
    case Kind::kTuple:
      return *v.list;
    case Kind::kGenerator: {  // consumes what is left of it
      List out;
      while (true) {
        RILL_ASSIGN_OR_RETURN(std::optional<Value> item, v.gen->next());
        if (!item) return out;
        out.push_back(std::move(*item));
        if (out.size() > (size_t(1) << 24)) return Error{"generator produced too many items"};
      }
    }
    case Kind::kDict: {
      List out;
      out.reserve(v.dict->items.size());
      for (const auto& kv : v.dict->items) out.push_back(kv.first);
      return out;
    }
    default:
      return Error{"'" + type_name(v) + "' object is not iterable"};
  }
}

template <typename Json>
static Value json_to_value(const Json& j, int depth) {
  if (depth > kMaxFromJsonDepth && (j.is_array() || j.is_object())) {
    return Value::undefined("a template value is nested deeper than " + std::to_string(kMaxFromJsonDepth) + " levels");
  }
  switch (j.type()) {
    case Json::value_t::boolean:
      return Value::boolean(j.template get<bool>());
    case Json::value_t::number_integer:
      return Value::integer(j.template get<int64_t>());
    case Json::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u <= uint64_t(INT64_MAX)) return Value::integer(int64_t(u));
      return Value::number(double(u));
    }
    case Json::value_t::number_float:
      return Value::number(j.template get<double>());
    case Json::value_t::string:
      return Value::string(j.template get<std::string>());
    case Json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(json_to_value(e, depth + 1));
      return Value::make_list(std::move(items));
    }
    case Json::value_t::object: {
      Dict d;
      d.items.reserve(j.size());
      for (const auto& [k, e] : j.items()) d.items.emplace_back(Value::string(k), json_to_value(e, depth + 1));
      return Value::make_dict(std::move(d));
    }
    default:
      return Value::none();
  }
}

Value from_json(const nlohmann::ordered_json& j) {
  return json_to_value(j, 1);
}
Value from_json(const nlohmann::json& j) {
  return json_to_value(j, 1);
}

// ---- json.dumps ----

static void append_u_escape(char32_t unit, std::string& out) {
  static const char kHex[] = "0123456789abcdef";
  out += "\\u";
  for (int d = 3; d >= 0; --d) out.push_back(kHex[(unit >> (4 * d)) & 15]);
}

static void json_escape_byte(char c, std::string& out) {
  switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\r':
      out += "\\r";
      break;
    case '\t':
      out += "\\t";
      break;
    case '\b':
      out += "\\b";
      break;
    case '\f':
      out += "\\f";
      break;
    default:
      if (static_cast<unsigned char>(c) < 0x20)
        append_u_escape(char32_t(c), out);
      else
        out.push_back(c);
  }
}

static void json_escape(std::string_view s, bool ensure_ascii, std::string& out) {
  out.push_back('"');
  if (ensure_ascii && !is_ascii(s)) {
    for (char32_t cp : decode_utf8(s)) {
      if (cp < 0x80) {
        json_escape_byte(char(cp), out);
      } else if (cp < 0x10000) {
        append_u_escape(cp, out);
      } else {  // UTF-16 surrogate pair
        const char32_t v = cp - 0x10000;
        append_u_escape(0xD800 + (v >> 10), out);
        append_u_escape(0xDC00 + (v & 0x3FF), out);
      }
    }
  } else {
    for (char c : s) json_escape_byte(c, out);
  }
  out.push_back('"');
}

namespace {
struct JsonWriter {
  const JsonOptions& opt;
  std::string out;

  void newline(int depth) {
    out.push_back('\n');
    for (int k = 0; k < depth; ++k) out += *opt.indent;
  }

  Status key(const Value& k) {
    switch (k.kind) {
      case Kind::kString:
        json_escape(*k.str, opt.ensure_ascii, out);
        return {};
      case Kind::kNone:
        out += "\"null\"";
        return {};
      case Kind::kBool:
        out += k.b ? "\"true\"" : "\"false\"";
        return {};
      case Kind::kInt:
        out += "\"" + std::to_string(k.i) + "\"";
        return {};
      case Kind::kFloat:
        out += "\"" + float_repr(k.f) + "\"";
        return {};
      default:
        return Error{"keys must be str, int, float, bool or None, not " + type_name(k)};
    }
  }

  Status write(const Value& v, int depth) {
    if (depth > 512) return Error{"tojson: value nested too deeply"};
    switch (v.kind) {
      case Kind::kNone:
        out += "null";
        return {};
      case Kind::kBool:
        out += v.b ? "true" : "false";
        return {};
      case Kind::kInt:
        out += std::to_string(v.i);
        return {};
      case Kind::kFloat:
        if (std::isnan(v.f))
          out += "NaN";
        else if (std::isinf(v.f))
          out += v.f < 0 ? "-Infinity" : "Infinity";
        else
          out += float_repr(v.f);
        return {};
      case Kind::kString:
        json_escape(*v.str, opt.ensure_ascii, out);
        return {};
      case Kind::kList:
      case Kind::kTuple: {
        if (v.list->empty()) {
          out += "[]";
          return {};
        }
        out.push_back('[');
        for (size_t k = 0; k < v.list->size(); ++k) {
          if (k) out += opt.item_sep;
          if (opt.indent) newline(depth + 1);
          RILL_TRY(write((*v.list)[k], depth + 1));
        }
        if (opt.indent) newline(depth);
        out.push_back(']');
        return {};
      }
      case Kind::kDict: {
        if (v.dict->items.empty()) {
          out += "{}";
          return {};
        }
        std::vector<const std::pair<Value, Value>*> items;
        for (const auto& kv : v.dict->items) items.push_back(&kv);
        if (opt.sort_keys) {
          Status failed;
          std::stable_sort(items.begin(), items.end(), [&](auto* x, auto* y) {
            auto lt = less_than(x->first, y->first);
            if (!lt.ok()) {
              failed = lt.error();
              return false;
            }
            return lt.value();
          });
          RILL_TRY(failed);
        }
        out.push_back('{');
        for (size_t k = 0; k < items.size(); ++k) {
          if (k) out += opt.item_sep;
          if (opt.indent) newline(depth + 1);
          RILL_TRY(key(items[k]->first));
          out += opt.key_sep;
          RILL_TRY(write(items[k]->second, depth + 1));
        }
        if (opt.indent) newline(depth);
        out.push_back('}');
        return {};
      }
      default:
        return Error{"Object of type " + type_name(v) + " is not JSON serializable"};
    }
  }
};
}  // namespace

Result<std::string> to_json(const Value& v, const JsonOptions& options) {
  JsonWriter w{options, {}};
  RILL_TRY(w.write(v, 0));
  return std::move(w.out);
}

}  // namespace rill::jinja
