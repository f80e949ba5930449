// Statements: output, control flow, assignment, macros, loops.
// Expressions live in jinja_eval.cpp.
#include "text/jinja_interpreter.h"

#include "text/jinja_builtins.h"

namespace rill::jinja {

const Value* Frame::lookup(std::string_view name) const {
  for (const Frame* f = this; f; f = f->parent_.get())
    for (const auto& [k, v] : f->vars_)
      if (k == name) return &v;
  return nullptr;
}

void Frame::set(std::string_view name, Value value) {
  for (auto& [k, v] : vars_) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  vars_.emplace_back(std::string(name), std::move(value));
}

namespace {

bool expr_mentions(const Expr* e, std::string_view name);

bool body_mentions(const Body& body, std::string_view name) {
  for (const auto& s : body) {
    if (expr_mentions(s->expr.get(), name) || expr_mentions(s->cond.get(), name) || body_mentions(s->body, name) ||
        body_mentions(s->else_body, name))
      return true;
    for (const auto& d : s->defaults)
      if (expr_mentions(d.get(), name)) return true;
    for (const auto& [t, v] : s->with_items)
      if (expr_mentions(v.get(), name)) return true;
  }
  return false;
}

bool expr_mentions(const Expr* e, std::string_view name) {
  if (!e) return false;
  if (e->kind == ExprKind::kName && e->name == name) return true;
  for (const auto& a : e->args)
    if (expr_mentions(a.get(), name)) return true;
  for (const auto& [k, v] : e->kwargs)
    if (expr_mentions(v.get(), name)) return true;
  return expr_mentions(e->dyn_args.get(), name) || expr_mentions(e->dyn_kwargs.get(), name);
}

// A {% macro %} or the `caller` of a {% call %} block. `closure` is the
// defining scope, weak so that a macro stored in its own scope is no cycle.
class Macro : public Object {
 public:
  Macro(const Stmt& def, std::string name, std::weak_ptr<Frame> closure)
      : def_(def),
        name_(std::move(name)),
        closure_(std::move(closure)),
        takes_varargs_(body_mentions(def.body, "varargs")),
        takes_kwargs_(body_mentions(def.body, "kwargs")),
        takes_caller_(body_mentions(def.body, "caller")) {}
  std::string type_name() const override { return "Macro"; }
  std::string repr() const override { return "<Macro '" + name_ + "'>"; }
  bool callable() const override { return true; }
  std::optional<Value> attr(std::string_view name) const override {
    if (name == "name") return Value::string(name_);
    return std::nullopt;
  }

  Result<Value> call(Interpreter& interp, const CallArgs& args) const override {
    RILL_TRY(interp.enter_call());
    auto result = call_inner(interp, args);
    interp.leave_call();
    return result;
  }

 private:
  Result<Value> call_inner(Interpreter& interp, const CallArgs& args) const {
    FramePtr parent = closure_.lock();
    auto frame = std::make_shared<Frame>(parent ? parent : interp.root());
    const size_t n_params = def_.params.size();
    const size_t first_default = n_params - def_.defaults.size();
    if (args.positional.size() > n_params && !takes_varargs_)
      return Error{"macro '" + name_ + "' takes not more than " + std::to_string(n_params) + " argument(s)"};
    std::vector<bool> used(args.keyword.size(), false);
    for (size_t k = 0; k < n_params; ++k) {
      const std::string& param = def_.params[k];
      Value value;
      bool have = false;
      if (k < args.positional.size()) {
        value = args.positional[k];
        have = true;
      }
      for (size_t j = 0; j < args.keyword.size(); ++j) {
        if (args.keyword[j].first != param) continue;
        if (have) return Error{"macro '" + name_ + "' got multiple values for argument '" + param + "'"};
        value = args.keyword[j].second;
        used[j] = have = true;
      }
      if (!have && k >= first_default) {
        RILL_ASSIGN_OR_RETURN(value, interp.eval(*def_.defaults[k - first_default], frame));
        have = true;
      }
      if (!have) value = Value::undefined("parameter '" + param + "' was not provided");
      frame->set(param, std::move(value));
    }
    List varargs;
    for (size_t k = n_params; k < args.positional.size(); ++k) varargs.push_back(args.positional[k]);
    Dict kwargs;
    for (size_t j = 0; j < args.keyword.size(); ++j) {
      if (used[j]) continue;
      const auto& [key, value] = args.keyword[j];
      if (key == "caller" && takes_caller_) {
        frame->set("caller", value);
        continue;
      }
      if (!takes_kwargs_) return Error{"macro '" + name_ + "' takes no keyword argument '" + key + "'"};
      kwargs.set(Value::string(key), value);
    }
    frame->set("varargs", Value::make_tuple(std::move(varargs)));
    frame->set("kwargs", Value::make_dict(std::move(kwargs)));
    std::string out;
    Flow flow = Flow::kNormal;
    RILL_TRY(interp.exec(def_.body, frame, out, &flow));
    return Value::string(std::move(out));
  }

  const Stmt& def_;
  std::string name_;
  std::weak_ptr<Frame> closure_;
  bool takes_varargs_, takes_kwargs_, takes_caller_;
};

// The `loop` variable: one object per loop, updated every iteration.
class LoopContext : public Object {
 public:
  LoopContext(std::shared_ptr<const List> items, const Stmt& stmt, std::weak_ptr<Frame> frame, int depth)
      : items_(std::move(items)), stmt_(stmt), frame_(std::move(frame)), depth_(depth) {}
  std::string type_name() const override { return "LoopContext"; }
  std::string repr() const override {
    return "<LoopContext " + std::to_string(index0 + 1) + "/" + std::to_string(items_->size()) + ">";
  }
  bool callable() const override { return stmt_.recursive; }

  std::optional<Value> attr(std::string_view name) const override {
    const int64_t n = int64_t(items_->size());
    const int64_t i = int64_t(index0);
    if (name == "index") return Value::integer(i + 1);
    if (name == "index0") return Value::integer(i);
    if (name == "revindex") return Value::integer(n - i);
    if (name == "revindex0") return Value::integer(n - i - 1);
    if (name == "first") return Value::boolean(i == 0);
    if (name == "last") return Value::boolean(i == n - 1);
    if (name == "length") return Value::integer(n);
    if (name == "depth") return Value::integer(depth_);
    if (name == "depth0") return Value::integer(depth_ - 1);
    if (name == "previtem") return i > 0 ? (*items_)[size_t(i - 1)] : Value::undefined("there is no previous item");
    if (name == "nextitem") return i + 1 < n ? (*items_)[size_t(i + 1)] : Value::undefined("there is no next item");
    if (name == "cycle") {
      const size_t at = index0;
      return make_builtin("cycle", [at](Interpreter&, const CallArgs& args) -> Result<Value> {
        if (args.positional.empty()) return Error{"no items for cycling given"};
        return args.positional[at % args.positional.size()];
      });
    }
    if (name == "changed") {
      auto self = std::static_pointer_cast<const LoopContext>(shared_from_this_());
      return make_builtin("changed", [self](Interpreter&, const CallArgs& args) -> Result<Value> {
        Value now = Value::make_list(args.positional);
        if (self->last_changed_ && equals(*self->last_changed_, now)) return Value::boolean(false);
        self->last_changed_ = std::move(now);
        return Value::boolean(true);
      });
    }
    return std::nullopt;
  }

  Result<Value> call(Interpreter& interp, const CallArgs& args) const override {
    if (!stmt_.recursive) return Object::call(interp, args);
    if (args.positional.size() != 1) return Error{"loop() takes exactly one argument"};
    FramePtr frame = frame_.lock();
    if (!frame) return Error{"loop() called after its loop ended"};
    RILL_TRY(interp.enter_call());
    std::string out;
    Status st = interp.run_for(stmt_, args.positional[0], frame, depth_ + 1, out);
    interp.leave_call();
    RILL_TRY(st);
    return Value::string(std::move(out));
  }

  size_t index0 = 0;
  std::weak_ptr<Object> self;

 private:
  std::shared_ptr<Object> shared_from_this_() const { return self.lock(); }

  std::shared_ptr<const List> items_;
  const Stmt& stmt_;
  std::weak_ptr<Frame> frame_;
  int depth_;
  mutable std::optional<Value> last_changed_;
};

}  // namespace

Interpreter::Interpreter(RenderLimits limits, std::optional<std::tm> fixed_now)
    : limits_(limits), fixed_now_(fixed_now) {}

Interpreter::~Interpreter() {
  // Hold every namespace first so that clearing one never destroys another
  // recursively, then clear them all: no cycle outlives the render.
  std::vector<std::shared_ptr<Object>> alive;
  for (auto& weak : namespaces_)
    if (auto ns = weak.lock()) alive.push_back(std::move(ns));
  for (auto& ns : alive) static_cast<Namespace*>(ns.get())->clear();
}

Status Interpreter::count_step() {
  if (++n_steps_ > limits_.max_steps)
    return Error{"template exceeded the step limit (" + std::to_string(limits_.max_steps) + " evaluation steps)"};
  return {};
}

Status Interpreter::check_bytes(size_t n) const {
  if (n > limits_.max_bytes)
    return Error{"template built a string of " + std::to_string(n) + " bytes (limit " +
                 std::to_string(limits_.max_bytes) + ")"};
  return {};
}

Status Interpreter::check_items(size_t n) const {
  if (n > limits_.max_items)
    return Error{"template built a list of " + std::to_string(n) + " items (limit " +
                 std::to_string(limits_.max_items) + ")"};
  return {};
}

Status Interpreter::enter_call() {
  if (++call_depth_ > limits_.max_call_depth) {
    --call_depth_;
    return Error{"maximum recursion depth exceeded (" + std::to_string(limits_.max_call_depth) +
                 " nested macro or loop calls)"};
  }
  return {};
}

Result<std::string> Interpreter::render(const Body& body, const FramePtr& root) {
  root_ = root;
  return render_body(body, root);
}

Result<std::string> Interpreter::render_body(const Body& body, const FramePtr& frame) {
  std::string out;
  Flow flow = Flow::kNormal;
  RILL_TRY(exec(body, frame, out, &flow));
  return out;
}

Status Interpreter::exec(const Body& body, const FramePtr& frame, std::string& out, Flow* flow) {
  for (const auto& s : body) {
    Status st = exec_one(*s, frame, out, flow);
    if (!st.ok()) {
      if (error_line_ == 0) error_line_ = s->line;
      return st;
    }
    if (*flow != Flow::kNormal) return {};
  }
  return {};
}

Status Interpreter::assign(const Expr& target, const Value& value, const FramePtr& frame) {
  if (target.kind == ExprKind::kName) {
    frame->set(target.name, value);
    return {};
  }
  if (target.kind == ExprKind::kNsRef) {
    const Value* ns = frame->lookup(target.name);
    if (!ns || ns->kind != Kind::kObject || !ns->obj->namespace_items())
      return Error{"cannot assign attribute on non-namespace object"};
    return ns->obj->set_attr(target.attr, value);
  }
  // Tuple unpacking.
  RILL_ASSIGN_OR_RETURN(List items, iterate(value));
  const size_t n = target.args.size();
  if (items.size() > n) return Error{"too many values to unpack (expected " + std::to_string(n) + ")"};
  if (items.size() < n)
    return Error{"not enough values to unpack (expected " + std::to_string(n) + ", got " +
                 std::to_string(items.size()) + ")"};
  for (size_t k = 0; k < n; ++k) RILL_TRY(assign(*target.args[k], items[k], frame));
  return {};
}

Status Interpreter::run_for(const Stmt& s, const Value& iterable, const FramePtr& frame, int depth, std::string& out) {
  RILL_ASSIGN_OR_RETURN(List items, iterate(iterable));
  if (s.cond) {  // {% for x in xs if cond %}: filtered before loop.length is known
    List kept;
    for (auto& item : items) {
      auto scope = std::make_shared<Frame>(frame);
      RILL_TRY(assign(*s.target, item, scope));
      RILL_ASSIGN_OR_RETURN(Value keep, eval(*s.cond, scope));
      if (truthy(keep)) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    Flow flow = Flow::kNormal;
    return exec(s.else_body, std::make_shared<Frame>(frame), out, &flow);
  }
  auto shared_items = std::make_shared<const List>(std::move(items));
  auto loop = std::make_shared<LoopContext>(shared_items, s, frame, depth);
  loop->self = loop;
  const Value loop_value = Value::object(loop);
  for (size_t k = 0; k < shared_items->size(); ++k) {
    RILL_TRY(count_step());
    loop->index0 = k;
    auto scope = std::make_shared<Frame>(frame);
    RILL_TRY(assign(*s.target, (*shared_items)[k], scope));
    scope->set("loop", loop_value);
    Flow flow = Flow::kNormal;
    RILL_TRY(exec(s.body, scope, out, &flow));
    if (flow == Flow::kBreak) break;
  }
  return {};
}

Status Interpreter::exec_one(const Stmt& s, const FramePtr& frame, std::string& out, Flow* flow) {
  RILL_TRY(count_step());
  switch (s.kind) {
    case StmtKind::kData:
      out += s.text;
      return check_bytes(out.size());
    case StmtKind::kPrint: {
      folding_constant_ = is_const_expr(*s.expr);
      auto r = eval(*s.expr, frame);
      folding_constant_ = false;
      RILL_ASSIGN_OR_RETURN(Value v, std::move(r));
      if (v.kind == Kind::kString)
        out += v.s();
      else
        out += to_str(v);
      return check_bytes(out.size());
    }
    case StmtKind::kIf: {
      RILL_ASSIGN_OR_RETURN(Value test, eval(*s.expr, frame));
      return exec(truthy(test) ? s.body : s.else_body, frame, out, flow);
    }
    case StmtKind::kFor: {
      RILL_ASSIGN_OR_RETURN(Value iterable, eval(*s.expr, frame));
      return run_for(s, iterable, frame, 1, out);
    }
    case StmtKind::kSet: {
      RILL_ASSIGN_OR_RETURN(Value v, eval(*s.expr, frame));
      return assign(*s.target, v, frame);
    }
    case StmtKind::kSetBlock: {
      RILL_ASSIGN_OR_RETURN(std::string text, render_body(s.body, frame));
      Value v = Value::string(std::move(text));
      if (s.expr) {
        RILL_ASSIGN_OR_RETURN(v, eval_filter(*s.expr, frame, &v));
      }
      return assign(*s.target, v, frame);
    }
    case StmtKind::kMacro:
      frame->set(s.text, Value::object(std::make_shared<Macro>(s, s.text, frame)));
      return {};
    case StmtKind::kCallBlock: {
      const Value caller = Value::object(std::make_shared<Macro>(s, "caller", frame));
      RILL_ASSIGN_OR_RETURN(Value v, eval_call(*s.expr, frame, &caller));
      out += to_str(v);
      return check_bytes(out.size());
    }
    case StmtKind::kFilterBlock: {
      RILL_ASSIGN_OR_RETURN(std::string text, render_body(s.body, frame));
      const Value body = Value::string(std::move(text));
      RILL_ASSIGN_OR_RETURN(Value v, eval_filter(*s.expr, frame, &body));
      out += to_str(v);
      return check_bytes(out.size());
    }
    case StmtKind::kWith: {
      auto scope = std::make_shared<Frame>(frame);
      for (const auto& [target, value_expr] : s.with_items) {
        RILL_ASSIGN_OR_RETURN(Value v, eval(*value_expr, frame));
        RILL_TRY(assign(*target, v, scope));
      }
      return exec(s.body, scope, out, flow);
    }
    case StmtKind::kScope:
      if (s.text.empty()) return exec(s.body, frame, out, flow);
      return exec(s.body, std::make_shared<Frame>(frame), out, flow);
    case StmtKind::kBreak:
      *flow = Flow::kBreak;
      return {};
    case StmtKind::kContinue:
      *flow = Flow::kContinue;
      return {};
  }
  return {};
}

}  // namespace rill::jinja
