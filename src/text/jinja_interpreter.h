#pragma once
// Tree-walking interpreter for parsed Jinja templates. Semantics follow
// jinja2's ImmutableSandboxedEnvironment as transformers uses it: default
// Undefined (falsy, prints as "", raises when an attribute or item of it is
// taken, when it is called or used in arithmetic), sandboxed attribute
// lookup (list/dict mutators are unsafe), per-iteration scopes in for loops,
// namespaces for state that outlives a loop.
//
// Resource limits replace Python's: a step budget (every expression node
// and statement counts one), a call depth for macros and recursive loops,
// and a byte/item ceiling on any string, list or output built. Rendering does
// no I/O; the only outside input is the clock of strftime_now, which a
// caller may pin.
#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"
#include "text/jinja_ast.h"
#include "text/jinja_value.h"

namespace rill::jinja {

struct RenderLimits {
  int64_t max_steps = 10'000'000;
  int max_call_depth = 100;
  size_t max_bytes = size_t(64) << 20;  // largest string or output
  size_t max_items = size_t(1) << 20;   // largest list
};

// A variable scope. The root frame holds the render context; its parent
// holds the globals (range, namespace, raise_exception, ...).
class Frame {
 public:
  explicit Frame(std::shared_ptr<Frame> parent) : parent_(std::move(parent)) {}
  const Value* lookup(std::string_view name) const;
  void set(std::string_view name, Value value);
  const std::shared_ptr<Frame>& parent() const { return parent_; }

 private:
  std::shared_ptr<Frame> parent_;
  std::vector<std::pair<std::string, Value>> vars_;
};
using FramePtr = std::shared_ptr<Frame>;

enum class Flow : uint8_t { kNormal, kBreak, kContinue };

// True when jinja2 would constant-fold this expression at compile time.
bool is_const_expr(const Expr& e);

class Interpreter {
 public:
  Interpreter(RenderLimits limits, std::optional<std::tm> fixed_now);
  ~Interpreter();  // clears namespaces so that self-referencing ones are freed
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Renders `body` with `root` as the template's top-level frame.
  Result<std::string> render(const Body& body, const FramePtr& root);
  // Line of the innermost node that failed (0 if unknown).
  int error_line() const { return error_line_; }

  // ---- used by statements and builtins ----
  Result<Value> eval(const Expr& e, const FramePtr& frame);
  // Appends output to `out`; *flow reports break/continue.
  Status exec(const Body& body, const FramePtr& frame, std::string& out, Flow* flow);
  Result<Value> call(const Value& callee, const CallArgs& args);
  Result<Value> get_attr(const Value& obj, std::string_view name);
  Result<Value> get_item(const Value& obj, const Value& key);
  Result<Value> filter(std::string_view name, const Value& v, const CallArgs& args);
  Result<bool> test(std::string_view name, const Value& v, const CallArgs& args);
  Result<Value> binary(std::string_view op, const Value& a, const Value& b);
  Result<bool> contains(const Value& container, const Value& item);

  Status count_step();
  Status check_bytes(size_t n) const;
  Status check_items(size_t n) const;
  Status enter_call();
  void leave_call() { --call_depth_; }
  // Namespaces created during a render; cleared when the interpreter dies.
  void track(const std::shared_ptr<Object>& ns) { namespaces_.push_back(ns); }
  const std::optional<std::tm>& fixed_now() const { return fixed_now_; }
  const FramePtr& root() const { return root_; }

  // Runs a for loop over `iterable` (also the body of recursive loop calls).
  Status run_for(const Stmt& s, const Value& iterable, const FramePtr& frame, int depth, std::string& out);

 private:
  Status exec_one(const Stmt& s, const FramePtr& frame, std::string& out, Flow* flow);
  Status assign(const Expr& target, const Value& value, const FramePtr& frame);
  Result<Value> eval_inner(const Expr& e, const FramePtr& frame);
  Result<Value> eval_call(const Expr& e, const FramePtr& frame, const Value* caller);
  Result<CallArgs> eval_args(const Expr& e, size_t first, const FramePtr& frame);
  Result<Value> eval_filter(const Expr& e, const FramePtr& frame, const Value* subject);
  Result<Value> eval_compare(const Expr& e, const FramePtr& frame);
  Result<Value> slice(const Value& obj, const Expr& slice, const FramePtr& frame);
  Result<std::string> render_body(const Body& body, const FramePtr& frame);

  // Stack-safety bounds (not tunable): nested evaluations, nested containers.
  static constexpr int kMaxEvalDepth = 1500;
  static constexpr uint32_t kMaxValueDepth = 256;

  RenderLimits limits_;
  std::optional<std::tm> fixed_now_;
  FramePtr root_;
  int64_t n_steps_ = 0;
  int call_depth_ = 0;
  int eval_depth_ = 0;
  bool folding_constant_ = false;  // evaluating an output expression jinja2 would fold
  int error_line_ = 0;
  std::vector<std::weak_ptr<Object>> namespaces_;
};

}  // namespace rill::jinja
