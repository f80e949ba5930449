#include "backend/cpu/rope_table.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <numbers>

namespace rill::cpu {
namespace {

// HF _compute_llama3_parameters: wavelengths longer than
// original/low_freq_factor are divided by factor, shorter than
// original/high_freq_factor kept, the band between blended smoothly.
double llama3_inv_freq(double inv_freq, const RopeScalingParams& s) {
  const double old_ctx = static_cast<double>(s.original_max_position);
  const double low_wavelen = old_ctx / s.low_freq_factor;
  const double high_wavelen = old_ctx / s.high_freq_factor;
  const double wavelen = 2.0 * std::numbers::pi / inv_freq;
  if (wavelen > low_wavelen) return inv_freq / s.factor;
  if (wavelen < high_wavelen) return inv_freq;
  const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * inv_freq / s.factor + smooth * inv_freq;
}

// HF find_correction_dim: the dim index whose wavelength completes
// n_rotations over the original context.
double yarn_correction_dim(double n_rotations, int64_t dim, double base, double max_pos) {
  return (static_cast<double>(dim) * std::log(max_pos / (n_rotations * 2.0 * std::numbers::pi))) /
         (2.0 * std::log(base));
}

}  // namespace

RopeTable make_rope_table(float theta, int64_t rot_dim, bool interleaved, const RopeScalingParams& s) {
  assert(rot_dim > 0 && rot_dim % 2 == 0);
  RopeTable t;
  t.rot_dim = rot_dim;
  t.interleaved = interleaved;
  const int64_t half = rot_dim / 2;
  t.inv_freq.resize(static_cast<size_t>(half));
  const double base = theta;

  double low = 0.0, high = 0.0;
  if (s.type == RopeScalingParams::Type::kYarn) {
    assert(s.original_max_position > 0);
    const double max_pos = static_cast<double>(s.original_max_position);
    low = yarn_correction_dim(s.beta_fast, rot_dim, base, max_pos);
    high = yarn_correction_dim(s.beta_slow, rot_dim, base, max_pos);
    if (s.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(rot_dim - 1));
    if (low == high) high += 0.001;  // avoid a zero-width ramp
    t.attn_factor = s.attention_factor ? *s.attention_factor
                    : s.factor > 1.0f  ? static_cast<float>(0.1 * std::log(s.factor) + 1.0)
                                       : 1.0f;
  }

  for (int64_t i = 0; i < half; ++i) {
    const double inv = 1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(rot_dim));
    double f = inv;
    switch (s.type) {
      case RopeScalingParams::Type::kNone:
        break;
      case RopeScalingParams::Type::kLinear:
        f = inv / s.factor;
        break;
      case RopeScalingParams::Type::kLlama3:
        assert(s.original_max_position > 0);
        f = llama3_inv_freq(inv, s);
        break;
      case RopeScalingParams::Type::kYarn: {
        // ramp 0 below `low` (keep extrapolated freq), 1 above `high` (interpolate).
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolation_factor = 1.0 - ramp;
        f = (inv / s.factor) * (1.0 - extrapolation_factor) + inv * extrapolation_factor;
        break;
      }
    }
    t.inv_freq[static_cast<size_t>(i)] = static_cast<float>(f);
  }
  return t;
}

}  // namespace rill::cpu
