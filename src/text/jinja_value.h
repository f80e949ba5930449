#pragma once
// Values of the Jinja interpreter, modelled on the Python objects that
// jinja2 manipulates when Hugging Face transformers renders a chat template:
// str (UTF-8 here), int (int64; overflow is an error), float, bool, None,
// list, tuple, dict (insertion-ordered), generators (what map/select return:
// iterable, always truthy, no len), jinja's Undefined, and opaque objects
// (macros, namespaces, loop contexts, bound methods).
//
// Containers are immutable once built and shared by pointer, so copying a
// Value is cheap. The only mutable object is a namespace (see Object).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"

namespace rill::jinja {

class Interpreter;
class Object;
struct Value;

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kTuple,
  kDict,
  kGenerator,
  kObject
};

using List = std::vector<Value>;
class Generator;

struct Dict {
  std::vector<std::pair<Value, Value>> items;  // insertion order, keys unique (Python ==)

  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  // Replaces the value of an equal key in place, else appends.
  void set(Value key, Value value);
};

struct Value {
  Kind kind = Kind::kUndefined;
  uint32_t depth = 0;  // container nesting (scalars and objects: 0), bounds recursion
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  bool markup = false;                     // kString: jinja2's Markup (|safe, |escape): `+` escapes plain strings
  std::shared_ptr<const std::string> str;  // kString text; kUndefined: the error raised on use
  std::shared_ptr<const List> list;        // kList, kTuple
  std::shared_ptr<Generator> gen;          // kGenerator
  std::shared_ptr<const Dict> dict;        // kDict
  std::shared_ptr<Object> obj;             // kObject

  static Value undefined(std::string error_on_use);
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value make_list(List v);
  static Value make_tuple(List v);
  static Value generator(std::shared_ptr<Generator> g);
  static Value generator(List v);  // over a fixed list (still single-pass)
  static Value make_dict(Dict v);
  static Value object(std::shared_ptr<Object> o);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_int() const { return kind == Kind::kInt || kind == Kind::kBool; }  // Python: bool is an int
  bool is_number() const { return is_int() || kind == Kind::kFloat; }
  bool is_sequence() const { return kind == Kind::kList || kind == Kind::kTuple; }
  bool is_iterable_list() const {
    return kind == Kind::kList || kind == Kind::kTuple || kind == Kind::kGenerator;
  }  // note: generators have no `list`; use iterate()
  const std::string& s() const { return *str; }
  int64_t as_int() const { return kind == Kind::kBool ? int64_t(b) : i; }  // requires is_int()
  double as_double() const { return kind == Kind::kFloat ? f : double(as_int()); }
  // The message of the UndefinedError raised when an undefined value is used.
  std::string undefined_message() const;
};

// A Python generator, what map/select/reject/unique/items/batch return:
// items are computed when pulled (errors surface then, as in Python), the
// sequence can be consumed once, and it is always truthy and has no len().
class Generator {
 public:
  // Produces the next item, nullopt at the end.
  using Step = std::function<Result<std::optional<Value>>()>;
  Generator(Step step, int chain) : step_(std::move(step)), chain_(chain) {}
  Result<std::optional<Value>> next();
  // Number of generators this one pulls through (bounds recursion).
  int chain() const { return chain_; }

 private:
  Step step_;
  int chain_;
  bool done_ = false;
};

// Python iter(v) as a Step: items of a list/tuple/str/dict/generator, one at
// a time; Undefined is empty; non-iterables fail on the first pull.
Generator::Step iterator_of(const Value& v);
// The generator chain length of v (0 unless v is a generator).
int generator_chain(const Value& v);

// Call arguments after evaluation: positional then keyword.
struct CallArgs {
  List positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // Python-style binding: the argument at `index`, else the keyword `name`.
  const Value* get(size_t index, std::string_view name) const;
  const Value* kw(std::string_view name) const;
};

// Macros, namespaces, loop contexts, bound methods, cyclers.
class Object {
 public:
  virtual ~Object() = default;
  virtual std::string type_name() const = 0;  // as Python names the type, for messages
  virtual std::string repr() const { return "<" + type_name() + " object>"; }
  // nullopt when the object has no such attribute.
  virtual std::optional<Value> attr(std::string_view /*name*/) const { return std::nullopt; }
  virtual bool callable() const { return false; }
  virtual Result<Value> call(Interpreter& interp, const CallArgs& args) const;
  // Only namespaces accept attribute assignment.
  virtual Status set_attr(std::string_view name, Value value);
  // Namespace contents, for repr and iteration; nullptr otherwise.
  virtual const Dict* namespace_items() const { return nullptr; }
};

// Python truthiness (Undefined and empty containers are false; generators true).
bool truthy(const Value& v);
// Python str(): what {{ v }} prints. Undefined prints as "".
std::string to_str(const Value& v);
// Python repr() (used inside list/dict printing).
std::string repr(const Value& v);
std::string dict_repr(const Dict& d);
// Python float.__repr__ (1.0, 0.1, 1e-05, 1e+16, inf, nan).
std::string float_repr(double d);
// Python type name: str, int, float, bool, NoneType, list, tuple, dict, ...
std::string type_name(const Value& v);
// Python ==.
bool equals(const Value& a, const Value& b);
// Python <; an Error (TypeError) when the types are not orderable.
Result<bool> less_than(const Value& a, const Value& b);
// Items that iterating `v` yields (dict: keys; str: one-code-point strings;
// Undefined: nothing); an Error for non-iterables.
Result<List> iterate(const Value& v);

// JSON -> template values. Recursion is bounded: a container nested deeper
// than kMaxFromJsonDepth becomes an Undefined whose use is an error (the
// server limits request JSON to 128 levels; 512 is the same bound as tojson
// and printing use, leaving room for the render context around it).
inline constexpr int kMaxFromJsonDepth = 512;
Value from_json(const nlohmann::ordered_json& j);
Value from_json(const nlohmann::json& j);  // object keys arrive sorted

// Options of Python's json.dumps as transformers' tojson filter passes them.
struct JsonOptions {
  std::optional<std::string> indent;  // nullopt: one line (indent=None)
  std::string item_sep = ", ";        // json.dumps uses "," when indent is set
  std::string key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
Result<std::string> to_json(const Value& v, const JsonOptions& options);

}  // namespace rill::jinja
