#include "text/grammar/parse_stacks.h"

#include <algorithm>

namespace rill::grammar {

bool StackSet::can_end() const {
  for (size_t i = 0; i < size(); ++i) {
    if (offsets_[i] == offsets_[i + 1]) return true;
  }
  return false;
}

void StackSet::dedup(StackSet& scratch) {
  if (size() < 2) return;
  order_.clear();
  for (uint32_t i = 0; i < size(); ++i) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the cells
    for (uint32_t c : stack(i)) h = (h ^ c) * 1099511628211ull;
    order_.push_back({h, i});
  }
  std::sort(order_.begin(), order_.end());
  scratch.clear();
  for (size_t k = 0; k < order_.size(); ++k) {
    const auto s = stack(order_[k].second);
    bool repeat = false;
    for (size_t j = k; j-- > 0 && order_[j].first == order_[k].first;) {
      const auto t = stack(order_[j].second);
      if (std::equal(s.begin(), s.end(), t.begin(), t.end())) {
        repeat = true;
        break;
      }
    }
    if (!repeat) scratch.add(s);
  }
  cells_.swap(scratch.cells_);
  offsets_.swap(scratch.offsets_);
}

// scratch_ holds the stack being expanded; its top may be any element.
// On return scratch_ is as it was.
void Stepper::expand_top(StackSet& out, int depth, StepResult& r) {
  if (r.overflow) return;
  if (depth > kMaxExpandDepth || out.size() >= kMaxStacks) {
    r.overflow = true;
    return;
  }
  const uint32_t pos = scratch_.back();
  if (pos == kHole) {
    r.hole = true;
    return;
  }
  const Element el = g_.element(pos);
  switch (el.type) {
    case Element::Type::kChar:
      out.add(scratch_);
      return;
    case Element::Type::kEnd:
      scratch_.pop_back();
      if (scratch_.empty()) {
        out.add(scratch_);
      } else {
        expand_top(out, depth + 1, r);
      }
      scratch_.push_back(pos);
      return;
    case Element::Type::kRule: {
      scratch_.pop_back();
      const bool has_continuation = g_.element(pos + 1).type != Element::Type::kEnd;
      if (has_continuation) scratch_.push_back(pos + 1);
      for (uint32_t alt : g_.alternatives(el.arg)) {
        scratch_.push_back(alt);
        expand_top(out, depth + 1, r);
        scratch_.pop_back();
      }
      if (has_continuation) scratch_.pop_back();
      scratch_.push_back(pos);
      return;
    }
  }
}

Stepper::StepResult Stepper::expand(std::span<const uint32_t> stack, StackSet& out) {
  StepResult r;
  scratch_.assign(stack.begin(), stack.end());
  if (scratch_.empty()) {
    out.add(scratch_);
  } else {
    expand_top(out, 0, r);
  }
  return r;
}

Stepper::StepResult Stepper::initial(StackSet& out) {
  out.clear();
  StepResult r;
  for (uint32_t alt : g_.alternatives(g_.root())) {
    scratch_.assign(1, alt);
    expand_top(out, 0, r);
  }
  out.dedup(dedup_scratch_);
  return r;
}

Stepper::StepResult Stepper::advance(const StackSet& in, uint8_t byte, StackSet& out) {
  out.clear();
  StepResult r;
  for (size_t i = 0; i < in.size() && !r.overflow; ++i) {
    const auto s = in.stack(i);
    if (s.empty()) continue;  // complete: nothing more to match
    const Element el = g_.element(s.back());
    if (!g_.byte_in_set(el.arg, byte)) continue;
    scratch_.assign(s.begin(), s.end());
    scratch_.back() += 1;
    expand_top(out, 0, r);
  }
  if (out.size() > 1) out.dedup(dedup_scratch_);
  return r;
}

}  // namespace rill::grammar
