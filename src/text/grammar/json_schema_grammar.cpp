#include "text/grammar/json_schema_grammar.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "text/grammar/gbnf_parser.h"
#include "text/grammar/regex_grammar.h"

namespace rill::grammar {
namespace {

using Json = nlohmann::ordered_json;

// Numbers the grammar writes stay inside what every JSON reader takes (a
// double or a 64-bit integer): at most this many integer digits and two
// exponent digits (the literals below spell it out).
constexpr size_t kMaxIntegerDigits = 18;

constexpr const char* kCommonRules[][2] = {
    // At most one line break, then indentation: small models left free
    // fill every gap with newlines (llama.cpp's json-schema grammars bound
    // it the same way).
    {"ws", "( \" \" | \"\\n\" [ \\t]{0,20} )?"},
    // No u-escapes of surrogates: a lone one is valid JSON text but most
    // readers refuse it (and a pair is one code point written as two).
    {"json-char",
     "[^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-CeEfF] [0-9a-fA-F]{3} | [dD] [0-7] "
     "[0-9a-fA-F]{2} ) )"},
    // One code point per unit, for lengths.
    {"json-char-1",
     "[^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-CeEfF] [0-9a-fA-F]{3} | [dD] [0-7] "
     "[0-9a-fA-F]{2} ) )"},
    {"json-plain-char", "[^\"\\\\\\x00-\\x1f]"},
    {"json-string", "\"\\\"\" json-char* \"\\\"\""},
    {"json-number", "\"-\"? ( \"0\" | [1-9] [0-9]{0,17} ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]{1,2} )?"},
    {"json-integer", "\"-\"? ( \"0\" | [1-9] [0-9]{0,17} )"},
    {"json-boolean", "\"true\" | \"false\""},
    {"json-null", "\"null\""},
    {"json-value", "json-object | json-array | json-string | json-number | json-boolean | json-null"},
    {"json-object",
     "\"{\" ws ( json-string ws \":\" ws json-value ws ( \",\" ws json-string ws \":\" ws json-value ws )* )? \"}\""},
    {"json-array", "\"[\" ws ( json-value ws ( \",\" ws json-value ws )* )? \"]\""},
    {"date",
     "[0-9]{4} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) | "
     "( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | \"02-\" ( \"0\" [1-9] | \"1\" "
     "[0-9] | \"2\" [0-8] ) )"},
    {"time",
     "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,9} )? ( [zZ] | [-+] "
     "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )"},
    {"uuid", "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}"},
    {"email", "[a-zA-Z0-9._%+-]{1,64} \"@\" [a-zA-Z0-9-]{1,63} ( \".\" [a-zA-Z0-9-]{1,63} ){1,8}"},
};

const std::set<std::string, std::less<>> kAnnotations = {
    "title",    "description", "default",    "examples",      "$schema", "$id",        "$comment",
    "readOnly", "writeOnly",   "deprecated", "discriminator", "$defs",   "definitions"};
const std::set<std::string, std::less<>> kSupported = {"type",
                                                       "enum",
                                                       "const",
                                                       "anyOf",
                                                       "oneOf",
                                                       "allOf",
                                                       "$ref",
                                                       "properties",
                                                       "required",
                                                       "additionalProperties",
                                                       "items",
                                                       "prefixItems",
                                                       "minItems",
                                                       "maxItems",
                                                       "minLength",
                                                       "maxLength",
                                                       "pattern",
                                                       "format",
                                                       "minimum",
                                                       "maximum",
                                                       "exclusiveMinimum",
                                                       "exclusiveMaximum",
                                                       "uniqueItems"};

// A GBNF literal for raw bytes.
std::string gbnf_literal(std::string_view bytes) {
  std::string s = "\"";
  char buf[8];
  for (char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    if (c == '"' || c == '\\') {
      s += '\\';
      s += c;
    } else if (b < 0x20 || b == 0x7F) {
      std::snprintf(buf, sizeof buf, "\\x%02X", b);
      s += buf;
    } else {
      s += c;
    }
  }
  return s + "\"";
}

std::string alternatives(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  std::string s = "(";
  for (size_t i = 0; i < alts.size(); ++i) s += (i ? " | " : " ") + alts[i];
  return s + " )";
}

// Decimal digit strings of equal length n, a <= b, as a GBNF expression.
std::string same_length_range(const std::string& a, const std::string& b) {
  if (a.empty()) return "\"\"";
  if (a == b) return gbnf_literal(a);
  if (a[0] == b[0]) return gbnf_literal(a.substr(0, 1)) + " " + same_length_range(a.substr(1), b.substr(1));
  const size_t rest = a.size() - 1;
  if (a.substr(1) == std::string(rest, '0') && b.substr(1) == std::string(rest, '9')) {
    std::string s = std::string("[") + a[0] + "-" + b[0] + "]";
    return rest == 0 ? s : s + " [0-9]{" + std::to_string(rest) + "}";
  }
  std::vector<std::string> alts;
  alts.push_back(gbnf_literal(a.substr(0, 1)) + " " + same_length_range(a.substr(1), std::string(rest, '9')));
  if (b[0] - a[0] > 1) {
    std::string mid = std::string("[") + static_cast<char>(a[0] + 1) + "-" + static_cast<char>(b[0] - 1) + "]";
    alts.push_back(rest == 0 ? mid : mid + " [0-9]{" + std::to_string(rest) + "}");
  }
  alts.push_back(gbnf_literal(b.substr(0, 1)) + " " + same_length_range(std::string(rest, '0'), b.substr(1)));
  return alternatives(alts);
}

// Naturals in [lo, hi] (0 <= lo <= hi), no leading zeros.
std::string naturals_between(int64_t lo, int64_t hi) {
  std::vector<std::string> alts;
  const std::string ls = std::to_string(lo), hs = std::to_string(hi);
  for (size_t len = ls.size(); len <= hs.size(); ++len) {
    const std::string a = len == ls.size() ? ls : "1" + std::string(len - 1, '0');
    const std::string b = len == hs.size() ? hs : std::string(len, '9');
    alts.push_back(same_length_range(a, b));
  }
  return alternatives(alts);
}

// Naturals >= lo (lo >= 0).
std::string naturals_at_least(int64_t lo) {
  const std::string ls = std::to_string(lo);
  std::vector<std::string> alts{same_length_range(ls, std::string(ls.size(), '9')),
                                "[1-9] [0-9]{" + std::to_string(ls.size()) + "," +
                                    std::to_string(std::max<size_t>(ls.size(), kMaxIntegerDigits - 1)) + "}"};
  return alternatives(alts);
}

}  // namespace

std::string json_value_gbnf() {
  std::string s = "root ::= json-value\n";
  for (const auto& r : kCommonRules) s += std::string(r[0]) + " ::= " + r[1] + "\n";
  return s;
}

std::string json_object_gbnf() {
  std::string s = "root ::= json-object\n";
  for (const auto& r : kCommonRules) s += std::string(r[0]) + " ::= " + r[1] + "\n";
  return s;
}

Result<std::string> choice_gbnf(const std::vector<std::string>& choices) {
  if (choices.empty()) return Error{"choice: the list is empty"};
  std::vector<std::string> alts;
  for (const auto& c : choices) alts.push_back(gbnf_literal(c));
  return "root ::= " + alternatives(alts) + "\n";
}

namespace {

class SchemaConverter {
 public:
  explicit SchemaConverter(const Json& root) : root_(root) {}

  Result<std::string> run() {
    const std::string top = visit(root_, "#");
    if (!error_.empty()) return Error{error_};
    std::string out = "root ::= " + top + "\n";
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    for (const auto& r : kCommonRules) out += std::string(r[0]) + " ::= " + r[1] + "\n";
    return out;
  }

 private:
  std::string fail(const std::string& what) {
    if (error_.empty()) error_ = "json_schema: " + what;
    return "json-null";
  }
  std::string unsupported(const std::string& keyword, const std::string& path, const std::string& why = "") {
    return fail("'" + keyword + "' at " + path + " is not supported" + (why.empty() ? "" : " (" + why + ")"));
  }

  std::string new_rule(const std::string& hint, const std::string& body) {
    std::string name = "s";
    for (char c : hint) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
    name += "-" + std::to_string(rules_.size());
    rules_.emplace_back(name, body);
    return name;
  }

  const Json* resolve(const std::string& ref, const std::string& path) {
    if (ref == "#") return &root_;
    if (ref.rfind("#/", 0) != 0) {
      fail("$ref '" + ref + "' at " + path + " is not supported (only local refs: \"#\", \"#/$defs/...\")");
      return nullptr;
    }
    const Json* at = &root_;
    size_t start = 2;
    while (start <= ref.size()) {
      size_t end = ref.find('/', start);
      if (end == std::string::npos) end = ref.size();
      std::string token = ref.substr(start, end - start);
      for (size_t p; (p = token.find("~1")) != std::string::npos;) token.replace(p, 2, "/");
      for (size_t p; (p = token.find("~0")) != std::string::npos;) token.replace(p, 2, "~");
      if (at->is_object() && at->contains(token)) {
        at = &(*at)[token];
      } else if (at->is_array() && !token.empty() && token.find_first_not_of("0123456789") == std::string::npos &&
                 std::stoull(token) < at->size()) {
        at = &(*at)[std::stoull(token)];
      } else {
        fail("$ref '" + ref + "' at " + path + " does not resolve");
        return nullptr;
      }
      start = end + 1;
    }
    return at;
  }

  std::string ref_rule(const std::string& ref, const std::string& path) {
    if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
    const Json* target = resolve(ref, path);
    if (target == nullptr) return "json-null";
    const std::string name = new_rule("ref-" + ref.substr(ref.rfind('/') + 1), "json-null");
    refs_[ref] = name;
    const std::string body = visit(*target, ref);
    for (auto& r : rules_) {
      if (r.first == name) r.second = body;
    }
    return name;
  }

  // The serialization of a JSON value, whitespace allowed where JSON allows it.
  std::string literal(const Json& v) {
    if (v.is_object()) {
      std::string s = "\"{\" ws";
      bool first = true;
      for (const auto& [k, x] : v.items()) {
        s += std::string(first ? "" : " \",\" ws") + " " + gbnf_literal(Json(k).dump()) + " ws \":\" ws " + literal(x) +
             " ws";
        first = false;
      }
      return "( " + s + " \"}\" )";
    }
    if (v.is_array()) {
      std::string s = "\"[\" ws";
      for (size_t i = 0; i < v.size(); ++i) s += std::string(i ? " \",\" ws" : "") + " " + literal(v[i]) + " ws";
      return "( " + s + " \"]\" )";
    }
    return gbnf_literal(v.dump());
  }

  static std::set<std::string> type_names(const Json& s) {
    std::set<std::string> t;
    if (!s.is_object() || !s.contains("type")) return t;
    if (s["type"].is_string()) t.insert(s["type"].get<std::string>());
    if (s["type"].is_array())
      for (const auto& x : s["type"])
        if (x.is_string()) t.insert(x.get<std::string>());
    return t;
  }

  static std::string type_of(const Json& v) {
    if (v.is_object()) return "object";
    if (v.is_array()) return "array";
    if (v.is_string()) return "string";
    if (v.is_boolean()) return "boolean";
    if (v.is_null()) return "null";
    return v.is_number_integer() || v.is_number_unsigned() ? "integer" : "number";
  }

  // Kinds of value a branch may produce ("number" covers integer); {"*"}: any.
  std::set<std::string> kinds(const Json& s, int depth) {
    if (depth > 16 || !s.is_object()) return {"*"};
    if (s.contains("$ref") && s["$ref"].is_string()) {
      std::string saved = error_;
      const Json* t = resolve(s["$ref"].get<std::string>(), "oneOf");
      error_ = saved;
      return t ? kinds(*t, depth + 1) : std::set<std::string>{"*"};
    }
    std::set<std::string> out;
    auto add_value = [&](const Json& v) {
      const std::string t = type_of(v);
      out.insert(t == "integer" ? "number" : t);
    };
    if (s.contains("const")) {
      add_value(s["const"]);
      return out;
    }
    if (s.contains("enum") && s["enum"].is_array()) {
      for (const auto& v : s["enum"]) add_value(v);
      return out;
    }
    if (s.contains("anyOf") && s["anyOf"].is_array()) {
      for (const auto& b : s["anyOf"])
        for (const auto& k : kinds(b, depth + 1)) out.insert(k);
      return out;
    }
    for (auto t : type_names(s)) out.insert(t == "integer" ? "number" : t);
    if (out.empty()) out.insert("*");
    return out;
  }

  // The const/enum values of property `name` in an object branch, if fixed.
  std::optional<std::set<std::string>> tag_values(const Json& s, const std::string& name) {
    const Json* b = &s;
    if (s.contains("$ref") && s["$ref"].is_string()) {
      std::string saved = error_;
      b = resolve(s["$ref"].get<std::string>(), "oneOf");
      error_ = saved;
      if (b == nullptr) return std::nullopt;
    }
    if (!b->contains("properties") || !(*b)["properties"].contains(name)) return std::nullopt;
    if (!b->contains("required") || !(*b)["required"].is_array()) return std::nullopt;
    bool required = false;
    for (const auto& r : (*b)["required"]) required = required || r == name;
    if (!required) return std::nullopt;
    const Json& p = (*b)["properties"][name];
    std::set<std::string> values;
    if (p.contains("const")) {
      values.insert(p["const"].dump());
    } else if (p.contains("enum") && p["enum"].is_array()) {
      for (const auto& v : p["enum"]) values.insert(v.dump());
    } else {
      return std::nullopt;
    }
    return values;
  }

  bool disjoint(const Json& a, const Json& b) {
    const auto ka = kinds(a, 0), kb = kinds(b, 0);
    if (!ka.contains("*") && !kb.contains("*")) {
      bool overlap = false;
      for (const auto& k : ka) overlap = overlap || kb.contains(k);
      if (!overlap) return true;
    }
    if (ka == std::set<std::string>{"object"} && kb == ka) {
      const Json* pa = &a;
      if (a.contains("$ref")) pa = resolve(a["$ref"].get<std::string>(), "oneOf");
      if (pa == nullptr || !pa->contains("properties")) return false;
      for (const auto& [name, unused] : (*pa)["properties"].items()) {
        (void)unused;
        auto va = tag_values(a, name), vb = tag_values(b, name);
        if (!va || !vb) continue;
        bool overlap = false;
        for (const auto& v : *va) overlap = overlap || vb->contains(v);
        if (!overlap) return true;
      }
    }
    return false;
  }

  // Keywords other than annotations, `allowed` and the ones in `also`.
  std::string first_constraint_except(const Json& s, std::initializer_list<const char*> allowed) {
    for (const auto& [k, unused] : s.items()) {
      (void)unused;
      if (kAnnotations.contains(k)) continue;
      bool ok = false;
      for (const char* a : allowed) ok = ok || k == a;
      if (!ok) return k;
    }
    return "";
  }

  std::string visit(const Json& s, const std::string& path) {
    if (!error_.empty()) return "json-null";
    if (++depth_ > 64) return fail("schema nested deeper than 64 at " + path);
    struct DepthGuard {
      int& d;
      ~DepthGuard() { --d; }
    } guard{depth_};
    if (s.is_boolean()) return s.get<bool>() ? "json-value" : fail("schema false at " + path + " allows nothing");
    if (!s.is_object()) return fail("expected a schema (an object) at " + path);
    for (const auto& [k, unused] : s.items()) {
      (void)unused;
      if (!kAnnotations.contains(k) && !kSupported.contains(k)) return unsupported(k, path);
    }
    if (s.contains("$ref")) {
      if (auto k = first_constraint_except(s, {"$ref"}); !k.empty()) {
        return unsupported(k, path, "beside $ref");
      }
      if (!s["$ref"].is_string()) return fail("$ref at " + path + " must be a string");
      return ref_rule(s["$ref"].get<std::string>(), path);
    }
    if (s.contains("const") || s.contains("enum")) {
      if (auto k = first_constraint_except(s, {"const", "enum", "type"}); !k.empty()) {
        return unsupported(k, path, "beside const/enum");
      }
      const auto types = type_names(s);
      auto type_ok = [&](const Json& v) {
        const std::string t = type_of(v);
        return types.empty() || types.contains(t) || (t == "integer" && types.contains("number"));
      };
      std::vector<std::string> alts;
      if (s.contains("const")) {
        if (s.contains("enum")) return unsupported("enum", path, "beside const");
        if (type_ok(s["const"])) alts.push_back(literal(s["const"]));
      } else {
        if (!s["enum"].is_array()) return fail("enum at " + path + " must be an array");
        for (const auto& v : s["enum"])
          if (type_ok(v)) alts.push_back(literal(v));
      }
      if (alts.empty()) return fail("enum/const at " + path + " allows no value");
      return alternatives(alts);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      if (auto k = first_constraint_except(s, {key}); !k.empty())
        return unsupported(k, path, std::string("beside ") + key);
      const Json& branches = s[key];
      if (!branches.is_array() || branches.empty())
        return fail(std::string(key) + " at " + path + " must be a non-empty array");
      if (std::string(key) == "oneOf") {
        for (size_t i = 0; i < branches.size(); ++i) {
          for (size_t j = i + 1; j < branches.size(); ++j) {
            if (!disjoint(branches[i], branches[j])) {
              return unsupported("oneOf", path,
                                 "branches " + std::to_string(i) + " and " + std::to_string(j) +
                                     " may both match, and 'exactly one' cannot be enforced; use anyOf if either may");
            }
          }
        }
      }
      std::vector<std::string> alts;
      for (size_t i = 0; i < branches.size(); ++i) {
        alts.push_back(visit(branches[i], path + "/" + key + "/" + std::to_string(i)));
      }
      return alternatives(alts);
    }
    if (s.contains("allOf")) return visit_all_of(s, path);

    std::set<std::string> types = type_names(s);
    if (s.contains("type") && types.empty()) return fail("type at " + path + " must be a string or a list of strings");
    if (!s.contains("type")) {
      auto has = [&](std::initializer_list<const char*> ks) {
        for (const char* k : ks)
          if (s.contains(k)) return true;
        return false;
      };
      if (has({"properties", "required", "additionalProperties"})) types.insert("object");
      if (has({"items", "prefixItems", "minItems", "maxItems", "uniqueItems"})) types.insert("array");
      if (has({"minLength", "maxLength", "pattern", "format"})) types.insert("string");
      if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) types.insert("number");
      if (types.empty()) return "json-value";
    }
    std::vector<std::string> alts;
    for (const auto& t : types) {
      if (t == "string") {
        alts.push_back(visit_string(s, path));
      } else if (t == "number" || t == "integer") {
        if (t == "number" && types.contains("integer")) continue;  // number covers integer
        alts.push_back(visit_number(s, path, t == "integer"));
      } else if (t == "boolean") {
        alts.push_back("json-boolean");
      } else if (t == "null") {
        alts.push_back("json-null");
      } else if (t == "object") {
        alts.push_back(visit_object(s, path));
      } else if (t == "array") {
        alts.push_back(visit_array(s, path));
      } else {
        return fail("type '" + t + "' at " + path + " is not a JSON Schema type");
      }
    }
    return alternatives(alts);
  }

  std::string visit_all_of(const Json& s, const std::string& path) {
    const Json& branches = s["allOf"];
    if (!branches.is_array() || branches.empty()) return fail("allOf at " + path + " must be a non-empty array");
    if (branches.size() == 1 && first_constraint_except(s, {"allOf"}).empty()) {
      return visit(branches[0], path + "/allOf/0");
    }
    Json merged = Json::object();
    merged["type"] = "object";
    merged["properties"] = Json::object();
    merged["required"] = Json::array();
    std::vector<const Json*> parts;
    Json self = s;
    self.erase("allOf");
    parts.push_back(&self);
    for (const auto& b : branches) parts.push_back(&b);
    for (size_t i = 0; i < parts.size(); ++i) {
      const Json* p = parts[i];
      for (int hops = 0; p != nullptr && p->is_object() && p->contains("$ref") && hops < 16; ++hops) {
        p = resolve((*p)["$ref"].get<std::string>(), path + "/allOf");
      }
      if (p == nullptr) return "json-null";
      if (!p->is_object()) return unsupported("allOf", path, "only object schemas can be combined");
      for (const auto& [k, v] : p->items()) {
        if (kAnnotations.contains(k)) continue;
        if (k == "type") {
          if (v != "object") return unsupported("allOf", path, "only object schemas can be combined");
        } else if (k == "properties") {
          for (const auto& [name, ps] : v.items()) {
            if (merged["properties"].contains(name) && merged["properties"][name] != ps) {
              return unsupported("allOf", path, "property '" + name + "' is defined by two branches");
            }
            merged["properties"][name] = ps;
          }
        } else if (k == "required") {
          for (const auto& r : v) merged["required"].push_back(r);
        } else if (k == "additionalProperties" && v == true) {
        } else {
          return unsupported(k, path + "/allOf", "inside allOf only properties and required combine");
        }
      }
    }
    return visit_object(merged, path);
  }

  std::string visit_string(const Json& s, const std::string& path) {
    const bool has_len = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("pattern")) {
      if (has_len || s.contains("format"))
        return unsupported("pattern", path, "together with minLength/maxLength/format");
      if (!s["pattern"].is_string()) return fail("pattern at " + path + " must be a string");
      auto e =
          regex_to_gbnf_expression(s["pattern"].get<std::string>(), RegexAnchoring::kSearch, RegexOutput::kJsonString);
      if (!e) return fail("pattern at " + path + ": " + e.error().message);
      return new_rule("pattern", "\"\\\"\" " + *e + " \"\\\"\"");
    }
    if (s.contains("format")) {
      if (has_len) return unsupported("format", path, "together with minLength/maxLength");
      const std::string f = s["format"].is_string() ? s["format"].get<std::string>() : "";
      std::string body;
      if (f == "date" || f == "time" || f == "uuid" || f == "email") {
        body = f;
      } else if (f == "date-time") {
        body = "date [Tt] time";
      } else {
        return unsupported("format", path, "format '" + f + "'; supported: date, time, date-time, uuid, email");
      }
      return "( \"\\\"\" " + body + " \"\\\"\" )";
    }
    if (has_len) {
      auto bound = [&](const char* k, uint64_t dflt) -> std::optional<uint64_t> {
        if (!s.contains(k)) return dflt;
        if (!s[k].is_number_unsigned() && !(s[k].is_number_integer() && s[k].get<int64_t>() >= 0)) return std::nullopt;
        return s[k].get<uint64_t>();
      };
      auto lo = bound("minLength", 0), hi = bound("maxLength", UINT64_MAX);
      if (!lo || !hi) return fail("minLength/maxLength at " + path + " must be non-negative integers");
      if (*lo > kMaxRepeat || (*hi != UINT64_MAX && *hi > kMaxRepeat)) {
        return unsupported(*lo > kMaxRepeat ? "minLength" : "maxLength", path, "above " + std::to_string(kMaxRepeat));
      }
      if (*hi < *lo) return fail("maxLength below minLength at " + path);
      const std::string rep = "{" + std::to_string(*lo) + "," + (*hi == UINT64_MAX ? "" : std::to_string(*hi)) + "}";
      return "( \"\\\"\" json-char-1" + rep + " \"\\\"\" )";
    }
    return "json-string";
  }

  std::string visit_number(const Json& s, const std::string& path, bool integer) {
    std::optional<int64_t> lo, hi;
    constexpr double kLimit = 1e18;
    for (const char* k : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      if (!s.contains(k)) continue;
      if (!s[k].is_number()) return fail(std::string(k) + " at " + path + " must be a number");
      const double v = s[k].get<double>();
      if (!integer) {
        if (std::string(k) == "minimum" && v == 0) continue;  // handled below
        return unsupported(k, path, "on a number only minimum: 0 is enforced; use type integer for ranges");
      }
      if (!(std::fabs(v) < kLimit)) return unsupported(k, path, "beyond 1e18");
      const std::string key = k;
      if (key == "minimum") lo = std::max(lo.value_or(INT64_MIN), static_cast<int64_t>(std::ceil(v)));
      if (key == "exclusiveMinimum") lo = std::max(lo.value_or(INT64_MIN), static_cast<int64_t>(std::floor(v)) + 1);
      if (key == "maximum") hi = std::min(hi.value_or(INT64_MAX), static_cast<int64_t>(std::floor(v)));
      if (key == "exclusiveMaximum") hi = std::min(hi.value_or(INT64_MAX), static_cast<int64_t>(std::ceil(v)) - 1);
    }
    if (!integer) {
      if (s.contains("minimum"))
        return "( ( \"0\" | [1-9] [0-9]{0,17} ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]{1,2} )? )";
      return "json-number";
    }
    if (!lo && !hi) return "json-integer";
    if (lo && hi && *lo > *hi) return fail("no integer satisfies the bounds at " + path);
    std::vector<std::string> alts;
    if (!lo) {  // (-inf, hi]
      if (*hi >= 0) {
        alts = {"\"-\" [1-9] [0-9]{0,17}", naturals_between(0, *hi)};
      } else {
        alts = {"\"-\" " + naturals_at_least(-*hi)};
      }
    } else if (!hi) {  // [lo, inf)
      if (*lo >= 0) {
        alts = {naturals_at_least(*lo)};
      } else {
        alts = {"\"-\" " + naturals_between(1, -*lo), naturals_at_least(0)};
      }
    } else if (*lo >= 0) {
      alts = {naturals_between(*lo, *hi)};
    } else if (*hi < 0) {
      alts = {"\"-\" " + naturals_between(-*hi, -*lo)};
    } else {
      alts = {"\"-\" " + naturals_between(1, -*lo), naturals_between(0, *hi)};
    }
    return new_rule("int", alternatives(alts));
  }

  // A JSON string key (plain characters only) that is none of `names`.
  std::string key_not_in(const std::vector<std::string>& names) {
    std::vector<std::u32string> cps;
    for (const auto& n : names) {
      std::u32string u;
      for (size_t i = 0; i < n.size();) {
        const auto b = static_cast<uint8_t>(n[i]);
        const size_t len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
        uint32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
        for (size_t k = 1; k < len && i + k < n.size(); ++k) cp = (cp << 6) | (static_cast<uint8_t>(n[i + k]) & 0x3F);
        u += static_cast<char32_t>(cp);
        i += len;
      }
      cps.push_back(u);
    }
    return "\"\\\"\" " + not_in_node(cps, 0) + " \"\\\"\"";
  }

  // Plain-character strings that extend the common prefix (length `depth`)
  // of `names` and are none of them.
  std::string not_in_node(const std::vector<std::u32string>& names, size_t depth) {
    std::map<char32_t, std::vector<std::u32string>> children;
    bool terminal = false;
    for (const auto& n : names) {
      if (n.size() == depth) {
        terminal = true;
      } else {
        children[n[depth]].push_back(n);
      }
    }
    std::vector<std::string> alts;
    if (!terminal) alts.push_back("\"\"");
    std::string excluded = "[^\"\\\\\\x00-\\x1f";
    char buf[16];
    for (const auto& [c, unused] : children) {
      (void)unused;
      std::snprintf(buf, sizeof buf, "\\U%08X", static_cast<uint32_t>(c));
      excluded += buf;
    }
    alts.push_back(excluded + "] json-plain-char*");
    for (const auto& [c, group] : children) {
      if (c < 0x20 || c == '"' || c == '\\') continue;  // not a plain character: never written as such
      std::snprintf(buf, sizeof buf, "[\\U%08X]", static_cast<uint32_t>(c));
      alts.push_back(std::string(buf) + " " + not_in_node(group, depth + 1));
    }
    return new_rule("key", alternatives(alts));
  }

  std::string visit_object(const Json& s, const std::string& path) {
    struct Prop {
      std::string key_literal, value;
      bool required;
    };
    std::vector<Prop> props;
    std::vector<std::string> names;
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return fail("required at " + path + " must be an array");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) return fail("required at " + path + " must list strings");
        required.insert(r.get<std::string>());
      }
    }
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) return fail("properties at " + path + " must be an object");
      for (const auto& [name, ps] : s["properties"].items()) {
        const std::string value = visit(ps, path + "/properties/" + name);
        props.push_back({gbnf_literal(Json(name).dump()), value, required.contains(name)});
        names.push_back(name);
      }
    }
    for (const auto& r : required) {
      if (std::find(names.begin(), names.end(), r) == names.end()) {
        return unsupported("required", path, "'" + r + "' has no schema in properties");
      }
    }
    std::string extra;  // "" when no additional properties
    if (!s.contains("additionalProperties") || s["additionalProperties"] == true) {
      extra = "json-value";
    } else if (s["additionalProperties"].is_object()) {
      extra = visit(s["additionalProperties"], path + "/additionalProperties");
    } else if (s["additionalProperties"] != false) {
      return fail("additionalProperties at " + path + " must be a boolean or a schema");
    }
    std::string extra_pair;
    if (!extra.empty()) extra_pair = new_rule("extra", key_not_in(names) + " ws \":\" ws " + extra);
    // after[i]: the rest once something was written and props[0..i) decided;
    // first[i]: the rest when nothing was written yet.
    const size_t n = props.size();
    std::string after = extra.empty() ? "\"\"" : "( \",\" ws " + extra_pair + " ws )*";
    std::string first = extra.empty() ? "\"\"" : "( " + extra_pair + " ws ( \",\" ws " + extra_pair + " ws )* )?";
    for (size_t i = n; i-- > 0;) {
      const std::string pair = props[i].key_literal + " ws \":\" ws " + props[i].value + " ws";
      const std::string after_i = new_rule("after", (props[i].required ? "" : "( ") + std::string("\",\" ws ") + pair +
                                                        (props[i].required ? " " : " )? ") + after);
      std::string first_i = pair + " " + after;
      if (!props[i].required) first_i = "( " + first_i + " ) | " + first;
      first = new_rule("first", first_i);
      after = after_i;
    }
    return "( \"{\" ws " + first + " \"}\" )";
  }

  std::string visit_array(const Json& s, const std::string& path) {
    if (s.contains("uniqueItems") && s["uniqueItems"] != false) return unsupported("uniqueItems", path);
    auto count = [&](const char* k, uint64_t dflt) -> std::optional<uint64_t> {
      if (!s.contains(k)) return dflt;
      if (!s[k].is_number_unsigned() && !(s[k].is_number_integer() && s[k].get<int64_t>() >= 0)) return std::nullopt;
      return s[k].get<uint64_t>();
    };
    auto lo_opt = count("minItems", 0), hi_opt = count("maxItems", UINT64_MAX);
    if (!lo_opt || !hi_opt) return fail("minItems/maxItems at " + path + " must be non-negative integers");
    const uint64_t lo = *lo_opt, hi = *hi_opt;
    if (lo > kMaxRepeat || (hi != UINT64_MAX && hi > kMaxRepeat)) {
      return unsupported(lo > kMaxRepeat ? "minItems" : "maxItems", path, "above " + std::to_string(kMaxRepeat));
    }
    if (hi < lo) return fail("maxItems below minItems at " + path);
    std::vector<std::string> prefix;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) return fail("prefixItems at " + path + " must be an array");
      for (size_t i = 0; i < s["prefixItems"].size(); ++i) {
        prefix.push_back(visit(s["prefixItems"][i], path + "/prefixItems/" + std::to_string(i)));
      }
    }
    std::string item = "json-value";
    bool items_allowed = true;
    if (s.contains("items")) {
      if (s["items"] == false) {
        items_allowed = false;
      } else if (s["items"].is_array()) {
        return unsupported("items", path, "an array of schemas: use prefixItems");
      } else {
        item = visit(s["items"], path + "/items");
      }
    }
    const uint64_t p = prefix.size();
    // After p prefix elements: the remaining items, count in [lo-p, hi-p].
    const uint64_t rest_lo = lo > p ? lo - p : 0;
    const uint64_t rest_hi = !items_allowed ? 0 : hi == UINT64_MAX ? UINT64_MAX : (hi > p ? hi - p : 0);
    if (rest_lo > rest_hi) return fail("minItems at " + path + " exceeds what prefixItems and items allow");
    auto rep = [](uint64_t a, uint64_t b) {
      return "{" + std::to_string(a) + "," + (b == UINT64_MAX ? "" : std::to_string(b)) + "}";
    };
    std::string tail;  // once at least one element was written
    if (rest_hi == 0) {
      tail = "\"\"";
    } else {
      tail = "( \",\" ws " + item + " ws )" + rep(rest_lo, rest_hi);
    }
    std::string body;  // elements from index p on when nothing was written yet (only if p == 0)
    if (p == 0) {
      if (rest_hi == 0) {
        body = "\"\"";
      } else if (rest_lo == 0) {
        body = "( " + item + " ws ( \",\" ws " + item + " ws )" +
               rep(0, rest_hi == UINT64_MAX ? UINT64_MAX : rest_hi - 1) + " )?";
      } else {
        body = item + " ws ( \",\" ws " + item + " ws )" +
               rep(rest_lo - 1, rest_hi == UINT64_MAX ? UINT64_MAX : rest_hi - 1);
      }
      return "( \"[\" ws " + body + " \"]\" )";
    }
    // Prefix elements i = p-1 .. 0, each optional once i >= lo (the array may end before it).
    std::string rest = tail;
    for (uint64_t i = p; i-- > 0;) {
      const std::string elem = std::string(i ? "\",\" ws " : "") + prefix[i] + " ws " + rest;
      rest = i >= lo ? "( " + elem + " )?" : "( " + elem + " )";
      if (hi != UINT64_MAX && i >= hi) rest = "\"\"";
      rest = new_rule("prefix", rest);
    }
    return "( \"[\" ws " + rest + " \"]\" )";
  }

  const Json& root_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::map<std::string, std::string> refs_;
  std::string error_;
  int depth_ = 0;
};

}  // namespace

Result<std::string> json_schema_to_gbnf(const Json& schema) {
  return SchemaConverter(schema).run();
}

}  // namespace rill::grammar
