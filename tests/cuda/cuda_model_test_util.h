#pragma once
// What the CUDA model-family tests share beyond the HF goldens
// (tests/engine/golden_util.h): a checkpoint's matrices converted to bf16 in
// memory, and the largest difference of two logit vectors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../engine/golden_util.h"
#include "core/half.h"
#include "loader/model_files.h"

namespace rill::test {

// Every 2-D f32 tensor of `files` converted to bf16 in place; the
// converted buffers live in `store`.
inline void to_bf16(ModelFiles& files, std::vector<std::vector<uint16_t>>& store) {
  for (auto& [name, t] : files.tensors) {
    if (t.shape.size() != 2 || t.dtype != DType::kF32) continue;
    const auto* src = reinterpret_cast<const float*>(t.data);
    std::vector<uint16_t> b(static_cast<size_t>(t.n_elements()));
    for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(src[i]);
    store.push_back(std::move(b));
    t.dtype = DType::kBF16;
    t.data = reinterpret_cast<const uint8_t*>(store.back().data());
    t.n_bytes = store.back().size() * 2;
  }
}

// max |a[i] - b[i]|; the sizes must agree.
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

}  // namespace rill::test
