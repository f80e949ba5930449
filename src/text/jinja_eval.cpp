// Expression evaluation: names, literals, attribute/item lookup as the
// sandbox does it, calls, filters, tests, operators with Python semantics.
#include <algorithm>
#include <cmath>

#include "text/jinja_builtins.h"
#include "text/jinja_interpreter.h"
#include "text/jinja_string.h"

namespace rill::jinja {
namespace {

std::string object_desc(const Value& v) {
  return v.is_none() ? "None" : type_name(v) + " object";
}

Value no_attribute(const Value& obj, std::string_view name) {
  if (obj.is_none()) return Value::undefined("'None' has no attribute '" + std::string(name) + "'");
  return Value::undefined("'" + object_desc(obj) + "' has no attribute '" + std::string(name) + "'");
}

Value no_element(const Value& obj, const Value& key) {
  if (key.kind == Kind::kString) return no_attribute(obj, key.s());
  return Value::undefined(object_desc(obj) + " has no element " + repr(key));
}

// Python's slice.indices(): clamps start/stop for a sequence of length n.
void slice_indices(int64_t n, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step,
                   int64_t* out_start, int64_t* out_stop) {
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    return x;
  };
  *out_start = clamp(start, step < 0 ? n - 1 : 0);
  *out_stop = clamp(stop, step < 0 ? -1 : n);
}

bool mul_overflows(int64_t a, int64_t b, int64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

Error type_error(std::string_view op, const Value& a, const Value& b) {
  return Error{"unsupported operand type(s) for " + std::string(op) + ": '" + type_name(a) + "' and '" + type_name(b) +
               "'"};
}

}  // namespace

// jinja2 folds an output expression at compile time when Expr.as_const
// succeeds: no variables, calls or context filters. Folding evaluates slices
// through the sandbox's getitem, so a failing slice there prints as
// Undefined instead of raising (see slice()).
bool is_const_expr(const Expr& e) {
  switch (e.kind) {
    case ExprKind::kConst:
      return true;
    case ExprKind::kName:
    case ExprKind::kNsRef:
    case ExprKind::kCall:
      return false;
    case ExprKind::kFilter:
      if (e.name == "map" || e.name == "select" || e.name == "reject" || e.name == "selectattr" ||
          e.name == "rejectattr" || !e.args[0] || !has_filter(e.name))
        return false;
      break;
    case ExprKind::kTest:
      if (!has_test(e.name)) return false;
      break;
    case ExprKind::kCondExpr:
      if (!e.args[2]) return false;
      break;
    default:
      break;
  }
  if (e.dyn_args || e.dyn_kwargs) return false;
  for (const auto& a : e.args)
    if (a && !is_const_expr(*a)) return false;
  for (const auto& [k, v] : e.kwargs)
    if (!is_const_expr(*v)) return false;
  return true;
}

Result<Value> Interpreter::eval(const Expr& e, const FramePtr& frame) {
  if (++eval_depth_ > kMaxEvalDepth) {
    --eval_depth_;
    if (error_line_ == 0) error_line_ = e.line;
    return Error{"template evaluation nested too deeply"};
  }
  auto r = eval_inner(e, frame);
  --eval_depth_;
  if (r.ok() && r->depth > kMaxValueDepth) r = Error{"value nested too deeply"};
  if (!r.ok() && error_line_ == 0) error_line_ = e.line;
  return r;
}

Result<Value> Interpreter::eval_inner(const Expr& e, const FramePtr& frame) {
  RILL_TRY(count_step());
  switch (e.kind) {
    case ExprKind::kConst:
      return e.value;
    case ExprKind::kName: {
      const Value* v = frame->lookup(e.name);
      if (!v) return Value::undefined("'" + e.name + "' is undefined");
      return *v;
    }
    case ExprKind::kNsRef:
      return Error{"namespace reference used as a value"};
    case ExprKind::kList:
    case ExprKind::kTuple: {
      List items;
      items.reserve(e.args.size());
      for (const auto& a : e.args) {
        RILL_ASSIGN_OR_RETURN(Value v, eval(*a, frame));
        items.push_back(std::move(v));
      }
      return e.kind == ExprKind::kList ? Value::make_list(std::move(items)) : Value::make_tuple(std::move(items));
    }
    case ExprKind::kDict: {
      Dict d;
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
        RILL_ASSIGN_OR_RETURN(Value key, eval(*e.args[k], frame));
        RILL_ASSIGN_OR_RETURN(Value value, eval(*e.args[k + 1], frame));
        if (key.kind == Kind::kList || key.kind == Kind::kDict)
          return Error{"unhashable type: '" + type_name(key) + "'"};
        d.set(std::move(key), std::move(value));
      }
      return Value::make_dict(std::move(d));
    }
    case ExprKind::kGetAttr: {
      RILL_ASSIGN_OR_RETURN(Value obj, eval(*e.args[0], frame));
      return get_attr(obj, e.name);
    }
    case ExprKind::kGetItem: {
      RILL_ASSIGN_OR_RETURN(Value obj, eval(*e.args[0], frame));
      if (e.args[1]->kind == ExprKind::kSlice) return slice(obj, *e.args[1], frame);
      RILL_ASSIGN_OR_RETURN(Value key, eval(*e.args[1], frame));
      return get_item(obj, key);
    }
    case ExprKind::kSlice:
      return Error{"slice used outside a subscript"};
    case ExprKind::kCall:
      return eval_call(e, frame, nullptr);
    case ExprKind::kFilter:
      return eval_filter(e, frame, nullptr);
    case ExprKind::kTest: {
      RILL_ASSIGN_OR_RETURN(Value subject, eval(*e.args[0], frame));
      RILL_ASSIGN_OR_RETURN(CallArgs args, eval_args(e, 1, frame));
      RILL_ASSIGN_OR_RETURN(bool ok, test(e.name, subject, args));
      return Value::boolean(ok);
    }
    case ExprKind::kNot: {
      RILL_ASSIGN_OR_RETURN(Value v, eval(*e.args[0], frame));
      return Value::boolean(!truthy(v));
    }
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      RILL_ASSIGN_OR_RETURN(Value v, eval(*e.args[0], frame));
      if (v.is_undefined()) return Error{v.undefined_message()};
      if (!v.is_number())
        return Error{"bad operand type for unary " + std::string(e.kind == ExprKind::kNeg ? "-" : "+") + ": '" +
                     type_name(v) + "'"};
      if (e.kind == ExprKind::kPos) return v.kind == Kind::kBool ? Value::integer(v.as_int()) : v;
      if (v.kind == Kind::kFloat) return Value::number(-v.f);
      if (v.as_int() == INT64_MIN) return Error{"integer overflow"};
      return Value::integer(-v.as_int());
    }
    case ExprKind::kBinary: {
      RILL_ASSIGN_OR_RETURN(Value a, eval(*e.args[0], frame));
      RILL_ASSIGN_OR_RETURN(Value b, eval(*e.args[1], frame));
      return binary(e.name, a, b);
    }
    case ExprKind::kConcat: {
      std::string out;
      for (const auto& a : e.args) {
        RILL_ASSIGN_OR_RETURN(Value v, eval(*a, frame));
        out += v.kind == Kind::kString ? v.s() : to_str(v);
        RILL_TRY(check_bytes(out.size()));
      }
      return Value::string(std::move(out));
    }
    case ExprKind::kCompare:
      return eval_compare(e, frame);
    case ExprKind::kAnd:
    case ExprKind::kOr: {
      RILL_ASSIGN_OR_RETURN(Value a, eval(*e.args[0], frame));
      if (truthy(a) == (e.kind == ExprKind::kOr)) return a;
      return eval(*e.args[1], frame);
    }
    case ExprKind::kCondExpr: {
      RILL_ASSIGN_OR_RETURN(Value test, eval(*e.args[0], frame));
      if (truthy(test)) return eval(*e.args[1], frame);
      if (e.args[2]) return eval(*e.args[2], frame);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
    }
  }
  return Error{"unknown expression"};
}

Result<CallArgs> Interpreter::eval_args(const Expr& e, size_t first, const FramePtr& frame) {
  CallArgs args;
  for (size_t k = first; k < e.args.size(); ++k) {
    RILL_ASSIGN_OR_RETURN(Value v, eval(*e.args[k], frame));
    args.positional.push_back(std::move(v));
  }
  for (const auto& [name, expr] : e.kwargs) {
    RILL_ASSIGN_OR_RETURN(Value v, eval(*expr, frame));
    args.keyword.emplace_back(name, std::move(v));
  }
  if (e.dyn_args) {
    RILL_ASSIGN_OR_RETURN(Value v, eval(*e.dyn_args, frame));
    RILL_ASSIGN_OR_RETURN(List items, iterate(v));
    for (auto& item : items) args.positional.push_back(std::move(item));
  }
  if (e.dyn_kwargs) {
    RILL_ASSIGN_OR_RETURN(Value v, eval(*e.dyn_kwargs, frame));
    if (v.kind != Kind::kDict) return Error{"argument after ** must be a mapping, not " + type_name(v)};
    for (const auto& [k, val] : v.dict->items) {
      if (k.kind != Kind::kString) return Error{"keywords must be strings"};
      args.keyword.emplace_back(k.s(), val);
    }
  }
  return args;
}

Result<Value> Interpreter::eval_call(const Expr& e, const FramePtr& frame, const Value* caller) {
  RILL_ASSIGN_OR_RETURN(Value callee, eval(*e.args[0], frame));
  RILL_ASSIGN_OR_RETURN(CallArgs args, eval_args(e, 1, frame));
  if (caller) args.keyword.emplace_back("caller", *caller);
  return call(callee, args);
}

// `subject` replaces the innermost (null) operand of a filter-block chain.
Result<Value> Interpreter::eval_filter(const Expr& e, const FramePtr& frame, const Value* subject) {
  Value input;
  if (e.args[0]) {
    if (e.args[0]->kind == ExprKind::kFilter && subject) {
      RILL_ASSIGN_OR_RETURN(input, eval_filter(*e.args[0], frame, subject));
    } else {
      RILL_ASSIGN_OR_RETURN(input, eval(*e.args[0], frame));
    }
  } else if (subject) {
    input = *subject;
  }
  RILL_ASSIGN_OR_RETURN(CallArgs args, eval_args(e, 1, frame));
  auto r = filter(e.name, input, args);
  if (!r.ok() && error_line_ == 0) error_line_ = e.line;
  return r;
}

Result<Value> Interpreter::eval_compare(const Expr& e, const FramePtr& frame) {
  RILL_ASSIGN_OR_RETURN(Value left, eval(*e.args[0], frame));
  for (size_t k = 0; k < e.ops.size(); ++k) {
    RILL_ASSIGN_OR_RETURN(Value right, eval(*e.args[k + 1], frame));
    const std::string& op = e.ops[k];
    bool ok = false;
    if (op == "eq")
      ok = equals(left, right);
    else if (op == "ne")
      ok = !equals(left, right);
    else if (op == "lt") {
      RILL_ASSIGN_OR_RETURN(ok, less_than(left, right));
    } else if (op == "gt") {
      RILL_ASSIGN_OR_RETURN(ok, less_than(right, left));
    } else if (op == "lteq") {
      RILL_ASSIGN_OR_RETURN(bool gt, less_than(right, left));
      ok = !gt;
    } else if (op == "gteq") {
      RILL_ASSIGN_OR_RETURN(bool lt, less_than(left, right));
      ok = !lt;
    } else {
      RILL_ASSIGN_OR_RETURN(ok, contains(right, left));
      if (op == "notin") ok = !ok;
    }
    if (!ok) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

// jinja2 compiles x[a:b:c] to a plain Python slice (not the sandbox's
// getitem), so every failure raises instead of yielding Undefined.
Result<Value> Interpreter::slice(const Value& obj, const Expr& s, const FramePtr& frame) {
  Value parts_v[3];
  for (int k = 0; k < 3; ++k) {
    parts_v[k] = Value::none();
    if (s.args[size_t(k)]) {
      RILL_ASSIGN_OR_RETURN(parts_v[k], eval(*s.args[size_t(k)], frame));
    }
  }
  if (obj.is_undefined()) return Error{obj.undefined_message()};
  // Folded constants go through the sandbox's getitem: TypeError -> Undefined.
  auto type_error = [&](std::string message) -> Result<Value> {
    if (folding_constant_) return Value::undefined(object_desc(obj) + " has no element slice");
    return Error{std::move(message)};
  };
  if (obj.kind == Kind::kDict) return type_error("unhashable type: 'slice'");
  if (obj.kind != Kind::kString && obj.kind != Kind::kList && obj.kind != Kind::kTuple)
    return type_error("'" + type_name(obj) + "' object is not subscriptable");
  std::optional<int64_t> parts[3];
  for (int k = 0; k < 3; ++k) {
    if (parts_v[k].is_none()) continue;
    if (!parts_v[k].is_int()) return type_error("slice indices must be integers or None or have an __index__ method");
    parts[k] = parts_v[k].as_int();
  }
  const int64_t step = std::max<int64_t>(parts[2].value_or(1), -INT64_MAX);
  if (step == 0) return Error{"slice step cannot be zero"};
  std::u32string cps;
  int64_t n = 0;
  if (obj.kind == Kind::kString) {
    cps = decode_utf8(obj.s());
    n = int64_t(cps.size());
  } else {
    n = int64_t(obj.list->size());
  }
  int64_t start = 0, stop = 0;
  slice_indices(n, parts[0], parts[1], step, &start, &stop);
  std::vector<int64_t> picks;  // indexes in [0, n); steps past the end never overflow
  for (__int128 i = start; step > 0 ? i < stop : i > stop; i += step) picks.push_back(int64_t(i));
  if (obj.kind == Kind::kString) {
    std::u32string out;
    for (int64_t i : picks) out.push_back(cps[size_t(i)]);
    return Value::string(encode_utf8(out));
  }
  List out;
  for (int64_t i : picks) out.push_back((*obj.list)[size_t(i)]);
  return obj.kind == Kind::kList ? Value::make_list(std::move(out)) : Value::make_tuple(std::move(out));
}

Result<Value> Interpreter::call(const Value& callee, const CallArgs& args) {
  if (callee.is_undefined()) return Error{callee.undefined_message()};
  if (callee.kind != Kind::kObject || !callee.obj->callable())
    return Error{"'" + type_name(callee) + "' object is not callable"};
  return callee.obj->call(*this, args);
}

Result<Value> Interpreter::get_attr(const Value& obj, std::string_view name) {
  switch (obj.kind) {
    case Kind::kUndefined:
      return Error{obj.undefined_message()};
    case Kind::kDict: {
      if (auto m = method_of(obj, name)) return *m;
      if (const Value* v = obj.dict->find(name)) return *v;
      return no_attribute(obj, name);
    }
    case Kind::kString:
    case Kind::kList:
    case Kind::kTuple: {
      if (auto m = method_of(obj, name)) return *m;
      return no_attribute(obj, name);
    }
    case Kind::kObject: {
      if (auto v = obj.obj->attr(name)) return *v;
      return no_attribute(obj, name);
    }
    default:
      return no_attribute(obj, name);
  }
}

Result<Value> Interpreter::get_item(const Value& obj, const Value& key) {
  switch (obj.kind) {
    case Kind::kUndefined:
      return Error{obj.undefined_message()};
    case Kind::kDict: {
      if (const Value* v = obj.dict->find(key)) return *v;
      break;
    }
    case Kind::kString:
    case Kind::kList:
    case Kind::kTuple: {
      if (!key.is_int()) break;
      const int64_t n = obj.kind == Kind::kString ? int64_t(n_code_points(obj.s())) : int64_t(obj.list->size());
      int64_t i = key.as_int();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return no_element(obj, key);
      if (obj.kind != Kind::kString) return (*obj.list)[size_t(i)];
      std::string one;
      append_utf8(decode_utf8(obj.s())[size_t(i)], one);
      return Value::string(std::move(one));
    }
    default:
      break;
  }
  if (key.kind == Kind::kString) return get_attr(obj, key.s());
  return no_element(obj, key);
}

Result<Value> Interpreter::filter(std::string_view name, const Value& v, const CallArgs& args) {
  return apply_filter(*this, name, v, args);
}

Result<bool> Interpreter::test(std::string_view name, const Value& v, const CallArgs& args) {
  return apply_test(*this, name, v, args);
}

Result<bool> Interpreter::contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::kUndefined:
      return false;
    case Kind::kString:
      if (item.kind != Kind::kString)
        return Error{"'in <string>' requires string as left operand, not " + type_name(item)};
      return container.s().find(item.s()) != std::string::npos;
    case Kind::kList:
    case Kind::kTuple:
      for (const auto& x : *container.list)
        if (equals(x, item)) return true;
      return false;
    case Kind::kGenerator:  // consumes up to the first match, as Python does
      while (true) {
        RILL_ASSIGN_OR_RETURN(std::optional<Value> x, container.gen->next());
        if (!x) return false;
        if (equals(*x, item)) return true;
      }
    case Kind::kDict:
      return container.dict->find(item) != nullptr;
    default:
      return Error{"argument of type '" + type_name(container) + "' is not iterable"};
  }
}

Result<Value> Interpreter::binary(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) return Error{a.undefined_message()};
  if (b.is_undefined()) return Error{b.undefined_message()};
  const bool both_int = a.is_int() && b.is_int();
  const bool both_num = a.is_number() && b.is_number();
  if (op == "+") {
    if (both_int) {
      int64_t r;
      if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) return Error{"integer overflow"};
      return Value::integer(r);
    }
    if (both_num) return Value::number(a.as_double() + b.as_double());
    if (a.kind == Kind::kString && b.kind == Kind::kString) {
      RILL_TRY(check_bytes(a.s().size() + b.s().size()));
      if (!a.markup && !b.markup) return Value::string(a.s() + b.s());
      // jinja2's Markup.__add__ / __radd__: the plain operand is escaped.
      Value out = Value::string((a.markup ? a.s() : html_escape(a.s())) + (b.markup ? b.s() : html_escape(b.s())));
      RILL_TRY(check_bytes(out.s().size()));
      out.markup = true;
      return out;
    }
    if ((a.kind == Kind::kList || a.kind == Kind::kTuple) && a.kind == b.kind) {
      RILL_TRY(check_items(a.list->size() + b.list->size()));
      List out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return a.kind == Kind::kList ? Value::make_list(std::move(out)) : Value::make_tuple(std::move(out));
    }
    if (a.kind == Kind::kString) return Error{"can only concatenate str (not \"" + type_name(b) + "\") to str"};
    if (a.kind == Kind::kList) return Error{"can only concatenate list (not \"" + type_name(b) + "\") to list"};
    return type_error("+", a, b);
  }
  if (op == "-") {
    if (both_int) {
      int64_t r;
      if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) return Error{"integer overflow"};
      return Value::integer(r);
    }
    if (both_num) return Value::number(a.as_double() - b.as_double());
    return type_error("-", a, b);
  }
  if (op == "*") {
    if (both_int) {
      int64_t r;
      if (mul_overflows(a.as_int(), b.as_int(), &r)) return Error{"integer overflow"};
      return Value::integer(r);
    }
    if (both_num) return Value::number(a.as_double() * b.as_double());
    const Value* seq = a.is_int() ? &b : &a;
    const Value* count = a.is_int() ? &a : &b;
    if (count->is_int() && (seq->kind == Kind::kString || seq->kind == Kind::kList || seq->kind == Kind::kTuple)) {
      const int64_t n = std::max<int64_t>(0, count->as_int());
      const size_t unit = seq->kind == Kind::kString ? seq->s().size() : seq->list->size();
      int64_t total;
      if (mul_overflows(int64_t(unit), n, &total)) return Error{"repetition too large"};
      if (seq->kind == Kind::kString) {
        RILL_TRY(check_bytes(size_t(total)));
        std::string out;
        for (int64_t k = 0; k < n; ++k) out += seq->s();
        return Value::string(std::move(out));
      }
      RILL_TRY(check_items(size_t(total)));
      List out;
      for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq->list->begin(), seq->list->end());
      return seq->kind == Kind::kList ? Value::make_list(std::move(out)) : Value::make_tuple(std::move(out));
    }
    return Error{"can't multiply sequence by non-int of type '" + type_name(*count) + "'"};
  }
  if (op == "/") {
    if (!both_num) return type_error("/", a, b);
    if (b.as_double() == 0.0) return Error{"division by zero"};
    return Value::number(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (op == "%" && a.kind == Kind::kString) {
      RILL_ASSIGN_OR_RETURN(std::string s, percent_format(*this, a.s(), b));
      return Value::string(std::move(s));
    }
    if (!both_num) return type_error(op, a, b);
    if (both_int) {
      const int64_t x = a.as_int(), y = b.as_int();
      if (y == 0) return Error{"integer division or modulo by zero"};
      if (x == INT64_MIN && y == -1) return Error{"integer overflow"};
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return Value::integer(op == "//" ? q : r);
    }
    // Python's float divmod.
    const double x = a.as_double(), y = b.as_double();
    if (y == 0.0) return Error{op == "//" ? "float floor division by zero" : "float modulo"};
    double mod = std::fmod(x, y);
    double div = (x - mod) / y;
    if (mod != 0.0) {
      if ((y < 0) != (mod < 0)) {
        mod += y;
        div -= 1.0;
      }
    } else {
      mod = std::copysign(0.0, y);
    }
    if (op == "%") return Value::number(mod);
    double floordiv = std::copysign(0.0, x / y);
    if (div != 0.0) {
      floordiv = std::floor(div);
      if (div - floordiv > 0.5) floordiv += 1.0;
    }
    return Value::number(floordiv);
  }
  if (op == "**") {
    if (!both_num) return type_error("** or pow()", a, b);
    if (both_int && b.as_int() >= 0) {
      int64_t base = a.as_int(), exp = b.as_int(), r = 1;
      while (exp > 0) {
        if (exp & 1)
          if (mul_overflows(r, base, &r)) return Error{"integer overflow"};
        exp >>= 1;
        if (exp > 0 && mul_overflows(base, base, &base)) return Error{"integer overflow"};
      }
      return Value::integer(r);
    }
    if (a.as_double() == 0.0 && b.as_double() < 0) return Error{"0.0 cannot be raised to a negative power"};
    return Value::number(std::pow(a.as_double(), b.as_double()));
  }
  return Error{"unknown operator " + std::string(op)};
}

}  // namespace rill::jinja
