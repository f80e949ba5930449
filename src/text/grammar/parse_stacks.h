#pragma once
// The matcher's state: a set of parse stacks over a CompiledGrammar, and the
// step that consumes one byte.
//
// A stack lists element positions, bottom to top. The top is a kChar
// element (the next byte to match); the ones below are where each enclosing
// rule continues once the rule above it ends. A continuation that is a kEnd
// is never pushed (tail calls), so right recursion and X* keep stacks flat.
// An empty stack means the root rule is complete: the text may end here.
// Several stacks are alive where the grammar is ambiguous so far; a set
// holds each stack once.
//
// A stack may have kHole at its bottom: a stack cut to its top frames (the
// token-mask cache keys on those). Popping down to the hole means "the rest
// depends on frames not known here"; Stepper reports it instead of going on.
//
// Bounds: a set holds at most kMaxStacks stacks and an expansion goes at
// most kMaxExpandDepth rules deep. A step that would exceed either reports
// overflow; callers treat it as "this byte is not allowed" (a mask then
// leaves the token out; the matcher refuses the token), so output never
// leaves the grammar, and a request whose grammar is that ambiguous ends
// with an error instead of using unbounded memory.
#include <cstdint>
#include <span>
#include <vector>

#include "text/grammar/compiled_grammar.h"

namespace rill::grammar {

inline constexpr uint32_t kHole = UINT32_MAX;
inline constexpr size_t kMaxStacks = 1024;
inline constexpr int kMaxExpandDepth = 1000;

class StackSet {
 public:
  void clear() {
    cells_.clear();
    offsets_.resize(1);
  }
  size_t size() const { return offsets_.size() - 1; }
  bool empty() const { return size() == 0; }
  std::span<const uint32_t> stack(size_t i) const {
    return {cells_.data() + offsets_[i], cells_.data() + offsets_[i + 1]};
  }
  void add(std::span<const uint32_t> s) {
    cells_.insert(cells_.end(), s.begin(), s.end());
    offsets_.push_back(static_cast<uint32_t>(cells_.size()));
  }
  // True when some stack is empty: the root rule may be complete.
  bool can_end() const;
  // Removes repeated stacks (order not kept). `scratch` is reused storage.
  void dedup(StackSet& scratch);
  bool operator==(const StackSet& o) const { return cells_ == o.cells_ && offsets_ == o.offsets_; }

 private:
  std::vector<uint32_t> cells_;
  std::vector<uint32_t> offsets_{0};
  std::vector<std::pair<uint64_t, uint32_t>> order_;  // dedup scratch
};

class Stepper {
 public:
  explicit Stepper(const CompiledGrammar& g) : g_(g) {}

  struct StepResult {
    bool hole = false;      // some stack popped down to its kHole
    bool overflow = false;  // a bound was hit; `out` is incomplete
  };

  // The start state: the root rule's alternatives, expanded.
  StepResult initial(StackSet& out);
  // Expands `stack` (any top: a rule, an end, a char) into `out`.
  StepResult expand(std::span<const uint32_t> stack, StackSet& out);
  // out = the stacks of `in` that accept `byte`, advanced and expanded
  // (deduplicated). `out` is cleared first; `in` must not be `out`.
  StepResult advance(const StackSet& in, uint8_t byte, StackSet& out);

  const CompiledGrammar& grammar() const { return g_; }

 private:
  void expand_top(StackSet& out, int depth, StepResult& r);

  const CompiledGrammar& g_;
  std::vector<uint32_t> scratch_;
  StackSet dedup_scratch_;
};

}  // namespace rill::grammar
