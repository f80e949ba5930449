#pragma once
// Built-in filters, tests, globals and the methods of str/dict/list values,
// as jinja2 3.1 defines them, with transformers' overrides (tojson without
// HTML escaping, raise_exception, strftime_now).
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/result.h"
#include "text/jinja_interpreter.h"
#include "text/jinja_value.h"

namespace rill::jinja {

using NativeFn = std::function<Result<Value>(Interpreter&, const CallArgs&)>;

// A global function or a method bound to its receiver.
class Builtin : public Object {
 public:
  Builtin(std::string name, NativeFn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string type_name() const override { return "builtin_function_or_method"; }
  std::string repr() const override { return "<built-in function " + name_ + ">"; }
  bool callable() const override { return true; }
  Result<Value> call(Interpreter& interp, const CallArgs& args) const override { return fn_(interp, args); }

 private:
  std::string name_;
  NativeFn fn_;
};

Value make_builtin(std::string name, NativeFn fn);

// jinja2's namespace(): the one mutable object ({% set ns.x = ... %}).
class Namespace : public Object {
 public:
  std::string type_name() const override { return "Namespace"; }
  std::string repr() const override;
  std::optional<Value> attr(std::string_view name) const override;
  Status set_attr(std::string_view name, Value value) override;
  const Dict* namespace_items() const override { return &attrs_; }
  void clear() { attrs_.items.clear(); }

 private:
  Dict attrs_;
  mutable bool in_repr_ = false;  // a namespace may contain itself
};

// Filters and tests by name; an Error for unknown names.
Result<Value> apply_filter(Interpreter& interp, std::string_view name, const Value& v, const CallArgs& args);
Result<bool> apply_test(Interpreter& interp, std::string_view name, const Value& v, const CallArgs& args);
bool has_test(std::string_view name);
bool has_filter(std::string_view name);

// A bound method of a str, dict, list or tuple; nullopt if there is none.
// Mutating list/dict methods yield an Undefined that raises SecurityError.
std::optional<Value> method_of(const Value& self, std::string_view name);

// range, dict, namespace, cycler, joiner, raise_exception, strftime_now.
void install_globals(Frame& frame);

// Python int() / float() conversions used by filters; nullopt when invalid.
std::optional<int64_t> parse_py_int(std::string_view s, int base);
std::optional<double> parse_py_float(std::string_view s);
// str % args (printf-style), as the format filter and the % operator use it.
Result<std::string> percent_format(Interpreter& interp, std::string_view fmt, const Value& args);
// str.format(*args, **kwargs) for {} {0} {name} fields (no format specs
// beyond the empty one).
Result<std::string> brace_format(std::string_view fmt, const CallArgs& args);

}  // namespace rill::jinja
