#pragma once
// StepCostModel: predicts an engine step's wall time from its token count,
// fitted online to the steps the engine measured. The scheduler sizes a
// step's prefill share with it (SchedulerOptions::max_step_s).
//
// Model: seconds = fixed + per_token x n_tokens, fitted by least squares
// with exponential forgetting (an observation's weight decays by `decay`
// per later step: 0.95 follows about the last 20 steps, so a change of load
// or machine is learned within a second of decoding, while one noisy step
// moves the fit by a few percent).
//
// Why one rate for decode and prefill tokens: on the CPU both are rows of
// the same matmuls (a decode row also pays its LM-head row; the rate
// absorbs that), and on a GPU a small step costs about `fixed` (reading the
// weights) while rows add little until compute binds. Why not an EWMA of
// seconds per token per step kind: under load nearly every step carries
// prefill, so the decode-only rate goes stale, and a per-token rate cannot
// tell the cost a step pays however few tokens it has from the cost of its
// tokens, which is what the size of the prefill share depends on.
//
// When the steps seen do not separate the two terms (every step the same
// size, or a fit with a negative fixed cost) the fit goes through the
// origin: the fixed cost becomes part of the rate, which over-predicts
// steps larger than those seen, so a share sized from it errs small.
//
// Pure arithmetic, no clock: the engine feeds it measured steps, the tests
// feed it numbers.
#include <cstdint>

namespace rill {

class StepCostModel {
 public:
  static constexpr int64_t kMinSteps = 4;  // observations before ready()

  explicit StepCostModel(double decay = 0.95);

  // One measured step of n_tokens; ignored unless n_tokens > 0 and seconds
  // is positive and finite.
  void observe(int32_t n_tokens, double seconds);

  bool ready() const { return n_steps_ >= kMinSteps; }
  int64_t n_steps() const { return n_steps_; }
  double fixed_s() const { return fixed_s_; }
  double per_token_s() const { return per_token_s_; }
  double predict_s(int32_t n_tokens) const { return fixed_s_ + per_token_s_ * n_tokens; }
  // The most tokens whose predicted step takes at most `seconds` (0 when
  // none; INT32_MAX when tokens cost nothing in the fit).
  int32_t max_tokens_within(double seconds) const;

 private:
  void refit();

  double decay_;
  // Decayed sums over the observations of 1, n, n^2, t and n*t.
  double s_1_ = 0, s_n_ = 0, s_nn_ = 0, s_t_ = 0, s_nt_ = 0;
  int64_t n_steps_ = 0;
  double fixed_s_ = 0, per_token_s_ = 0;
};

}  // namespace rill
