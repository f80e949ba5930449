#pragma once
// Internal to the Jinja parser (jinja_parser.cpp: statements,
// jinja_parse_expr.cpp: expressions). Every parse_* returns null / false
// after the first error, which is kept in error_.
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/jinja_ast.h"
#include "text/jinja_lexer.h"

namespace rill::jinja::detail {

// Nesting limit for expressions, operator chains and blocks: deep enough for
// any real template, shallow enough that neither parsing nor evaluation can
// exhaust the stack.
constexpr int kMaxDepth = 200;

#define PARSE_TRY(x)     \
  do {                   \
    if (!(x)) return {}; \
  } while (0)

using Names = std::initializer_list<std::string_view>;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}
  Result<Body> run();

 private:
  // ---- token stream ----
  const Token& cur() const { return t_[pos_]; }
  const Token& look() const { return t_[pos_ + 1 < t_.size() ? pos_ + 1 : pos_]; }
  const Token& next() {
    const Token& tok = t_[pos_];
    if (pos_ + 1 < t_.size()) ++pos_;
    return tok;
  }
  bool is_op(std::string_view op) const { return cur().type == TokenType::kOperator && cur().text == op; }
  bool is_name(std::string_view name) const { return cur().type == TokenType::kName && cur().text == name; }
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
      case TokenType::kEof:
        return "end of template";
      case TokenType::kBlockBegin:
        return "begin of statement block";
      case TokenType::kBlockEnd:
        return "end of statement block";
      case TokenType::kVariableBegin:
        return "begin of print statement";
      case TokenType::kVariableEnd:
        return "end of print statement";
      case TokenType::kData:
        return "template data";
      case TokenType::kInteger:
        return std::to_string(tok.int_value);
      case TokenType::kFloat:
        return "float literal";
      case TokenType::kString:
        return "string literal";
      default:
        return tok.text;
    }
  }
  std::nullptr_t fail(const std::string& message, int line = 0) {
    if (!error_) error_ = Error{"line " + std::to_string(line ? line : cur().line) + ": " + message};
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

  // One more level of a left-deep chain (a + b + c, x.a.b, elif, ...),
  // counted against kMaxDepth until the chain's parse function returns.
  struct ChainGuard {
    Parser& p;
    int n = 0;
    explicit ChainGuard(Parser& parser) : p(parser) {}
    bool add() {
      ++n;
      if (++p.depth_ <= kMaxDepth) return true;
      p.fail("template nested too deeply");
      return false;
    }
    ~ChainGuard() { p.depth_ -= n; }
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
  bool subparse(Body& out, Names end);
  std::string end_names(Names end);
  std::optional<Body> parse_statements(Names end, bool drop_needle);
  StmtPtr parse_statement();
  StmtPtr parse_if();
  StmtPtr parse_for();
  StmtPtr parse_set();
  bool parse_signature(Stmt& s);
  // Bodies of macros and call blocks are functions: break/continue inside
  // them cannot reach an enclosing loop.
  std::optional<Body> parse_function_body(Names end);
  StmtPtr parse_macro();
  StmtPtr parse_call_block();
  StmtPtr parse_filter_block();
  StmtPtr parse_with();
  StmtPtr parse_print();
  StmtPtr parse_scope();
  static bool can_assign(const Expr& e);
  ExprPtr parse_assign_target(std::string_view extra_end, bool with_namespace, bool name_only);
  // ---- expressions ----
  ExprPtr parse_expression(bool with_condexpr);
  ExprPtr parse_condexpr();
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_binary_level(int level);
  ExprPtr parse_math1() { return parse_binary_level(0); }
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary(bool with_namespace);
  bool is_tuple_end(std::string_view extra_end) const;
  ExprPtr parse_tuple(bool simplified, bool with_condexpr, std::string_view extra_end, bool explicit_parentheses,
                      bool with_namespace);
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  ExprPtr parse_subscribed();
  // Fills e's args (after those already present), kwargs, dyn_args, dyn_kwargs.
  bool parse_call_args(Expr& e);
  ExprPtr parse_call(ExprPtr node);
  ExprPtr parse_filter(ExprPtr node, bool start_inline);
  ExprPtr parse_test(ExprPtr node);

  std::vector<Token> t_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::optional<Error> error_;
};

}  // namespace rill::jinja::detail
