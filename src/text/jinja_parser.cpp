#include "text/jinja_parser.h"

#include <initializer_list>
#include <optional>
#include <string_view>
#include <vector>

namespace rill::jinja {
namespace {

// Nesting limit for expressions and blocks: deep enough for any real
// template, shallow enough that recursion can never exhaust the stack.
constexpr int kMaxDepth = 100;

// Every parse_* returns null after the first error, which is kept in error_.
#define PARSE_TRY(x) \
  do {               \
    if (!(x)) return {}; \
  } while (0)

using Names = std::initializer_list<std::string_view>;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Result<Body> run() {
    Body body;
    const bool ok = subparse(body, {});
    if (ok && cur().type != TokenType::kEof) fail("unexpected '" + describe(cur()) + "'");
    if (error_) return *error_;
    return body;
  }

 private:
  // ---- token stream ----
  const Token& cur() const { return t_[pos_]; }
  const Token& look() const { return t_[pos_ + 1 < t_.size() ? pos_ + 1 : pos_]; }
  const Token& next() {
    const Token& tok = t_[pos_];
    if (pos_ + 1 < t_.size()) ++pos_;
    return tok;
  }
  bool is_op(std::string_view op) const {
    return cur().type == TokenType::kOperator && cur().text == op;
  }
  bool is_name(std::string_view name) const {
    return cur().type == TokenType::kName && cur().text == name;
  }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  static std::string describe(const Token& tok) {
    switch (tok.type) {
      case TokenType::kEof: return "end of template";
      case TokenType::kBlockBegin: return "begin of statement block";
      case TokenType::kBlockEnd: return "end of statement block";
      case TokenType::kVariableBegin: return "begin of print statement";
      case TokenType::kVariableEnd: return "end of print statement";
      case TokenType::kData: return "template data";
      case TokenType::kInteger: return std::to_string(tok.int_value);
      case TokenType::kFloat: return "float literal";
      case TokenType::kString: return "string literal";
      default: return tok.text;
    }
  }
  std::nullptr_t fail(const std::string& message, int line = 0) {
    if (!error_)
      error_ = Error{"line " + std::to_string(line ? line : cur().line) + ": " + message};
    return nullptr;
  }
  bool expect_op(std::string_view op) {
    if (skip_op(op)) return true;
    fail("expected token '" + std::string(op) + "', got '" + describe(cur()) + "'");
    return false;
  }
  bool expect_type(TokenType type, const char* what) {
    if (cur().type == type) {
      next();
      return true;
    }
    fail(std::string("expected ") + what + ", got '" + describe(cur()) + "'");
    return false;
  }
  std::optional<std::string> expect_name() {
    if (cur().type != TokenType::kName) {
      fail("expected name, got '" + describe(cur()) + "'");
      return std::nullopt;
    }
    return next().text;
  }

  struct DepthGuard {
    Parser& p;
    bool ok;
    explicit DepthGuard(Parser& parser) : p(parser), ok(++parser.depth_ <= kMaxDepth) {
      if (!ok) p.fail("template nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };

  static ExprPtr make(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  static ExprPtr make2(ExprKind kind, int line, ExprPtr a, ExprPtr b) {
    auto e = make(kind, line);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }
  static StmtPtr make_stmt(StmtKind kind, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = line;
    return s;
  }

  // ---- statements ----

  // Parses into `out` until `{% <one of end> ...` (left current) or EOF.
  bool subparse(Body& out, Names end) {
    while (cur().type != TokenType::kEof) {
      const Token& tok = cur();
      if (tok.type == TokenType::kData) {
        auto s = make_stmt(StmtKind::kData, tok.line);
        s->text = tok.text;
        out.push_back(std::move(s));
        next();
      } else if (tok.type == TokenType::kVariableBegin) {
        next();
        auto s = make_stmt(StmtKind::kPrint, tok.line);
        s->expr = parse_tuple(false, true, {}, false, false);
        if (!s->expr || !expect_type(TokenType::kVariableEnd, "end of print statement")) return false;
        out.push_back(std::move(s));
      } else if (tok.type == TokenType::kBlockBegin) {
        next();
        for (std::string_view name : end)
          if (is_name(name)) return true;
        auto s = parse_statement();
        if (!s || !expect_type(TokenType::kBlockEnd, "end of statement block")) return false;
        out.push_back(std::move(s));
      } else {
        fail("unexpected '" + describe(tok) + "'");
        return false;
      }
    }
    return true;
  }

  std::string end_names(Names end) {
    std::string s;
    for (std::string_view n : end) s += (s.empty() ? "'" : " or '") + std::string(n) + "'";
    return s;
  }

  std::optional<Body> parse_statements(Names end, bool drop_needle) {
    skip_op(":");
    if (!expect_type(TokenType::kBlockEnd, "end of statement block")) return std::nullopt;
    Body body;
    if (!subparse(body, end)) return std::nullopt;
    if (cur().type == TokenType::kEof) {
      fail("unexpected end of template, expected " + end_names(end));
      return std::nullopt;
    }
    if (drop_needle) next();
    return body;
  }

  StmtPtr parse_statement() {
    DepthGuard guard(*this);
    PARSE_TRY(guard.ok);
    if (cur().type != TokenType::kName) return fail("tag name expected");
    const std::string& tag = cur().text;
    if (tag == "if") return parse_if();
    if (tag == "for") return parse_for();
    if (tag == "set") return parse_set();
    if (tag == "macro") return parse_macro();
    if (tag == "call") return parse_call_block();
    if (tag == "filter") return parse_filter_block();
    if (tag == "with") return parse_with();
    if (tag == "print") return parse_print();
    if (tag == "generation" || tag == "block") return parse_scope();
    if (tag == "break" || tag == "continue") {
      const int line = next().line;
      if (loop_depth_ == 0) return fail("'" + tag + "' outside loop", line);
      return make_stmt(tag == "break" ? StmtKind::kBreak : StmtKind::kContinue, line);
    }
    if (tag == "extends" || tag == "include" || tag == "import" || tag == "from")
      return fail("'" + tag + "' is not supported in chat templates (no template loader)");
    return fail("encountered unknown tag '" + tag + "'");
  }

  StmtPtr parse_if() {
    auto root = make_stmt(StmtKind::kIf, next().line);
    Stmt* node = root.get();
    while (true) {
      node->expr = parse_tuple(false, false, {}, false, false);
      PARSE_TRY(node->expr);
      auto body = parse_statements({"elif", "else", "endif"}, false);
      PARSE_TRY(body);
      node->body = std::move(*body);
      const Token& tok = next();
      if (tok.text == "elif") {
        node->else_body.push_back(make_stmt(StmtKind::kIf, tok.line));
        node = node->else_body.back().get();
        continue;
      }
      if (tok.text == "else") {
        auto else_body = parse_statements({"endif"}, true);
        PARSE_TRY(else_body);
        node->else_body = std::move(*else_body);
      }
      return root;
    }
  }

  StmtPtr parse_for() {
    auto s = make_stmt(StmtKind::kFor, next().line);
    s->target = parse_assign_target("in", false, false);
    PARSE_TRY(s->target);
    if (!is_name("in")) return fail("expected 'in', got '" + describe(cur()) + "'");
    next();
    s->expr = parse_tuple(false, false, "recursive", false, false);
    PARSE_TRY(s->expr);
    if (skip_name("if")) PARSE_TRY(s->cond = parse_expression(true));
    s->recursive = skip_name("recursive");
    ++loop_depth_;
    auto body = parse_statements({"endfor", "else"}, false);
    --loop_depth_;
    PARSE_TRY(body);
    s->body = std::move(*body);
    if (next().text == "else") {
      auto else_body = parse_statements({"endfor"}, true);
      PARSE_TRY(else_body);
      s->else_body = std::move(*else_body);
    }
    return s;
  }

  StmtPtr parse_set() {
    const int line = next().line;
    ExprPtr target = parse_assign_target({}, true, false);
    PARSE_TRY(target);
    if (skip_op("=")) {
      auto s = make_stmt(StmtKind::kSet, line);
      s->target = std::move(target);
      s->expr = parse_tuple(false, true, {}, false, false);
      PARSE_TRY(s->expr);
      return s;
    }
    auto s = make_stmt(StmtKind::kSetBlock, line);
    s->target = std::move(target);
    if (is_op("|")) PARSE_TRY(s->expr = parse_filter(nullptr, false));
    auto body = parse_statements({"endset"}, true);
    PARSE_TRY(body);
    s->body = std::move(*body);
    return s;
  }

  bool parse_signature(Stmt& s) {
    if (!expect_op("(")) return false;
    while (!is_op(")")) {
      if (!s.params.empty() && !expect_op(",")) return false;
      auto name = expect_name();
      if (!name) return false;
      s.params.push_back(*name);
      if (skip_op("=")) {
        ExprPtr def = parse_expression(true);
        if (!def) return false;
        s.defaults.push_back(std::move(def));
      } else if (!s.defaults.empty()) {
        fail("non-default argument follows default argument");
        return false;
      }
    }
    return expect_op(")");
  }

  // Bodies of macros and call blocks are functions: break/continue inside
  // them cannot reach an enclosing loop.
  std::optional<Body> parse_function_body(Names end) {
    const int saved = loop_depth_;
    loop_depth_ = 0;
    auto body = parse_statements(end, true);
    loop_depth_ = saved;
    return body;
  }

  StmtPtr parse_macro() {
    auto s = make_stmt(StmtKind::kMacro, next().line);
    auto name = expect_name();
    PARSE_TRY(name);
    s->text = *name;
    PARSE_TRY(parse_signature(*s));
    auto body = parse_function_body({"endmacro"});
    PARSE_TRY(body);
    s->body = std::move(*body);
    return s;
  }

  StmtPtr parse_call_block() {
    auto s = make_stmt(StmtKind::kCallBlock, next().line);
    if (is_op("(")) PARSE_TRY(parse_signature(*s));
    s->expr = parse_expression(true);
    PARSE_TRY(s->expr);
    if (s->expr->kind != ExprKind::kCall) return fail("expected call", s->line);
    auto body = parse_function_body({"endcall"});
    PARSE_TRY(body);
    s->body = std::move(*body);
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = make_stmt(StmtKind::kFilterBlock, next().line);
    s->expr = parse_filter(nullptr, true);
    PARSE_TRY(s->expr);
    auto body = parse_statements({"endfilter"}, true);
    PARSE_TRY(body);
    s->body = std::move(*body);
    return s;
  }

  StmtPtr parse_with() {
    auto s = make_stmt(StmtKind::kWith, next().line);
    while (cur().type != TokenType::kBlockEnd) {
      if (!s->with_items.empty()) PARSE_TRY(expect_op(","));
      ExprPtr target = parse_assign_target({}, false, false);
      PARSE_TRY(target);
      PARSE_TRY(expect_op("="));
      ExprPtr value = parse_expression(true);
      PARSE_TRY(value);
      s->with_items.emplace_back(std::move(target), std::move(value));
    }
    auto body = parse_statements({"endwith"}, true);
    PARSE_TRY(body);
    s->body = std::move(*body);
    return s;
  }

  StmtPtr parse_print() {
    auto s = make_stmt(StmtKind::kScope, next().line);
    while (cur().type != TokenType::kBlockEnd) {
      if (!s->body.empty()) PARSE_TRY(expect_op(","));
      auto p = make_stmt(StmtKind::kPrint, cur().line);
      p->expr = parse_expression(true);
      PARSE_TRY(p->expr);
      s->body.push_back(std::move(p));
    }
    return s;
  }

  StmtPtr parse_scope() {
    const std::string tag = cur().text;
    auto s = make_stmt(StmtKind::kScope, next().line);
    s->text = tag;  // generation and block bodies are functions: their own scope
    if (tag == "block") {
      auto name = expect_name();
      PARSE_TRY(name);
      skip_name("scoped");
      skip_name("required");
      auto body = parse_function_body({"endblock"});
      PARSE_TRY(body);
      s->body = std::move(*body);
      skip_name(*name);
      return s;
    }
    auto body = parse_function_body({"endgeneration"});
    PARSE_TRY(body);
    s->body = std::move(*body);
    return s;
  }

  static bool can_assign(const Expr& e) {
    if (e.kind == ExprKind::kName || e.kind == ExprKind::kNsRef) return true;
    if (e.kind != ExprKind::kTuple) return false;
    for (const auto& item : e.args)
      if (item->kind == ExprKind::kNsRef || !can_assign(*item)) return false;
    return true;
  }

  ExprPtr parse_assign_target(std::string_view extra_end, bool with_namespace, bool name_only) {
    ExprPtr target;
    if (name_only) {
      auto name = expect_name();
      PARSE_TRY(name);
      target = make(ExprKind::kName, cur().line);
      target->name = *name;
    } else {
      target = parse_tuple(true, true, extra_end, false, with_namespace);
      PARSE_TRY(target);
    }
    if (!can_assign(*target)) return fail("can't assign to this expression", target->line);
    return target;
  }

  // ---- expressions ----

  ExprPtr parse_expression(bool with_condexpr) {
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    int line = cur().line;
    ExprPtr expr1 = parse_or();
    PARSE_TRY(expr1);
    while (skip_name("if")) {
      ExprPtr expr2 = parse_or();
      PARSE_TRY(expr2);
      ExprPtr expr3;
      if (skip_name("else")) PARSE_TRY(expr3 = parse_condexpr());
      auto e = make(ExprKind::kCondExpr, line);
      e->args.push_back(std::move(expr2));
      e->args.push_back(std::move(expr1));
      e->args.push_back(std::move(expr3));
      expr1 = std::move(e);
      line = cur().line;
    }
    return expr1;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    PARSE_TRY(left);
    while (is_name("or")) {
      const int line = next().line;
      ExprPtr right = parse_and();
      PARSE_TRY(right);
      left = make2(ExprKind::kOr, line, std::move(left), std::move(right));
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    PARSE_TRY(left);
    while (is_name("and")) {
      const int line = next().line;
      ExprPtr right = parse_not();
      PARSE_TRY(right);
      left = make2(ExprKind::kAnd, line, std::move(left), std::move(right));
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      PARSE_TRY(guard.ok);
      auto e = make(ExprKind::kNot, next().line);
      ExprPtr operand = parse_not();
      PARSE_TRY(operand);
      e->args.push_back(std::move(operand));
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr expr = parse_math1();
    PARSE_TRY(expr);
    static const std::pair<std::string_view, const char*> kOps[] = {
        {"==", "eq"}, {"!=", "ne"}, {"<", "lt"}, {"<=", "lteq"}, {">", "gt"}, {">=", "gteq"}};
    ExprPtr cmp;
    while (true) {
      std::string op;
      for (const auto& [tok, name] : kOps)
        if (is_op(tok)) op = name;
      if (!op.empty()) {
        next();
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && look().type == TokenType::kName && look().text == "in") {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      ExprPtr operand = parse_math1();
      PARSE_TRY(operand);
      if (!cmp) {
        cmp = make(ExprKind::kCompare, line);
        cmp->args.push_back(std::move(expr));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(std::move(operand));
    }
    return cmp ? std::move(cmp) : std::move(expr);
  }

  ExprPtr parse_binary_level(int level) {
    // level 0: + -   level 1: ~ (concat)   level 2: * / // %   level 3: **
    if (level == 4) return parse_unary(true);
    ExprPtr left = parse_binary_level(level + 1);
    PARSE_TRY(left);
    if (level == 1) {
      if (!is_op("~")) return left;
      auto e = make(ExprKind::kConcat, left->line);
      e->args.push_back(std::move(left));
      while (skip_op("~")) {
        ExprPtr right = parse_binary_level(2);
        PARSE_TRY(right);
        e->args.push_back(std::move(right));
      }
      return e;
    }
    static const std::vector<std::vector<std::string_view>> kLevelOps = {
        {"+", "-"}, {}, {"*", "/", "//", "%"}, {"**"}};
    while (true) {
      std::string op;
      for (std::string_view candidate : kLevelOps[level])
        if (is_op(candidate)) op = std::string(candidate);
      if (op.empty()) return left;
      const int line = next().line;
      ExprPtr right = parse_binary_level(level == 3 ? 4 : level + 1);
      PARSE_TRY(right);
      left = make2(ExprKind::kBinary, line, std::move(left), std::move(right));
      left->name = op;
    }
  }
  ExprPtr parse_math1() { return parse_binary_level(0); }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    PARSE_TRY(guard.ok);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const bool neg = is_op("-");
      node = make(neg ? ExprKind::kNeg : ExprKind::kPos, next().line);
      ExprPtr operand = parse_unary(false);
      PARSE_TRY(operand);
      node->args.push_back(std::move(operand));
    } else {
      node = parse_primary(false);
      PARSE_TRY(node);
    }
    node = parse_postfix(std::move(node));
    PARSE_TRY(node);
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary(bool with_namespace) {
    DepthGuard guard(*this);
    PARSE_TRY(guard.ok);
    const Token& tok = cur();
    const int line = tok.line;
    if (tok.type == TokenType::kName) {
      const std::string name = next().text;
      auto e = make(ExprKind::kConst, line);
      if (name == "true" || name == "True" || name == "false" || name == "False") {
        e->value = Value::boolean(name == "true" || name == "True");
      } else if (name == "none" || name == "None") {
        e->value = Value::none();
      } else if (with_namespace && is_op(".")) {
        next();
        auto attr = expect_name();
        PARSE_TRY(attr);
        e->kind = ExprKind::kNsRef;
        e->name = name;
        e->attr = *attr;
      } else {
        e->kind = ExprKind::kName;
        e->name = name;
      }
      return e;
    }
    if (tok.type == TokenType::kString) {
      std::string text;
      while (cur().type == TokenType::kString) text += next().text;
      auto e = make(ExprKind::kConst, line);
      e->value = Value::string(std::move(text));
      return e;
    }
    if (tok.type == TokenType::kInteger || tok.type == TokenType::kFloat) {
      auto e = make(ExprKind::kConst, line);
      e->value = tok.type == TokenType::kInteger ? Value::integer(tok.int_value)
                                                 : Value::number(tok.float_value);
      next();
      return e;
    }
    if (skip_op("(")) {
      ExprPtr e = parse_tuple(false, true, {}, true, false);
      PARSE_TRY(e);
      PARSE_TRY(expect_op(")"));
      return e;
    }
    if (is_op("[") || is_op("{")) {
      const bool is_list = is_op("[");
      const char* close = is_list ? "]" : "}";
      next();
      auto e = make(is_list ? ExprKind::kList : ExprKind::kDict, line);
      while (!is_op(close)) {
        if (!e->args.empty()) PARSE_TRY(expect_op(","));
        if (is_op(close)) break;
        ExprPtr item = parse_expression(true);
        PARSE_TRY(item);
        e->args.push_back(std::move(item));
        if (!is_list) {
          PARSE_TRY(expect_op(":"));
          ExprPtr value = parse_expression(true);
          PARSE_TRY(value);
          e->args.push_back(std::move(value));
        }
      }
      PARSE_TRY(expect_op(close));
      return e;
    }
    return fail("unexpected '" + describe(tok) + "'");
  }

  bool is_tuple_end(std::string_view extra_end) const {
    const TokenType type = cur().type;
    if (type == TokenType::kVariableEnd || type == TokenType::kBlockEnd || is_op(")")) return true;
    return !extra_end.empty() && is_name(extra_end);
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, std::string_view extra_end,
                      bool explicit_parentheses, bool with_namespace) {
    const int line = cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) PARSE_TRY(expect_op(","));
      if (is_tuple_end(extra_end)) break;
      ExprPtr item = simplified ? parse_primary(with_namespace) : parse_expression(with_condexpr);
      PARSE_TRY(item);
      args.push_back(std::move(item));
      if (!is_op(",")) break;
      is_tuple = true;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parentheses) return fail("expected an expression, got '" + describe(cur()) + "'");
    }
    auto e = make(ExprKind::kTuple, line);
    e->args = std::move(args);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
      PARSE_TRY(node);
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) node = parse_filter(std::move(node), false);
      else if (is_name("is")) node = parse_test(std::move(node));
      else if (is_op("(")) node = parse_call(std::move(node));
      else return node;
      PARSE_TRY(node);
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& tok = next();
    const int line = tok.line;
    if (tok.text == ".") {
      const Token& attr = next();
      if (attr.type == TokenType::kName) {
        auto e = make(ExprKind::kGetAttr, line);
        e->args.push_back(std::move(node));
        e->name = attr.text;
        return e;
      }
      if (attr.type != TokenType::kInteger) return fail("expected name or number", attr.line);
      auto index = make(ExprKind::kConst, attr.line);
      index->value = Value::integer(attr.int_value);
      return make2(ExprKind::kGetItem, line, std::move(node), std::move(index));
    }
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) PARSE_TRY(expect_op(","));
      ExprPtr arg = parse_subscribed();
      PARSE_TRY(arg);
      args.push_back(std::move(arg));
    }
    PARSE_TRY(expect_op("]"));
    if (args.empty()) return fail("expected subscript expression", line);
    ExprPtr arg;
    if (args.size() == 1) {
      arg = std::move(args[0]);
    } else {
      arg = make(ExprKind::kTuple, line);
      arg->args = std::move(args);
    }
    return make2(ExprKind::kGetItem, line, std::move(node), std::move(arg));
  }

  ExprPtr parse_subscribed() {
    const int line = cur().line;
    std::vector<ExprPtr> parts;
    if (skip_op(":")) {
      parts.push_back(nullptr);
    } else {
      ExprPtr node = parse_expression(true);
      PARSE_TRY(node);
      if (!skip_op(":")) return node;
      parts.push_back(std::move(node));
    }
    auto at_end = [&] { return is_op("]") || is_op(","); };
    if (is_op(":") || at_end()) {
      parts.push_back(nullptr);
    } else {
      ExprPtr stop = parse_expression(true);
      PARSE_TRY(stop);
      parts.push_back(std::move(stop));
    }
    if (skip_op(":") && !at_end()) {
      ExprPtr step = parse_expression(true);
      PARSE_TRY(step);
      parts.push_back(std::move(step));
    } else {
      parts.push_back(nullptr);
    }
    auto e = make(ExprKind::kSlice, line);
    e->args = std::move(parts);
    return e;
  }

  // Fills e's args (after those already present), kwargs, dyn_args, dyn_kwargs.
  bool parse_call_args(Expr& e) {
    const int line = cur().line;
    if (!expect_op("(")) return false;
    bool require_comma = false;
    bool has_kwargs = false;
    while (!is_op(")")) {
      if (require_comma) {
        if (!expect_op(",")) return false;
        if (is_op(")")) break;
      }
      if (skip_op("*")) {
        if (e.dyn_args || e.dyn_kwargs) { fail("invalid syntax for function call expression", line); return false; }
        if (!(e.dyn_args = parse_expression(true))) return false;
      } else if (skip_op("**")) {
        if (e.dyn_kwargs) { fail("invalid syntax for function call expression", line); return false; }
        if (!(e.dyn_kwargs = parse_expression(true))) return false;
      } else if (cur().type == TokenType::kName && look().type == TokenType::kOperator &&
                 look().text == "=") {
        if (e.dyn_kwargs) { fail("invalid syntax for function call expression", line); return false; }
        std::string key = next().text;
        next();
        ExprPtr value = parse_expression(true);
        if (!value) return false;
        e.kwargs.emplace_back(std::move(key), std::move(value));
        has_kwargs = true;
      } else {
        if (e.dyn_args || e.dyn_kwargs || has_kwargs)
          { fail("invalid syntax for function call expression", line); return false; }
        ExprPtr arg = parse_expression(true);
        if (!arg) return false;
        e.args.push_back(std::move(arg));
      }
      require_comma = true;
    }
    return expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make(ExprKind::kCall, cur().line);
    e->args.push_back(std::move(node));
    PARSE_TRY(parse_call_args(*e));
    return e;
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      auto name = expect_name();
      PARSE_TRY(name);
      auto e = make(ExprKind::kFilter, cur().line);
      e->name = *name;
      while (skip_op(".")) {
        auto part = expect_name();
        PARSE_TRY(part);
        e->name += "." + *part;
      }
      e->args.push_back(std::move(node));
      if (is_op("(")) PARSE_TRY(parse_call_args(*e));
      node = std::move(e);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    const int line = next().line;
    const bool negated = skip_name("not");
    auto name = expect_name();
    PARSE_TRY(name);
    auto e = make(ExprKind::kTest, line);
    e->name = *name;
    while (skip_op(".")) {
      auto part = expect_name();
      PARSE_TRY(part);
      e->name += "." + *part;
    }
    e->args.push_back(std::move(node));
    const TokenType type = cur().type;
    if (is_op("(")) {
      PARSE_TRY(parse_call_args(*e));
    } else if ((type == TokenType::kName || type == TokenType::kString ||
                type == TokenType::kInteger || type == TokenType::kFloat || is_op("[") ||
                is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) return fail("You cannot chain multiple tests with is");
      ExprPtr arg = parse_primary(false);
      PARSE_TRY(arg);
      arg = parse_postfix(std::move(arg));
      PARSE_TRY(arg);
      e->args.push_back(std::move(arg));
    }
    if (!negated) return e;
    auto n = make(ExprKind::kNot, line);
    n->args.push_back(std::move(e));
    return n;
  }

  std::vector<Token> t_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::optional<Error> error_;
};

#undef PARSE_TRY

}  // namespace

Result<Body> parse(std::vector<Token> tokens) {
  Parser parser(std::move(tokens));
  return parser.run();
}

}  // namespace rill::jinja
