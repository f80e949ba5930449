// jinja2's built-in tests (`x is defined`, ...) and the globals transformers
// exposes to chat templates.
#include <ctime>

#include "text/jinja_builtins.h"
#include "text/jinja_string.h"

namespace rill::jinja {
namespace {

using TestFn = Result<bool> (*)(Interpreter&, const Value&, const CallArgs&);

Result<const Value*> operand(const CallArgs& a, std::string_view test) {
  const Value* other = a.get(0, "other");
  if (!other) return Error{"test '" + std::string(test) + "' needs an argument"};
  return other;
}

Result<bool> t_defined(Interpreter&, const Value& v, const CallArgs&) {
  return !v.is_undefined();
}
Result<bool> t_undefined(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_undefined();
}
Result<bool> t_none(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_none();
}
Result<bool> t_boolean(Interpreter&, const Value& v, const CallArgs&) {
  return v.kind == Kind::kBool;
}
Result<bool> t_true(Interpreter&, const Value& v, const CallArgs&) {
  return v.kind == Kind::kBool && v.b;
}
Result<bool> t_false(Interpreter&, const Value& v, const CallArgs&) {
  return v.kind == Kind::kBool && !v.b;
}
Result<bool> t_integer(Interpreter&, const Value& v, const CallArgs&) {
  return v.kind == Kind::kInt;
}
Result<bool> t_float(Interpreter&, const Value& v, const CallArgs&) {
  return v.kind == Kind::kFloat;
}
Result<bool> t_number(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_number();
}
Result<bool> t_string(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_string();
}
Result<bool> t_mapping(Interpreter&, const Value& v, const CallArgs&) {
  return v.kind == Kind::kDict;
}
Result<bool> t_iterable(Interpreter&, const Value& v, const CallArgs&) {
  return v.kind == Kind::kUndefined || v.kind == Kind::kString || v.is_iterable_list() || v.kind == Kind::kDict;
}
Result<bool> t_sequence(Interpreter&, const Value& v, const CallArgs&) {
  return v.kind == Kind::kUndefined || v.kind == Kind::kString || v.is_sequence() || v.kind == Kind::kDict;
}
Result<bool> t_callable(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_undefined() || (v.kind == Kind::kObject && v.obj->callable());
}
Result<bool> t_escaped(Interpreter&, const Value& v, const CallArgs&) {
  return v.kind == Kind::kString && v.markup;
}

Result<bool> t_sameas(Interpreter&, const Value& v, const CallArgs& a) {
  RILL_ASSIGN_OR_RETURN(const Value* o, operand(a, "sameas"));
  if (v.kind != o->kind) return false;
  switch (v.kind) {
    case Kind::kNone:
    case Kind::kUndefined:
      return v.kind == Kind::kNone || v.str == o->str;
    case Kind::kBool:
      return v.b == o->b;
    case Kind::kInt:
      return v.i == o->i && v.i >= -5 && v.i <= 256;  // CPython's small-int cache
    case Kind::kString:
      return v.str == o->str;
    case Kind::kList:
    case Kind::kTuple:
      return v.list == o->list;
    case Kind::kGenerator:
      return v.gen == o->gen;
    case Kind::kDict:
      return v.dict == o->dict;
    case Kind::kObject:
      return v.obj == o->obj;
    default:
      return false;
  }
}

Result<bool> t_in(Interpreter& in, const Value& v, const CallArgs& a) {
  const Value* seq = a.get(0, "seq");
  if (!seq) return Error{"test 'in' needs an argument"};
  return in.contains(*seq, v);
}

Result<bool> t_eq(Interpreter&, const Value& v, const CallArgs& a) {
  RILL_ASSIGN_OR_RETURN(const Value* o, operand(a, "eq"));
  return equals(v, *o);
}
Result<bool> t_ne(Interpreter&, const Value& v, const CallArgs& a) {
  RILL_ASSIGN_OR_RETURN(const Value* o, operand(a, "ne"));
  return !equals(v, *o);
}
Result<bool> t_lt(Interpreter&, const Value& v, const CallArgs& a) {
  RILL_ASSIGN_OR_RETURN(const Value* o, operand(a, "lt"));
  return less_than(v, *o);
}
Result<bool> t_gt(Interpreter&, const Value& v, const CallArgs& a) {
  RILL_ASSIGN_OR_RETURN(const Value* o, operand(a, "gt"));
  return less_than(*o, v);
}
Result<bool> t_le(Interpreter&, const Value& v, const CallArgs& a) {
  RILL_ASSIGN_OR_RETURN(const Value* o, operand(a, "le"));
  RILL_ASSIGN_OR_RETURN(bool gt, less_than(*o, v));
  return !gt;
}
Result<bool> t_ge(Interpreter&, const Value& v, const CallArgs& a) {
  RILL_ASSIGN_OR_RETURN(const Value* o, operand(a, "ge"));
  RILL_ASSIGN_OR_RETURN(bool lt, less_than(v, *o));
  return !lt;
}

Result<bool> modulo_is(Interpreter& in, const Value& v, const Value& d, int64_t want) {
  RILL_ASSIGN_OR_RETURN(Value r, in.binary("%", v, d));
  return equals(r, Value::integer(want));
}
Result<bool> t_divisibleby(Interpreter& in, const Value& v, const CallArgs& a) {
  const Value* d = a.get(0, "num");
  if (!d) return Error{"test 'divisibleby' needs an argument"};
  return modulo_is(in, v, *d, 0);
}
Result<bool> t_even(Interpreter& in, const Value& v, const CallArgs&) {
  return modulo_is(in, v, Value::integer(2), 0);
}
Result<bool> t_odd(Interpreter& in, const Value& v, const CallArgs&) {
  return modulo_is(in, v, Value::integer(2), 1);
}

Result<bool> case_test(const Value& v, bool upper) {
  bool any_cased = false;
  for (char32_t cp : decode_utf8(v.kind == Kind::kString ? v.s() : to_str(v))) {
    if (upper ? py_is_cased_lower(cp) : py_is_cased_upper(cp)) return false;
    any_cased |= py_is_cased_lower(cp) || py_is_cased_upper(cp);
  }
  return any_cased;
}
Result<bool> t_lower(Interpreter&, const Value& v, const CallArgs&) {
  return case_test(v, false);
}
Result<bool> t_upper(Interpreter&, const Value& v, const CallArgs&) {
  return case_test(v, true);
}
Result<bool> t_filter(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_string() && has_filter(v.s());
}
Result<bool> t_test(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_string() && has_test(v.s());
}

const std::pair<std::string_view, TestFn> kTests[] = {
    {"defined", t_defined},
    {"undefined", t_undefined},
    {"none", t_none},
    {"boolean", t_boolean},
    {"true", t_true},
    {"false", t_false},
    {"integer", t_integer},
    {"float", t_float},
    {"number", t_number},
    {"string", t_string},
    {"mapping", t_mapping},
    {"iterable", t_iterable},
    {"sequence", t_sequence},
    {"callable", t_callable},
    {"escaped", t_escaped},
    {"sameas", t_sameas},
    {"in", t_in},
    {"eq", t_eq},
    {"equalto", t_eq},
    {"==", t_eq},
    {"ne", t_ne},
    {"!=", t_ne},
    {"lt", t_lt},
    {"lessthan", t_lt},
    {"<", t_lt},
    {"le", t_le},
    {"<=", t_le},
    {"gt", t_gt},
    {"greaterthan", t_gt},
    {">", t_gt},
    {"ge", t_ge},
    {">=", t_ge},
    {"divisibleby", t_divisibleby},
    {"even", t_even},
    {"odd", t_odd},
    {"lower", t_lower},
    {"upper", t_upper},
    {"filter", t_filter},
    {"test", t_test},
};

// ---- globals ----

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

Result<Value> g_range(Interpreter&, const CallArgs& a) {
  for (const auto& v : a.positional)
    if (!v.is_int()) return Error{"'" + type_name(v) + "' object cannot be interpreted as an integer"};
  int64_t start = 0, stop = 0, step = 1;
  if (a.positional.size() == 1) {
    stop = a.positional[0].as_int();
  } else if (a.positional.size() == 2 || a.positional.size() == 3) {
    start = a.positional[0].as_int();
    stop = a.positional[1].as_int();
    if (a.positional.size() == 3) step = a.positional[2].as_int();
  } else {
    return Error{"range expected 1 to 3 arguments, got " + std::to_string(a.positional.size())};
  }
  if (step == 0) return Error{"range() arg 3 must not be zero"};
  const long double n_items =
      step > 0 ? ((long double)stop - start + step - 1) / step : ((long double)start - stop - step - 1) / -step;
  if (n_items > kMaxRange) return Error{"Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000)."};
  List out;
  for (__int128 i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(Value::integer(int64_t(i)));
  return Value::make_list(std::move(out));
}

Result<Value> g_dict(Interpreter&, const CallArgs& a) {
  Dict d;
  if (!a.positional.empty()) {
    const Value& src = a.positional[0];
    if (src.kind == Kind::kDict) {
      d = *src.dict;
    } else {
      RILL_ASSIGN_OR_RETURN(List pairs, iterate(src));
      for (const auto& p : pairs) {
        RILL_ASSIGN_OR_RETURN(List kv, iterate(p));
        if (kv.size() != 2) return Error{"dictionary update sequence element has wrong length"};
        d.set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [k, v] : a.keyword) d.set(Value::string(k), v);
  return Value::make_dict(std::move(d));
}

Result<Value> g_namespace(Interpreter& in, const CallArgs& a) {
  auto ns = std::make_shared<Namespace>();
  for (const auto& v : a.positional) {
    if (v.kind != Kind::kDict) return Error{"namespace() positional arguments must be mappings"};
    for (const auto& [k, val] : v.dict->items) {
      if (k.kind != Kind::kString) return Error{"keywords must be strings"};
      RILL_TRY(ns->set_attr(k.s(), val));
    }
  }
  for (const auto& [k, v] : a.keyword) RILL_TRY(ns->set_attr(k, v));
  in.track(ns);
  return Value::object(ns);
}

Result<Value> g_joiner(Interpreter&, const CallArgs& a) {
  const Value* sep = a.get(0, "sep");
  const std::string text = sep ? to_str(*sep) : ", ";
  auto used = std::make_shared<bool>(false);
  return make_builtin("joiner", [text, used](Interpreter&, const CallArgs&) -> Result<Value> {
    if (!*used) {
      *used = true;
      return Value::string("");
    }
    return Value::string(text);
  });
}

Result<Value> g_raise_exception(Interpreter&, const CallArgs& a) {
  const Value* msg = a.get(0, "message");
  return Error{msg ? to_str(*msg) : std::string("raise_exception() called")};
}

Result<Value> g_strftime_now(Interpreter& in, const CallArgs& a) {
  const Value* fmt = a.get(0, "format");
  if (!fmt || fmt->kind != Kind::kString) return Error{"strftime_now() needs a format string"};
  std::tm tm{};
  if (in.fixed_now()) {
    tm = *in.fixed_now();
  } else {
    const std::time_t now = std::time(nullptr);
    localtime_r(&now, &tm);
  }
  if (fmt->s().empty()) return Value::string("");
  for (size_t cap = 256; cap <= (size_t(1) << 20); cap *= 4) {
    std::string buf(cap, '\0');
    const size_t n = std::strftime(buf.data(), buf.size(), fmt->s().c_str(), &tm);
    if (n > 0) {
      buf.resize(n);
      return Value::string(std::move(buf));
    }
  }
  return Value::string("");
}

}  // namespace

bool has_test(std::string_view name) {
  for (const auto& [n, fn] : kTests)
    if (n == name) return true;
  return false;
}

// Tests whose signature takes an argument besides the value.
bool test_takes_argument(std::string_view name) {
  static const std::string_view kWithArg[] = {
      "sameas", "in", "eq", "equalto", "==",          "ne", "!=", "lt", "lessthan",
      "<",      "le", "<=", "gt",      "greaterthan", ">",  "ge", ">=", "divisibleby"};
  for (std::string_view n : kWithArg)
    if (n == name) return true;
  return false;
}

Result<bool> apply_test(Interpreter& interp, std::string_view name, const Value& v, const CallArgs& args) {
  const size_t n_args = args.positional.size() + args.keyword.size();
  const size_t max_args = test_takes_argument(name) ? 1 : 0;
  for (const auto& [n, fn] : kTests) {
    if (n != name) continue;
    if (n_args > max_args)
      return Error{"test '" + std::string(name) + "' takes " + std::to_string(max_args + 1) +
                   " positional argument(s) but " + std::to_string(n_args + 1) + " were given"};
    return fn(interp, v, args);
  }
  return Error{"no test named '" + std::string(name) + "'"};
}

void install_globals(Frame& frame) {
  frame.set("range", make_builtin("range", g_range));
  frame.set("dict", make_builtin("dict", g_dict));
  frame.set("namespace", make_builtin("namespace", g_namespace));
  frame.set("joiner", make_builtin("joiner", g_joiner));
  frame.set("raise_exception", make_builtin("raise_exception", g_raise_exception));
  frame.set("strftime_now", make_builtin("strftime_now", g_strftime_now));
}

}  // namespace rill::jinja
