// rope_store_kv's K/V bytes (backend/cuda/kv_types.cuh's stores) are the
// CPU store's (cpu::store_kv_row unrotated: llama.cpp's reference
// quantizers, core/half.h's f16 / bf16 rounding, core/e4m3.h's) byte for
// byte, for every plain KV type CUDA stores: f32, f16, bf16, q8_0, q4_0,
// q4_1, q5_0, q5_1 and fp8 (bf16 / q4_1 / q5_0 / q5_1: kv_types_ggml.cuh,
// not yet run on a GPU). The values reach the store unchanged (rot_dim 0,
// no q/k norm), a token's K and V rows into shuffled slots, through both
// rope kernels (rope_store_kv: the warp kernel for the element types;
// rope_store_kv_general: the block kernel for all). Blocks of:
//  - Gaussian values with offsets, at scales from 2^-12 to 2^12 (f16
//    subnormal d, d's and m's f16 rounding), and tiny ones (d rounds to 0);
//  - zeros, -0, +0 and -0 mixed either way round (the CPU's scans keep the
//    first of equal elements: m's sign is the first zero's), one value
//    (d = 0), all negative;
//  - +3 and -3 both (the first wins q4_0's / q5_0's signed scale), an
//    outlier among small values, values past f16's range (d and m overflow
//    as on the CPU);
//  - the levels 0..15 of d = 1 and the half-way points between them (the
//    codes' truncation of (x - m) / d + 0.5 at its ties).
// Heads of 16 (two heads a block), 32 (q5_0's 22-byte blocks 2-byte
// aligned), 64, 128 and 256. No NaN or inf: the CPU's int8_t conversion of
// a NaN code is undefined.
// The host runs of the new types' arithmetic (kv_probe.h: the tags' own
// scale / code / packing over a serial scan, and their loads) are held to
// the CPU's bytes and values without a GPU (HostRunsOfTheNewTypesAreTheCpus).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/kv_quant.h"
#include "backend/cpu/quants.h"
#include "backend/cuda/kv_probe.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/rope_kv.h"
#include "core/dtype.h"
#include "core/e4m3.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

using namespace testing;

// n floats, block b (32 values) of kind b % 16 (see the file comment).
std::vector<float> edge_blocks(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t b = 0; b < n / 32; ++b) {
    const int kind = static_cast<int>(b % 16);
    const float offset = 8.0f * uni(rng), scale = std::exp2(12.0f * uni(rng));
    for (int j = 0; j < 32; ++j) {
      float v = offset + scale * g(rng);
      switch (kind) {
        case 1:
          v = 0.0f;
          break;
        case 2:
          v = -0.0f;
          break;
        case 3:
          v = j % 3 == 0 ? -0.0f : 0.0f;  // -0 first
          break;
        case 4:
          v = j % 3 == 1 ? -0.0f : 0.0f;  // +0 first
          break;
        case 5:
          v = 0.1f;
          break;
        case 6:
          v = -1.5f;
          break;
        case 7:
          v = -1.0f - std::fabs(uni(rng));
          break;
        case 8:
          v = j == 0 ? 3.0f : j == 1 ? -3.0f : uni(rng);
          break;
        case 9:
          v = j == 0 ? -3.0f : j == 1 ? 3.0f : uni(rng);
          break;
        case 10:
          v = j == 7 ? 1000.0f : 0.01f * uni(rng);
          break;
        case 11:
          v = 1e5f * g(rng);  // past f16's range
          break;
        case 12:
          v = static_cast<float>(j % 16);  // the levels of d = 1, m = 0
          break;
        case 13:
          v = j == 31 ? 15.0f : 0.5f * static_cast<float>(j);  // half-way points of d = 1, m = 0
          break;
        case 14:
          v = 1e-6f * g(rng);  // d an f16 subnormal or 0
          break;
        default:
          break;
      }
      x[static_cast<size_t>(b * 32 + j)] = v;
    }
  }
  return x;
}

constexpr DType kPlainTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                                 DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, kF8E4M3};

void check_store(DType t, int32_t n_head_kv, int32_t hd, bool general) {
  const int64_t n_tok = 24, n_rows = 29, width = static_cast<int64_t>(n_head_kv) * hd, stride = 2 * width;
  std::vector<int32_t> slots(n_tok), pos(n_tok, 0);
  for (int64_t i = 0; i < n_tok; ++i) slots[i] = static_cast<int32_t>((i * 7 + 3) % n_rows);  // 7, 29 coprime
  const std::vector<float> kv = edge_blocks(n_tok * stride, 31);
  const size_t rb = row_bytes(t, width), cache_bytes = rb * static_cast<size_t>(n_rows);
  auto d_qkv = upload(kv);
  auto d_pos = upload(pos), d_slots = upload(slots);
  auto d_inv = upload(std::vector<float>{1.0f});
  auto d_k = poisoned(cache_bytes), d_v = poisoned(cache_bytes);
  RopeKvArgs a;
  a.qkv = d_qkv.as<float>();
  a.n_tokens = n_tok;
  a.qkv_stride = stride;
  a.n_head = 0;
  a.n_head_kv = n_head_kv;
  a.head_dim = hd;
  a.positions = d_pos.as<int32_t>();
  a.slots = d_slots.as<int32_t>();
  a.inv_freq = d_inv.as<float>();
  a.rot_dim = 0;  // no rotation: the store sees qkv's values
  a.k_cache = d_k.data();
  a.v_cache = d_v.data();
  a.kv_dtype = t;
  if (general) {
    rope_store_kv_general(a, nullptr);
  } else {
    rope_store_kv(a, nullptr);
  }
  const auto got_k = download<uint8_t>(d_k, cache_bytes), got_v = download<uint8_t>(d_v, cache_bytes);
  std::vector<uint8_t> want(rb);
  int mismatches = 0;
  for (int64_t i = 0; i < n_tok; ++i) {
    for (int side = 0; side < 2; ++side) {
      const float* src = kv.data() + i * stride + side * width;
      cpu::store_kv_row(t, false, src, want.data(), n_head_kv, hd);
      const uint8_t* got = (side == 0 ? got_k : got_v).data() + static_cast<size_t>(slots[i]) * rb;
      for (size_t byte = 0; byte < rb; ++byte) {
        if (got[byte] == want[byte]) continue;
        if (++mismatches <= 8) {
          const DTypeInfo info = dtype_info(t);
          const int64_t elem = static_cast<int64_t>(byte) / info.block_bytes * info.block_size;
          ADD_FAILURE() << dtype_name(t) << " hd " << hd << " x" << n_head_kv << (general ? " general" : " warp")
                        << ": token " << i << (side ? " V" : " K") << " byte " << byte << " (element " << elem
                        << ", kind " << (i * stride + side * width + elem) / 32 % 16 << "): CUDA 0x" << std::hex
                        << int{got[byte]} << ", CPU 0x" << int{want[byte]} << std::dec;
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << dtype_name(t) << " hd " << hd << (general ? " general" : " warp");
}

TEST(CudaKvStore, BytesAreTheCpusForEveryPlainType) {
  RILL_REQUIRE_GPU();
  struct Shape {
    int32_t n_head_kv, hd;
  };
  for (const DType t : kPlainTypes) {
    for (const Shape s : {Shape{8, 128}, Shape{2, 64}, Shape{4, 16}, Shape{3, 32}, Shape{1, 256}}) {
      for (const bool general : {false, true}) check_store(t, s.n_head_kv, s.hd, general);
    }
  }
}

// Without a GPU: kv_probe.h's host runs of kv_types_ggml.cuh. The tags'
// arithmetic and packing give the CPU quantizer's bytes for every block of
// edge_blocks; their loads give the CPU's dequantized values bit for bit
// (load1, load4 and load8 over the same row); q5_0's load8_biased codes
// times its scale are those values too.
TEST(CudaKvStore, HostRunsOfTheNewTypesAreTheCpus) {
  const int64_t n = 32 * 16 * 8;
  const std::vector<float> x = edge_blocks(n, 47);
  for (const DType t : {DType::kBF16, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1}) {
    SCOPED_TRACE(dtype_name(t));
    const size_t rb = row_bytes(t, n);
    std::vector<uint8_t> want(rb), got(rb + 16);
    cpu::ref::quantize_kv_row(t, x.data(), want.data(), n);
    ASSERT_TRUE(host_ggml_store(t, x.data(), n, got.data()));
    got.resize(rb);
    for (size_t byte = 0; byte < rb; ++byte) {
      const size_t blk = byte / static_cast<size_t>(dtype_info(t).block_bytes);
      ASSERT_EQ(int{got[byte]}, int{want[byte]})
          << "byte " << byte << " (block " << blk << ", kind " << (t == DType::kBF16 ? byte / 64 : blk) % 16 << ")";
    }
    std::vector<float> cpu_x(static_cast<size_t>(n)), l1(cpu_x.size()), l4(cpu_x.size()), l8(cpu_x.size()),
        biased(cpu_x.size(), NAN);
    cpu::ref::dequantize_row(t, want.data(), cpu_x.data(), n);
    ASSERT_TRUE(host_ggml_loads(t, want.data(), n, l1.data(), l4.data(), l8.data(), biased.data()));
    for (size_t i = 0; i < cpu_x.size(); ++i) {
      const uint32_t c = std::bit_cast<uint32_t>(cpu_x[i]);
      ASSERT_EQ(std::bit_cast<uint32_t>(l1[i]), c) << "load1, element " << i << ": " << l1[i] << " vs " << cpu_x[i];
      ASSERT_EQ(std::bit_cast<uint32_t>(l4[i]), c) << "load4, element " << i << ": " << l4[i] << " vs " << cpu_x[i];
      ASSERT_EQ(std::bit_cast<uint32_t>(l8[i]), c) << "load8, element " << i << ": " << l8[i] << " vs " << cpu_x[i];
      if (t == DType::kQ5_0) {
        ASSERT_EQ(std::bit_cast<uint32_t>(biased[i]), c) << "load8_biased, element " << i;
      }
    }
  }
  // Another type is refused.
  std::vector<uint8_t> row(64);
  std::vector<float> v(32);
  EXPECT_FALSE(host_ggml_store(DType::kQ4_0, v.data(), 32, row.data()));
  EXPECT_FALSE(host_ggml_loads(DType::kQ8_0, row.data(), 32, v.data(), v.data(), v.data(), v.data()));
}

}  // namespace
}  // namespace rill::cuda
