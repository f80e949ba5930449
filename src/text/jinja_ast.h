#pragma once
// Syntax tree of a parsed Jinja template. One generic node type for
// expressions and one for statements keep the tree small; each kind documents
// which fields it uses.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja_value.h"

namespace rill::jinja {

enum class ExprKind : uint8_t {
  kConst,     // value
  kName,      // name
  kNsRef,     // name.attr as an assignment target (namespace attribute)
  kList,      // args = items
  kTuple,     // args = items
  kDict,      // args = key0, value0, key1, value1, ...
  kGetAttr,   // args[0] . name
  kGetItem,   // args[0] [ args[1] ]
  kSlice,     // args = start, stop, step (each may be null)
  kCall,      // args[0] ( args[1..], kwargs, dyn_args, dyn_kwargs )
  kFilter,    // args[0] | name(args[1..], kwargs); args[0] is null in filter blocks
  kTest,      // args[0] is name(args[1..], kwargs)
  kNot,       // not args[0]
  kNeg,       // -args[0]
  kPos,       // +args[0]
  kBinary,    // args[0] <name> args[1], name one of + - * / // % **
  kConcat,    // args[0] ~ args[1] ~ ...
  kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ... (Python chained comparison)
  kAnd,       // args[0] and args[1]
  kOr,        // args[0] or args[1]
  kCondExpr,  // args[1] if args[0] else args[2] (args[2] may be null)
};

struct Expr {
  ExprKind kind = ExprKind::kConst;
  int line = 0;
  Value value;
  std::string name;
  std::string attr;
  std::vector<std::unique_ptr<Expr>> args;
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
  std::unique_ptr<Expr> dyn_args;
  std::unique_ptr<Expr> dyn_kwargs;
  std::vector<std::string> ops;  // kCompare: "eq" "ne" "lt" "lteq" "gt" "gteq" "in" "notin"
};
using ExprPtr = std::unique_ptr<Expr>;

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind : uint8_t {
  kData,         // text
  kPrint,        // {{ expr }}
  kIf,           // if expr: body else else_body (elif = a nested kIf in else_body)
  kFor,          // for target in expr [if cond] [recursive]: body else else_body
  kSet,          // set target = expr
  kSetBlock,     // set target [| expr filter chain]: body
  kMacro,        // macro text(params = defaults): body
  kCallBlock,    // call(params) expr: body   (body becomes `caller`)
  kFilterBlock,  // filter expr: body
  kWith,         // with targets = values: body
  kScope,        // body; text "generation"/"block": in a child scope, "": same scope
  kBreak,
  kContinue,
};

struct Stmt {
  StmtKind kind = StmtKind::kData;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr target;
  ExprPtr cond;
  bool recursive = false;
  Body body;
  Body else_body;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // aligned to the last defaults.size() params
  std::vector<std::pair<ExprPtr, ExprPtr>> with_items;
};

}  // namespace rill::jinja
