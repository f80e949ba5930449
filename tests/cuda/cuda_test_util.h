#pragma once
// Helpers of the CUDA tests: skip without a device, copy vectors to and
// from the device, seeded random data, bf16/f16 rounding on the host.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_context.h"
#include "core/dtype.h"
#include "core/half.h"

namespace rill::cuda::testing {

#define RILL_REQUIRE_GPU()                                                   \
  do {                                                                       \
    if (!::rill::cuda::device_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// Sets an environment variable for the guard's lifetime, then restores
// what it was (or unsets it), however the test leaves.
class ScopedEnv {
 public:
  explicit ScopedEnv(const char* name) : name_(name) {
    if (const char* v = std::getenv(name)) saved_ = v;
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    if (saved_) {
      ::setenv(name_, saved_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const char* name, const char* value) : ScopedEnv(name) { set(value); }
  void set(const char* value) { ::setenv(name_, value, 1); }

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Values rounded to dtype and back (what the device sees after conversion).
inline float round_to(DType t, float x) {
  if (t == DType::kBF16) return bf16_to_f32(f32_to_bf16(x));
  if (t == DType::kF16) return f16_to_f32(f32_to_f16(x));
  return x;
}

// Host bytes of v in dtype (F32/F16/BF16).
inline std::vector<uint8_t> encode(DType t, const std::vector<float>& v) {
  const size_t es = t == DType::kF32 ? 4 : 2;
  std::vector<uint8_t> out(v.size() * es);
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = t == DType::kF16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

inline std::vector<float> decode(DType t, const std::vector<uint8_t>& b) {
  const size_t es = t == DType::kF32 ? 4 : 2;
  std::vector<float> v(b.size() / es);
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kF32) {
      std::memcpy(&v[i], b.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      v[i] = t == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
  }
  return v;
}

template <typename T>
DeviceBuffer upload(const std::vector<T>& v) {
  auto b = DeviceBuffer::allocate(v.size() * sizeof(T) + 16, "test buffer");
  EXPECT_TRUE(b.ok());
  RILL_CUDA_CHECK(cudaMemcpy(b->data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  // A copy from pageable memory may still be in flight when cudaMemcpy
  // returns, and the legacy stream does not order the non-blocking streams
  // the kernels under test use (Context's): wait for it.
  RILL_CUDA_CHECK(cudaDeviceSynchronize());
  return std::move(b).value();
}

template <typename T>
std::vector<T> download(const DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  RILL_CUDA_CHECK(cudaDeviceSynchronize());
  RILL_CUDA_CHECK(cudaMemcpy(v.data(), b.data(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// Worst |got - (y0 + W x)| over sum |w x| per output of a GEMM y [n, rows]
// (+)= x [n, cols] W [rows, cols]^T, in f64 over w and x as the device sees
// them (y0 empty: nothing added); a NaN output counts as infinitely wrong.
inline double worst_gemm_error(const std::vector<float>& w, const std::vector<float>& x, int64_t n, int64_t rows,
                               int64_t cols, const std::vector<float>& got, const std::vector<float>& y0) {
  double worst = 0;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0, mag = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double v = double(w[static_cast<size_t>(r * cols + c)]) * x[static_cast<size_t>(t * cols + c)];
        sum += v;
        mag += std::fabs(v);
      }
      const size_t i = static_cast<size_t>(t * rows + r);
      const double err = std::fabs(double(got[i]) - (y0.empty() ? 0.0 : y0[i]) - sum) / (mag + 1e-30);
      worst = std::isnan(err) ? INFINITY : std::max(worst, err);
    }
  }
  return worst;
}

// A device buffer of n bytes filled with 0xff (NaN for f32/f16/bf16), so an
// element a kernel forgets to write fails the comparison.
inline DeviceBuffer poisoned(size_t bytes) {
  auto b = DeviceBuffer::allocate(bytes + 16, "test buffer");
  EXPECT_TRUE(b.ok());
  RILL_CUDA_CHECK(cudaMemset(b->data(), 0xff, bytes + 16));
  RILL_CUDA_CHECK(cudaDeviceSynchronize());  // as upload: ordered before any stream's kernels
  return std::move(b).value();
}

// The median time of `runs` runs of f (launches on the default stream),
// each between two events, in ms: a call alone, launch included.
template <typename F>
double median_ms(F&& f, int runs = 20) {
  cudaEvent_t e0, e1;
  RILL_CUDA_CHECK(cudaEventCreate(&e0));
  RILL_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> t;
  for (int i = 0; i < runs; ++i) {
    RILL_CUDA_CHECK(cudaEventRecord(e0, nullptr));
    f();
    RILL_CUDA_CHECK(cudaEventRecord(e1, nullptr));
    RILL_CUDA_CHECK(cudaEventSynchronize(e1));
    float x = 0.0f;
    RILL_CUDA_CHECK(cudaEventElapsedTime(&x, e0, e1));
    t.push_back(x);
  }
  std::sort(t.begin(), t.end());
  RILL_CUDA_CHECK(cudaEventDestroy(e0));
  RILL_CUDA_CHECK(cudaEventDestroy(e1));
  return t[t.size() / 2];
}

}  // namespace rill::cuda::testing
