#include "backend/cpu/linear.h"

namespace rill {
namespace {

void add_bias(const Linear& l, float* y, int64_t n_tokens, cpu::HostOps& backend) {
  for (int64_t t = 0; t < n_tokens; ++t) backend.add_inplace(y + t * l.n_out(), l.bias.data(), l.n_out());
}

}  // namespace

void Linear::forward(const float* x, int64_t n_tokens, float* y, cpu::HostOps& backend) const {
  backend.matmul(w, x, n_tokens, y);
  if (!bias.empty()) add_bias(*this, y, n_tokens, backend);
}

void forward_group(const Linear* const* ls, float* const* ys, int n, const float* x, int64_t n_tokens,
                   cpu::HostOps& backend) {
  const WeightView* ws[cpu::kMaxMatmulGroup] = {};
  if (n > cpu::kMaxMatmulGroup) {
    for (int i = 0; i < n; ++i) ls[i]->forward(x, n_tokens, ys[i], backend);
    return;
  }
  for (int i = 0; i < n; ++i) ws[i] = &ls[i]->w;
  backend.matmul_group(ws, ys, n, x, n_tokens);
  for (int i = 0; i < n; ++i) {
    if (!ls[i]->bias.empty()) add_bias(*ls[i], ys[i], n_tokens, backend);
  }
}

}  // namespace rill
