#include "text/jinja_parser.h"

#include "text/jinja_parser_impl.h"

namespace rill::jinja {
namespace detail {

Result<Body> Parser::run() {
  Body body;
  const bool ok = subparse(body, {});
  if (ok && cur().type != TokenType::kEof) fail("unexpected '" + describe(cur()) + "'");
  if (error_) return *error_;
  return body;
}

// ---- statements ----
// Parses into `out` until `{% <one of end> ...` (left current) or EOF.
bool Parser::subparse(Body& out, Names end) {
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

std::string Parser::end_names(Names end) {
  std::string s;
  for (std::string_view n : end) s += (s.empty() ? "'" : " or '") + std::string(n) + "'";
  return s;
}

std::optional<Body> Parser::parse_statements(Names end, bool drop_needle) {
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

StmtPtr Parser::parse_statement() {
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

StmtPtr Parser::parse_if() {
  ChainGuard chain(*this);
  auto root = make_stmt(StmtKind::kIf, next().line);
  Stmt* node = root.get();
  while (true) {
    PARSE_TRY(chain.add());
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

StmtPtr Parser::parse_for() {
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

StmtPtr Parser::parse_set() {
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

bool Parser::parse_signature(Stmt& s) {
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
std::optional<Body> Parser::parse_function_body(Names end) {
  const int saved = loop_depth_;
  loop_depth_ = 0;
  auto body = parse_statements(end, true);
  loop_depth_ = saved;
  return body;
}

StmtPtr Parser::parse_macro() {
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

StmtPtr Parser::parse_call_block() {
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

StmtPtr Parser::parse_filter_block() {
  auto s = make_stmt(StmtKind::kFilterBlock, next().line);
  s->expr = parse_filter(nullptr, true);
  PARSE_TRY(s->expr);
  auto body = parse_statements({"endfilter"}, true);
  PARSE_TRY(body);
  s->body = std::move(*body);
  return s;
}

StmtPtr Parser::parse_with() {
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

StmtPtr Parser::parse_print() {
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

StmtPtr Parser::parse_scope() {
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

bool Parser::can_assign(const Expr& e) {
  if (e.kind == ExprKind::kName || e.kind == ExprKind::kNsRef) return true;
  if (e.kind != ExprKind::kTuple) return false;
  for (const auto& item : e.args)
    if (item->kind == ExprKind::kNsRef || !can_assign(*item)) return false;
  return true;
}

ExprPtr Parser::parse_assign_target(std::string_view extra_end, bool with_namespace, bool name_only) {
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

}  // namespace detail

Result<Body> parse(std::vector<Token> tokens) {
  detail::Parser parser(std::move(tokens));
  return parser.run();
}

}  // namespace rill::jinja
