#include "engine/step_cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace rill {

StepCostModel::StepCostModel(double decay) : decay_(std::clamp(decay, 0.0, 1.0)) {}

void StepCostModel::observe(int32_t n_tokens, double seconds) {
  if (n_tokens <= 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  const double n = n_tokens;
  s_1_ = decay_ * s_1_ + 1;
  s_n_ = decay_ * s_n_ + n;
  s_nn_ = decay_ * s_nn_ + n * n;
  s_t_ = decay_ * s_t_ + seconds;
  s_nt_ = decay_ * s_nt_ + n * seconds;
  ++n_steps_;
  refit();
}

void StepCostModel::refit() {
  // s_1 x s_nn - s_n^2 is s_1^2 x the weighted variance of n: the fit
  // separates fixed from per-token cost only when step sizes vary (by at
  // least a token, as a standard deviation).
  const double spread = s_1_ * s_nn_ - s_n_ * s_n_;
  if (spread >= s_1_ * s_1_) {
    const double per_token = (s_1_ * s_nt_ - s_n_ * s_t_) / spread;
    const double fixed = (s_t_ - per_token * s_n_) / s_1_;
    if (per_token >= 0 && fixed >= 0) {
      per_token_s_ = per_token;
      fixed_s_ = fixed;
      return;
    }
  }
  fixed_s_ = 0;
  per_token_s_ = s_nt_ / s_nn_;  // least squares through the origin
}

int32_t StepCostModel::max_tokens_within(double seconds) const {
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  if (seconds < fixed_s_) return 0;
  if (per_token_s_ <= 0) return kMax;
  // A millionth of a token of slack: a target that is exactly n tokens'
  // cost holds n tokens despite rounding.
  const double n = std::floor((seconds - fixed_s_) / per_token_s_ + 1e-6);
  return n >= kMax ? kMax : static_cast<int32_t>(n);
}

}  // namespace rill
