// Expression grammar of jinja2 3.x: condexpr > or > and > not > compare >
// + - > ~ > * / // % > ** > unary > primary with postfix (. [] ()) and
// filter/test chains.
#include "text/jinja_parser_impl.h"

namespace rill::jinja::detail {

// ---- expressions ----
ExprPtr Parser::parse_expression(bool with_condexpr) {
  return with_condexpr ? parse_condexpr() : parse_or();
}

ExprPtr Parser::parse_condexpr() {
  ChainGuard chain(*this);
  int line = cur().line;
  ExprPtr expr1 = parse_or();
  PARSE_TRY(expr1);
  while (skip_name("if")) {
    PARSE_TRY(chain.add());
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

ExprPtr Parser::parse_or() {
  ChainGuard chain(*this);
  ExprPtr left = parse_and();
  PARSE_TRY(left);
  while (is_name("or")) {
    PARSE_TRY(chain.add());
    const int line = next().line;
    ExprPtr right = parse_and();
    PARSE_TRY(right);
    left = make2(ExprKind::kOr, line, std::move(left), std::move(right));
  }
  return left;
}

ExprPtr Parser::parse_and() {
  ChainGuard chain(*this);
  ExprPtr left = parse_not();
  PARSE_TRY(left);
  while (is_name("and")) {
    PARSE_TRY(chain.add());
    const int line = next().line;
    ExprPtr right = parse_not();
    PARSE_TRY(right);
    left = make2(ExprKind::kAnd, line, std::move(left), std::move(right));
  }
  return left;
}

ExprPtr Parser::parse_not() {
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

ExprPtr Parser::parse_compare() {
  const int line = cur().line;
  ExprPtr expr = parse_math1();
  PARSE_TRY(expr);
  static const std::pair<std::string_view, const char*> kOps[] = {{"==", "eq"},   {"!=", "ne"}, {"<", "lt"},
                                                                  {"<=", "lteq"}, {">", "gt"},  {">=", "gteq"}};
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

ExprPtr Parser::parse_binary_level(int level) {
  ChainGuard chain(*this);
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
  static const std::vector<std::vector<std::string_view>> kLevelOps = {{"+", "-"}, {}, {"*", "/", "//", "%"}, {"**"}};
  while (true) {
    std::string op;
    for (std::string_view candidate : kLevelOps[level])
      if (is_op(candidate)) op = std::string(candidate);
    if (op.empty()) return left;
    PARSE_TRY(chain.add());
    const int line = next().line;
    ExprPtr right = parse_binary_level(level == 3 ? 4 : level + 1);
    PARSE_TRY(right);
    left = make2(ExprKind::kBinary, line, std::move(left), std::move(right));
    left->name = op;
  }
}

ExprPtr Parser::parse_unary(bool with_filter) {
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

ExprPtr Parser::parse_primary(bool with_namespace) {
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
    e->value = tok.type == TokenType::kInteger ? Value::integer(tok.int_value) : Value::number(tok.float_value);
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

bool Parser::is_tuple_end(std::string_view extra_end) const {
  const TokenType type = cur().type;
  if (type == TokenType::kVariableEnd || type == TokenType::kBlockEnd || is_op(")")) return true;
  return !extra_end.empty() && is_name(extra_end);
}

ExprPtr Parser::parse_tuple(bool simplified, bool with_condexpr, std::string_view extra_end, bool explicit_parentheses,
                            bool with_namespace) {
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

ExprPtr Parser::parse_postfix(ExprPtr node) {
  ChainGuard chain(*this);
  while (true) {
    PARSE_TRY(chain.add());
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

ExprPtr Parser::parse_filter_expr(ExprPtr node) {
  ChainGuard chain(*this);
  while (true) {
    PARSE_TRY(chain.add());
    if (is_op("|"))
      node = parse_filter(std::move(node), false);
    else if (is_name("is"))
      node = parse_test(std::move(node));
    else if (is_op("("))
      node = parse_call(std::move(node));
    else
      return node;
    PARSE_TRY(node);
  }
}

ExprPtr Parser::parse_subscript(ExprPtr node) {
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

ExprPtr Parser::parse_subscribed() {
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
bool Parser::parse_call_args(Expr& e) {
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
      if (e.dyn_args || e.dyn_kwargs) {
        fail("invalid syntax for function call expression", line);
        return false;
      }
      if (!(e.dyn_args = parse_expression(true))) return false;
    } else if (skip_op("**")) {
      if (e.dyn_kwargs) {
        fail("invalid syntax for function call expression", line);
        return false;
      }
      if (!(e.dyn_kwargs = parse_expression(true))) return false;
    } else if (cur().type == TokenType::kName && look().type == TokenType::kOperator && look().text == "=") {
      if (e.dyn_kwargs) {
        fail("invalid syntax for function call expression", line);
        return false;
      }
      std::string key = next().text;
      next();
      ExprPtr value = parse_expression(true);
      if (!value) return false;
      e.kwargs.emplace_back(std::move(key), std::move(value));
      has_kwargs = true;
    } else {
      if (e.dyn_args || e.dyn_kwargs || has_kwargs) {
        fail("invalid syntax for function call expression", line);
        return false;
      }
      ExprPtr arg = parse_expression(true);
      if (!arg) return false;
      e.args.push_back(std::move(arg));
    }
    require_comma = true;
  }
  return expect_op(")");
}

ExprPtr Parser::parse_call(ExprPtr node) {
  auto e = make(ExprKind::kCall, cur().line);
  e->args.push_back(std::move(node));
  PARSE_TRY(parse_call_args(*e));
  return e;
}

ExprPtr Parser::parse_filter(ExprPtr node, bool start_inline) {
  ChainGuard chain(*this);
  while (is_op("|") || start_inline) {
    PARSE_TRY(chain.add());
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

ExprPtr Parser::parse_test(ExprPtr node) {
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
  } else if ((type == TokenType::kName || type == TokenType::kString || type == TokenType::kInteger ||
              type == TokenType::kFloat || is_op("[") || is_op("{")) &&
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

}  // namespace rill::jinja::detail
