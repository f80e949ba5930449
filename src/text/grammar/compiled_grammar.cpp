#include "text/grammar/compiled_grammar.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "text/grammar/gbnf_parser.h"

namespace rill::grammar {
namespace {

using ByteSet = std::array<uint64_t, 4>;
struct ByteRange {
  uint8_t lo, hi;
};
using Utf8Sequence = std::vector<ByteRange>;

int utf8_length(uint32_t cp) {
  return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

void encode_utf8(uint32_t cp, int n, uint8_t out[4]) {
  if (n == 1) {
    out[0] = static_cast<uint8_t>(cp);
    return;
  }
  for (int i = n - 1; i > 0; --i, cp >>= 6) out[i] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  const uint8_t lead = n == 2 ? 0xC0 : n == 3 ? 0xE0 : 0xF0;
  out[0] = static_cast<uint8_t>(lead | cp);
}

// [lo, hi] of one UTF-8 length as byte-range sequences whose product is
// exactly the encodings of the range (the split of Rust's regex-syntax).
void split_same_length(uint32_t lo, uint32_t hi, int n, std::vector<Utf8Sequence>& out) {
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split_same_length(lo, lo | m, n, out);
        split_same_length((lo | m) + 1, hi, n, out);
        return;
      }
      if ((hi & m) != m) {
        split_same_length(lo, (hi & ~m) - 1, n, out);
        split_same_length(hi & ~m, hi, n, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  encode_utf8(lo, n, a);
  encode_utf8(hi, n, b);
  Utf8Sequence seq;
  for (int k = 0; k < n; ++k) seq.push_back({a[k], b[k]});
  out.push_back(std::move(seq));
}

// Code point ranges (scalar values only) as UTF-8 byte-range sequences.
std::vector<Utf8Sequence> utf8_sequences(const std::vector<CodepointRange>& ranges) {
  std::vector<Utf8Sequence> out;
  for (auto [lo, hi] : ranges) {
    while (lo <= hi) {
      const int n = utf8_length(lo);
      const uint32_t end_of_length = n == 1 ? 0x7F : n == 2 ? 0x7FF : n == 3 ? 0xFFFF : kMaxCodepoint;
      const uint32_t piece_hi = std::min(hi, end_of_length);
      split_same_length(lo, piece_hi, n, out);
      if (piece_hi == hi) break;
      lo = piece_hi + 1;
    }
  }
  return out;
}

// Sorted, merged, surrogates removed; complemented when `negated`.
std::vector<CodepointRange> normalize_class(const Expr& e) {
  std::vector<CodepointRange> r = e.ranges;
  std::sort(r.begin(), r.end(), [](auto& a, auto& b) { return a.lo < b.lo; });
  std::vector<CodepointRange> merged;
  for (auto x : r) {
    if (!merged.empty() && x.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, x.hi);
    } else {
      merged.push_back(x);
    }
  }
  if (e.negated) {
    std::vector<CodepointRange> comp;
    uint32_t next = 0;
    for (auto x : merged) {
      if (x.lo > next) comp.push_back({next, x.lo - 1});
      next = x.hi + 1;
    }
    if (next <= kMaxCodepoint) comp.push_back({next, kMaxCodepoint});
    merged = std::move(comp);
  }
  std::vector<CodepointRange> out;
  for (auto x : merged) {  // drop U+D800..U+DFFF
    if (x.hi < 0xD800 || x.lo > 0xDFFF) {
      out.push_back(x);
      continue;
    }
    if (x.lo < 0xD800) out.push_back({x.lo, 0xD7FF});
    if (x.hi > 0xDFFF) out.push_back({0xE000, x.hi});
  }
  return out;
}

}  // namespace

class Compiler {
 public:
  Result<std::shared_ptr<const CompiledGrammar>> run(const GrammarAst& ast) {
    for (const auto& rule : ast.rules) {
      ids_.emplace(rule.name, static_cast<uint32_t>(rules_.size()));
      rules_.push_back({rule.name, {}, 0, 0, false, 0});
    }
    for (size_t i = 0; i < ast.rules.size(); ++i) {
      std::vector<std::vector<Element>> alts;
      lower_alternatives(ast.rules[i].body, ast.rules[i].name, alts);
      if (!error_.empty()) return Error{error_};
      rules_[i].alts = std::move(alts);
    }
    if (n_elements_ > kMaxElements) return too_large();
    auto g = std::make_shared<CompiledGrammar>();
    g->byte_sets_ = std::move(sets_);
    g->rule_alt_begin_.push_back(0);
    for (auto& rule : rules_) {
      for (auto& alt : rule.alts) {
        g->alt_starts_.push_back(static_cast<uint32_t>(g->elements_.size()));
        g->elements_.insert(g->elements_.end(), alt.begin(), alt.end());
        g->elements_.push_back({Element::Type::kEnd, 0});
      }
      g->rule_alt_begin_.push_back(static_cast<uint32_t>(g->alt_starts_.size()));
      g->rule_names_.push_back(rule.name);
    }
    g->root_ = ids_.at("root");
    RILL_TRY(check_left_recursion());
    return std::shared_ptr<const CompiledGrammar>(std::move(g));
  }

 private:
  struct RuleBuild {
    std::string name;
    std::vector<std::vector<Element>> alts;
    uint32_t line, col;
    bool is_repeat;     // a helper of X* or X{m,n}: alts[0] is X then (maybe) a rule
    size_t n_item = 0;  // elements of X at the start of alts[0]
  };

  Error too_large() const {
    return Error{"grammar: too large once repetitions are expanded (more than " + std::to_string(kMaxElements) +
                 " elements)"};
  }

  uint32_t byte_set(const ByteSet& s) {
    auto [it, added] = set_ids_.emplace(s, static_cast<uint32_t>(sets_.size()));
    if (added) sets_.push_back(s);
    return it->second;
  }
  uint32_t byte_range_set(uint8_t lo, uint8_t hi) {
    ByteSet s{};
    for (unsigned b = lo; b <= hi; ++b) s[b >> 6] |= uint64_t{1} << (b & 63);
    return byte_set(s);
  }

  uint32_t new_rule(const std::string& name, const Expr& origin, bool is_repeat) {
    rules_.push_back({name, {}, origin.line, origin.col, is_repeat, 0});
    return static_cast<uint32_t>(rules_.size() - 1);
  }
  std::string helper_name(const std::string& parent, const Expr& e, const char* what) const {
    return parent + "/" + what + "@" + std::to_string(e.line) + ":" + std::to_string(e.col) + "#" +
           std::to_string(rules_.size());
  }

  void lower_alternatives(const Expr& body, const std::string& name, std::vector<std::vector<Element>>& alts) {
    if (body.kind == Expr::Kind::kAlt) {
      for (const auto& child : body.children) {
        alts.emplace_back();
        lower_sequence(child, name, alts.back());
      }
    } else {
      alts.emplace_back();
      lower_sequence(body, name, alts.back());
    }
  }

  void emit(std::vector<Element>& seq, Element e) {
    seq.push_back(e);
    if (++n_elements_ > kMaxElements && error_.empty()) error_ = too_large().message;
  }

  void lower_sequence(const Expr& e, const std::string& name, std::vector<Element>& seq) {
    if (!error_.empty()) return;
    switch (e.kind) {
      case Expr::Kind::kSeq:
        for (const auto& child : e.children) lower_sequence(child, name, seq);
        return;
      case Expr::Kind::kLiteral:
        for (char c : e.text) {
          const auto b = static_cast<uint8_t>(c);
          emit(seq, {Element::Type::kChar, byte_range_set(b, b)});
        }
        return;
      case Expr::Kind::kClass: {
        const auto seqs = utf8_sequences(normalize_class(e));
        ByteSet single{};
        bool has_single = false;
        std::vector<const Utf8Sequence*> multi;
        for (const auto& s : seqs) {
          if (s.size() == 1) {
            has_single = true;
            for (unsigned b = s[0].lo; b <= s[0].hi; ++b) single[b >> 6] |= uint64_t{1} << (b & 63);
          } else {
            multi.push_back(&s);
          }
        }
        if (multi.empty()) {  // includes the empty class: a set no byte is in
          emit(seq, {Element::Type::kChar, byte_set(single)});
          return;
        }
        std::vector<std::vector<Element>> alts;
        if (has_single) alts.push_back({{Element::Type::kChar, byte_set(single)}});
        for (const auto* s : multi) {
          alts.emplace_back();
          for (auto r : *s) emit(alts.back(), {Element::Type::kChar, byte_range_set(r.lo, r.hi)});
        }
        const uint32_t id = new_rule(helper_name(name, e, "class"), e, false);
        rules_[id].alts = std::move(alts);
        emit(seq, {Element::Type::kRule, id});
        return;
      }
      case Expr::Kind::kRef:
        emit(seq, {Element::Type::kRule, ids_.at(e.text)});
        return;
      case Expr::Kind::kAlt: {
        const uint32_t id = new_rule(helper_name(name, e, "group"), e, false);
        std::vector<std::vector<Element>> alts;
        lower_alternatives(e, name, alts);
        rules_[id].alts = std::move(alts);
        emit(seq, {Element::Type::kRule, id});
        return;
      }
      case Expr::Kind::kRepeat: {
        std::vector<Element> item;
        lower_sequence(e.children[0], name, item);
        for (uint32_t i = 0; i < e.min && error_.empty(); ++i) {
          for (auto el : item) emit(seq, el);
        }
        if (e.max == e.min) return;
        if (e.max == kUnbounded) {  // R ::= item R | (empty)
          const uint32_t id = new_rule(helper_name(name, e, "repeat"), e, true);
          rules_[id].n_item = item.size();
          std::vector<Element> loop = item;
          loop.push_back({Element::Type::kRule, id});
          rules_[id].alts = {std::move(loop), {}};
          emit(seq, {Element::Type::kRule, id});
          return;
        }
        // O_1 ::= item | (empty); O_k ::= item O_(k-1) | (empty).
        uint32_t prev = UINT32_MAX;
        for (uint32_t k = 0; k < e.max - e.min && error_.empty() && n_elements_ <= kMaxElements; ++k) {
          // X{m,n} with X nullable is ambiguous in 2^(n-m) ways; X? is fine.
          const uint32_t id = new_rule(helper_name(name, e, "optional"), e, e.max - e.min > 1);
          rules_[id].n_item = item.size();
          std::vector<Element> body = item;
          if (prev != UINT32_MAX) body.push_back({Element::Type::kRule, prev});
          n_elements_ += body.size();
          rules_[id].alts = {std::move(body), {}};
          prev = id;
        }
        if (n_elements_ > kMaxElements && error_.empty()) error_ = too_large().message;
        emit(seq, {Element::Type::kRule, prev});
        return;
      }
    }
  }

  Status check_left_recursion() const {
    const size_t n = rules_.size();
    std::vector<uint8_t> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const auto& alt : rules_[r].alts) {
          bool all = true;
          for (auto el : alt) {
            if (el.type == Element::Type::kChar || !nullable[el.arg]) {
              all = false;
              break;
            }
          }
          if (all) {
            nullable[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    for (const auto& rule : rules_) {
      if (!rule.is_repeat) continue;
      bool item_nullable = true;
      for (size_t k = 0; k < rule.n_item && item_nullable; ++k) {
        const Element el = rule.alts[0][k];
        item_nullable = el.type == Element::Type::kRule && nullable[el.arg];
      }
      if (item_nullable) {
        return Error{"grammar line " + std::to_string(rule.line) + ", column " + std::to_string(rule.col) +
                     ": a repetition of something that can match the empty string (ambiguous without end)"};
      }
    }
    // first[r]: rules r can expand to before consuming a byte.
    std::vector<std::vector<uint32_t>> first(n);
    for (size_t r = 0; r < n; ++r) {
      for (const auto& alt : rules_[r].alts) {
        for (auto el : alt) {
          if (el.type == Element::Type::kChar) break;
          first[r].push_back(el.arg);
          if (!nullable[el.arg]) break;
        }
      }
    }
    std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
    std::vector<uint32_t> path;
    // Iterative DFS (deep rule chains must not overflow the C++ stack).
    for (uint32_t start = 0; start < n; ++start) {
      if (color[start]) continue;
      std::vector<std::pair<uint32_t, size_t>> dfs{{start, 0}};
      color[start] = 1;
      while (!dfs.empty()) {
        auto& [r, next] = dfs.back();
        if (next == first[r].size()) {
          color[r] = 2;
          dfs.pop_back();
          continue;
        }
        const uint32_t to = first[r][next++];
        if (color[to] == 1) {
          std::string cycle = rules_[to].name;
          bool on = false;
          for (auto& [q, unused] : dfs) {
            (void)unused;
            if (q == to) on = true;
            // Helper rules (groups, repetitions: "parent/what@line:col") are not the user's.
            if (on && q != to && rules_[q].name.find('/') == std::string::npos) cycle += " -> " + rules_[q].name;
          }
          cycle += " -> " + rules_[to].name;
          return Error{"grammar: rule '" + rules_[to].name + "' is left-recursive (" + cycle +
                       "); rewrite it with repetition, e.g. a ::= b (\"op\" b)*"};
        }
        if (color[to] == 0) {
          color[to] = 1;
          dfs.push_back({to, 0});
        }
      }
    }
    return Status::Ok();
  }

  struct ByteSetHash {
    size_t operator()(const ByteSet& s) const { return s[0] * 31 + s[1] * 17 + s[2] * 7 + s[3]; }
  };

  std::map<std::string, uint32_t, std::less<>> ids_;
  std::vector<RuleBuild> rules_;
  std::vector<ByteSet> sets_;
  std::unordered_map<ByteSet, uint32_t, ByteSetHash> set_ids_;
  size_t n_elements_ = 0;
  std::string error_;
};

Result<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::compile(const GrammarAst& ast) {
  return Compiler().run(ast);
}

Result<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::from_gbnf(std::string_view text) {
  auto ast = parse_gbnf(text);
  if (!ast) return ast.error();
  return compile(*ast);
}

}  // namespace rill::grammar
