// k4c's per-channel K encoder on the device (backend/cuda/kv_chan.h) gives
// cpu::quantize_chan_block's bytes, byte for byte:
//  - from f32 rows: random channels (Gaussian, offsets far from zero as K's
//    outlier channels have, a wide one), channels of one value (an f16
//    value and not), zeros and -0 mixed with +0, values exactly on a
//    half-step (nearbyint's ties to even), huge values (a zero past f16's
//    range, differences past f32's), a NaN and an infinity among finite
//    values; each block as a sequence's first (the sink-key grids and
//    token 0's weight) and not;
//  - from q8_0 rows (the tails' rows, cpu::kKvChanTailType), as the CPU
//    backend's encode_chan_blocks encodes them: the rows dequantized, then
//    encoded;
//  - the tail rows the RoPE kernel writes in k4c's mode (RopeKvArgs::k_rows)
//    are cpu::store_chan_tail_rows' bytes, the V pool's iq4_nlh64 rows the
//    CPU encoder's (TailRowsAreTheCpus).
// The same encoder built for the host runs without a GPU
// (HostRunOfTheEncoderIsTheCpus); the device tests skip without one. Not
// yet run on a GPU (branch k4ccuda22).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/kv_alloc.h"
#include "backend/cpu/kv_quant.h"
#include "backend/cpu/quants.h"
#include "backend/cuda/kv_chan.h"
#include "backend/cuda/ops.h"
#include "core/dtype.h"
#include "core/e4m3.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

using namespace testing;
constexpr int kT = cpu::kKvChanTokens;

// Rows [n_units][32][width] f32: channel c of unit u drawn by kind (c + u) % 12.
std::vector<float> make_rows(int n_units, int width, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();
  std::vector<float> rows(static_cast<size_t>(n_units) * kT * width);
  for (int u = 0; u < n_units; ++u) {
    for (int c = 0; c < width; ++c) {
      const int kind = (c + u) % 12;
      const float offset = 8.0f * uni(rng), scale = std::exp2(4.0f * uni(rng));
      for (int j = 0; j < kT; ++j) {
        float v = offset + scale * g(rng);
        switch (kind) {
          case 1:
            v = 0.0f;
            break;
          case 2:
            v = j % 3 == 0 ? -0.0f : 0.0f;
            break;
          case 3:
            v = 1.5f;
            break;  // one f16 value
          case 4:
            v = 0.1f;
            break;  // one value, not an f16
          case 5:
            v = 0.25f + 0.5f * static_cast<float>(j % 16);
            break;  // half-steps of 0.5 from z = 0
          case 6:
            v = 70000.0f * g(rng);
            break;  // z past f16's range
          case 7:
            v = j == 5 ? kNan : v;
            break;
          case 8:
            v = j == 9 ? kInf : v;
            break;
          case 9:
            v = j == 0 ? 40.0f : v;
            break;  // a large first key (the sink)
          case 10:
            v = j % 2 ? 3e38f : -3e38f;
            break;  // max - z overflows f32
          default:
            break;
        }
        rows[(static_cast<size_t>(u) * kT + j) * width + c] = v;
      }
    }
  }
  return rows;
}

// Every unit of rows (f32 or q8_0 rows of row_bytes) encoded on the device:
// q4c's blocks, or q4a's under `widths` when given.
std::vector<uint8_t> encode_on_device(const std::vector<uint8_t>& rows, size_t row_bytes, DType row_dtype, int n_units,
                                      int width, const std::vector<uint8_t>& starts,
                                      const std::vector<uint8_t>* widths = nullptr) {
  const size_t block =
      widths ? static_cast<size_t>(cpu::alloc_block_bytes(widths->data(), width)) : static_cast<size_t>(19) * width;
  DeviceBuffer d_rows = upload(rows), d_out = upload(std::vector<uint8_t>(block * n_units, 0xAB));
  DeviceBuffer d_starts = upload(starts);
  std::vector<uint8_t> table(widths ? alloc_table_bytes(width) : 1);
  if (widths) fill_alloc_table(widths->data(), width, table.data());
  DeviceBuffer d_table = upload(table);
  std::vector<const uint8_t*> row_ptrs;
  std::vector<uint8_t*> dst_ptrs;
  for (int u = 0; u < n_units; ++u) {
    for (int j = 0; j < kT; ++j)
      row_ptrs.push_back(d_rows.as<uint8_t>() + (static_cast<size_t>(u) * kT + j) * row_bytes);
    dst_ptrs.push_back(d_out.as<uint8_t>() + static_cast<size_t>(u) * block);
  }
  DeviceBuffer d_row_ptrs = upload(row_ptrs), d_dst_ptrs = upload(dst_ptrs);
  ChanEncodeArgs a;
  a.rows = d_row_ptrs.as<const uint8_t*>();
  a.dst = d_dst_ptrs.as<uint8_t*>();
  a.sequence_start = d_starts.as<uint8_t>();
  a.row_dtype = row_dtype;
  a.n_units = n_units;
  a.width = width;
  a.widths = widths ? d_table.as<uint8_t>() : nullptr;
  quantize_chan_blocks(a, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return download<uint8_t>(d_out, block * n_units);
}

void expect_same_bytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, int width,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const size_t block = static_cast<size_t>(19) * width;
  int n_diff = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    if (++n_diff <= 8) {
      const size_t in = i % block;
      const size_t c = in < 2u * width ? in / 2 : in < 3u * width ? in - 2u * width : (in - 3u * width) / 16;
      const char* field = in < 2u * width ? "z" : in < 3u * width ? "d" : "q";
      ADD_FAILURE() << what << ": unit " << i / block << " channel " << c << " (kind " << c % 12 << ") " << field
                    << " byte 0x" << std::hex << int{got[i]} << ", the CPU's 0x" << int{want[i]};
    }
  }
  EXPECT_EQ(n_diff, 0) << what;
}

TEST(CudaKvChan, EncoderIsTheCpusFromF32Rows) {
  RILL_REQUIRE_GPU();
  for (const int width : {32, 96, 1024}) {
    const int n_units = 6;
    const std::vector<float> rows = make_rows(n_units, width, 100 + static_cast<uint32_t>(width));
    std::vector<uint8_t> starts(n_units);
    for (int u = 0; u < n_units; ++u) starts[static_cast<size_t>(u)] = u % 2 == 0;
    const size_t block = static_cast<size_t>(19) * width;
    std::vector<uint8_t> want(block * n_units);
    for (int u = 0; u < n_units; ++u) {
      cpu::quantize_chan_block(rows.data() + static_cast<size_t>(u) * kT * width, width, width,
                               want.data() + static_cast<size_t>(u) * block, starts[static_cast<size_t>(u)] != 0);
    }
    std::vector<uint8_t> raw(rows.size() * 4);
    std::memcpy(raw.data(), rows.data(), raw.size());
    const auto got = encode_on_device(raw, static_cast<size_t>(width) * 4, DType::kF32, n_units, width, starts);
    expect_same_bytes(got, want, width, "f32 rows, width " + std::to_string(width));
  }
}

TEST(CudaKvChan, EncoderIsTheCpusFromQ8Rows) {
  RILL_REQUIRE_GPU();
  for (const int width : {64, 1024}) {
    const int n_units = 5;
    std::vector<float> rows = make_rows(n_units, width, 300 + static_cast<uint32_t>(width));
    for (float& v : rows) v = std::isfinite(v) && std::fabs(v) < 1e4f ? v : 0.5f;  // q8_0 of finite rows
    const size_t row_bytes = rill::row_bytes(cpu::kKvChanTailType, width);
    std::vector<uint8_t> q8(row_bytes * n_units * kT);
    std::vector<float> decoded(rows.size());
    for (size_t r = 0; r < static_cast<size_t>(n_units) * kT; ++r) {
      cpu::ref::quantize_kv_row(cpu::kKvChanTailType, rows.data() + r * width, q8.data() + r * row_bytes, width);
      cpu::ref::dequantize_row(cpu::kKvChanTailType, q8.data() + r * row_bytes, decoded.data() + r * width, width);
    }
    std::vector<uint8_t> starts(n_units, 0);
    starts[0] = 1;
    const size_t block = static_cast<size_t>(19) * width;
    std::vector<uint8_t> want(block * n_units);
    for (int u = 0; u < n_units; ++u) {
      cpu::quantize_chan_block(decoded.data() + static_cast<size_t>(u) * kT * width, width, width,
                               want.data() + static_cast<size_t>(u) * block, starts[static_cast<size_t>(u)] != 0);
    }
    const auto got = encode_on_device(q8, row_bytes, DType::kQ8_0, n_units, width, starts);
    expect_same_bytes(got, want, width, "q8_0 rows, width " + std::to_string(width));
  }
}

// RopeKvArgs of a step of n_tok tokens over device rows: qkv's rows hold
// n_head q heads, then n_head_kv K and V heads of hd; RoPE over all of hd.
RopeKvArgs step_args(const float* qkv, int32_t n_tok, int32_t n_head, int32_t n_head_kv, int32_t hd, const int32_t* pos,
                     const int32_t* slots, const float* inv_freq) {
  RopeKvArgs a;
  a.qkv = const_cast<float*>(qkv);
  a.n_tokens = n_tok;
  a.qkv_stride = int64_t{n_head + 2 * n_head_kv} * hd;
  a.n_head = n_head;
  a.n_head_kv = n_head_kv;
  a.head_dim = hd;
  a.positions = pos;
  a.slots = slots;
  a.inv_freq = inv_freq;
  a.rot_dim = hd;
  return a;
}

// k4c's tail rows from the RoPE kernel (RopeKvArgs::k_rows / v_rows, the
// iq4_nlh64 V pool beside them): K's q8_0 row unrotated, V's rotated, each
// cpu::store_chan_tail_rows' bytes, and V's pool row cpu::store_kv_row's
// iq4_nlh64 bytes, for heads of 64 and 128 (two and four KV heads). The
// RoPE table turns no pair (every angle 0), so K reaches the store as the
// given floats; K head 0 has an outlier channel, some tokens' V head 1 is
// zero. The K pool is not written (k_cache: poisoned, checked unchanged).
TEST(CudaKvChan, TailRowsAreTheCpus) {
  RILL_REQUIRE_GPU();
  for (const int32_t hd : {64, 128}) {
    const int32_t n_head = 4, n_head_kv = hd == 64 ? 4 : 2, n_tok = 7;
    const int64_t Q = int64_t{n_head} * hd, KV = int64_t{n_head_kv} * hd, QKV = Q + 2 * KV;
    std::vector<float> qkv = random_floats(static_cast<size_t>(n_tok * QKV), 71 + static_cast<uint32_t>(hd), -2, 2);
    for (int32_t t = 0; t < n_tok; ++t) {
      qkv[static_cast<size_t>(t * QKV + Q + 3)] = 40.0f;
      if (t % 3 == 1) {
        for (int64_t d = 0; d < hd; ++d) qkv[static_cast<size_t>(t * QKV + Q + KV + hd + d)] = 0.0f;
      }
    }
    std::vector<int32_t> pos(static_cast<size_t>(n_tok)), slots(static_cast<size_t>(n_tok));
    for (int32_t t = 0; t < n_tok; ++t) {
      pos[static_cast<size_t>(t)] = 100 + t;
      slots[static_cast<size_t>(t)] = (5 * t + 3) % 11;
    }
    const size_t tail_row = row_bytes(cpu::kKvChanTailType, KV), pool_row = row_bytes(kKvIq4Nl64, KV);
    std::vector<uint8_t> want_k(tail_row * n_tok), want_v(tail_row * n_tok), want_pool(pool_row * 11, 0x5A);
    for (int32_t t = 0; t < n_tok; ++t) {
      const float* k = qkv.data() + t * QKV + Q;
      cpu::store_chan_tail_rows(k, k + KV, /*v_rotated=*/true, n_head_kv, hd, want_k.data() + t * tail_row,
                                want_v.data() + t * tail_row);
      cpu::store_kv_row(kKvIq4Nl64, true, k + KV, want_pool.data() + slots[static_cast<size_t>(t)] * pool_row,
                        n_head_kv, hd);
    }
    auto d_qkv = upload(qkv);
    auto d_pos = upload(pos), d_slots = upload(slots);
    auto d_inv = upload(std::vector<float>(static_cast<size_t>(hd / 2), 0.0f));
    auto d_k_pool = upload(std::vector<uint8_t>(64, 0xC3)),
         d_v_pool = upload(std::vector<uint8_t>(want_pool.size(), 0x5A));
    auto d_k_rows = upload(std::vector<uint8_t>(want_k.size(), 0)),
         d_v_rows = upload(std::vector<uint8_t>(want_v.size(), 0));
    RopeKvArgs a = step_args(d_qkv.as<float>(), n_tok, n_head, n_head_kv, hd, d_pos.as<int32_t>(),
                             d_slots.as<int32_t>(), d_inv.as<float>());
    a.k_cache = d_k_pool.data();
    a.v_cache = d_v_pool.data();
    a.kv_dtype = kKvIq4Nl64;
    a.k_rotated = false;
    a.v_rotated = true;
    a.k_rows = d_k_rows.data();
    a.v_rows = d_v_rows.data();
    rope_store_kv(a, nullptr);
    const std::string what = "head_dim " + std::to_string(hd);
    EXPECT_EQ(download<uint8_t>(d_k_rows, want_k.size()), want_k) << what << ": K tail rows";
    EXPECT_EQ(download<uint8_t>(d_v_rows, want_v.size()), want_v) << what << ": V tail rows (rotated)";
    EXPECT_EQ(download<uint8_t>(d_v_pool, want_pool.size()), want_pool) << what << ": V pool rows (iq4_nlh64)";
    EXPECT_EQ(download<uint8_t>(d_k_pool, 64), std::vector<uint8_t>(64, 0xC3)) << what << ": the K pool is not written";
  }
}

// The kernel's per-channel encoder built for the host (no GPU needed):
// every channel of the same edge rows, as a first block and not, is the
// CPU's bytes. (The device run above holds the device build to them.)
TEST(CudaKvChan, HostRunOfTheEncoderIsTheCpus) {
  for (const int width : {32, 96, 1024}) {
    const int n_units = 6;
    const std::vector<float> rows = make_rows(n_units, width, 100 + static_cast<uint32_t>(width));
    const size_t block = static_cast<size_t>(19) * width;
    for (int u = 0; u < n_units; ++u) {
      for (const bool start : {false, true}) {
        std::vector<uint8_t> want(block), got(block, 0xAB);
        const float* r = rows.data() + static_cast<size_t>(u) * kT * width;
        cpu::quantize_chan_block(r, width, width, want.data(), start);
        detail::quantize_chan_block_host(r, width, width, got.data(), start);
        expect_same_bytes(got, want, width,
                          "host run, width " + std::to_string(width) + " unit " + std::to_string(u) +
                              (start ? " (first block)" : ""));
      }
    }
  }
}

// q4a widths for a row of `width` channels: every width 0..8 among them
// (channel c at c % 9 in the first 18 channels), the rest drawn; `sum4`:
// allocate_channel_bits' total (4 a channel: q4c's bytes), else any sum.
std::vector<uint8_t> alloc_widths(int width, uint32_t seed, bool sum4) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> w(static_cast<size_t>(width));
  for (int c = 0; c < width; ++c) w[static_cast<size_t>(c)] = static_cast<uint8_t>(c < 18 ? c % 9 : rng() % 9);
  if (sum4) {  // move bits from wide to narrow channels until the sum is 4 a channel
    int64_t sum = 0;
    for (uint8_t b : w) sum += b;
    for (size_t c = 18; sum != 4 * int64_t{width}; c = c + 1 < w.size() ? c + 1 : 18) {
      if (sum > 4 * int64_t{width} && w[c] > 0) --w[c], --sum;
      if (sum < 4 * int64_t{width} && w[c] < 8) ++w[c], ++sum;
    }
  }
  return w;
}

void expect_same_alloc_bytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                             const std::vector<uint8_t>& widths, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const auto width = static_cast<int64_t>(widths.size());
  const auto block = static_cast<size_t>(cpu::alloc_block_bytes(widths.data(), width));
  int n_diff = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    if (++n_diff <= 8) {
      const auto in = static_cast<int64_t>(i % block);
      int64_t c = in < 2 * width ? in / 2 : in - 2 * width;
      if (in >= 3 * width) {
        for (c = 0; c + 1 < width && cpu::alloc_plane_offset(widths.data(), width, c + 1) <= in;) ++c;
      }
      const char* field = in < 2 * width ? "z" : in < 3 * width ? "d" : "plane";
      ADD_FAILURE() << what << ": unit " << i / block << " channel " << c << " (kind " << c % 12 << ", "
                    << int{widths[static_cast<size_t>(c)]} << " bits) " << field << " byte 0x" << std::hex
                    << int{got[i]} << ", the CPU's 0x" << int{want[i]};
    }
  }
  EXPECT_EQ(n_diff, 0) << what;
}

// q4a's encoder (every width 0..8) from f32 rows on the device: the CPU's
// quantize_alloc_block bytes, first blocks and not, for widths summing to
// 4 a channel (what calibration gives) and not.
TEST(CudaKvChan, AllocEncoderIsTheCpusFromF32Rows) {
  RILL_REQUIRE_GPU();
  for (const int width : {32, 96, 1024}) {
    for (const bool sum4 : {true, false}) {
      const int n_units = 6;
      const std::vector<float> rows = make_rows(n_units, width, 500 + static_cast<uint32_t>(width));
      const std::vector<uint8_t> widths = alloc_widths(width, 7 + static_cast<uint32_t>(width), sum4);
      std::vector<uint8_t> starts(n_units);
      for (int u = 0; u < n_units; ++u) starts[static_cast<size_t>(u)] = u % 2 == 0;
      const auto block = static_cast<size_t>(cpu::alloc_block_bytes(widths.data(), width));
      std::vector<uint8_t> want(block * n_units);
      for (int u = 0; u < n_units; ++u) {
        cpu::quantize_alloc_block(rows.data() + static_cast<size_t>(u) * kT * width, width, width, widths.data(),
                                  want.data() + static_cast<size_t>(u) * block, starts[static_cast<size_t>(u)] != 0);
      }
      std::vector<uint8_t> raw(rows.size() * 4);
      std::memcpy(raw.data(), rows.data(), raw.size());
      const auto got =
          encode_on_device(raw, static_cast<size_t>(width) * 4, DType::kF32, n_units, width, starts, &widths);
      expect_same_alloc_bytes(got, want, widths,
                              "q4a, f32 rows, width " + std::to_string(width) + (sum4 ? "" : ", any sum"));
    }
  }
}

// From q8_0 rows (the tails'), as the CUDA backend encodes q4a's blocks.
TEST(CudaKvChan, AllocEncoderIsTheCpusFromQ8Rows) {
  RILL_REQUIRE_GPU();
  for (const int width : {64, 1024}) {
    const int n_units = 5;
    std::vector<float> rows = make_rows(n_units, width, 700 + static_cast<uint32_t>(width));
    for (float& v : rows) v = std::isfinite(v) && std::fabs(v) < 1e4f ? v : 0.5f;
    const size_t row_bytes = rill::row_bytes(cpu::kKvChanTailType, width);
    std::vector<uint8_t> q8(row_bytes * n_units * kT);
    std::vector<float> decoded(rows.size());
    for (size_t r = 0; r < static_cast<size_t>(n_units) * kT; ++r) {
      cpu::ref::quantize_kv_row(cpu::kKvChanTailType, rows.data() + r * width, q8.data() + r * row_bytes, width);
      cpu::ref::dequantize_row(cpu::kKvChanTailType, q8.data() + r * row_bytes, decoded.data() + r * width, width);
    }
    const std::vector<uint8_t> widths = alloc_widths(width, 11, true);
    std::vector<uint8_t> starts(n_units, 0);
    starts[0] = 1;
    const auto block = static_cast<size_t>(cpu::alloc_block_bytes(widths.data(), width));
    std::vector<uint8_t> want(block * n_units);
    for (int u = 0; u < n_units; ++u) {
      cpu::quantize_alloc_block(decoded.data() + static_cast<size_t>(u) * kT * width, width, width, widths.data(),
                                want.data() + static_cast<size_t>(u) * block, starts[static_cast<size_t>(u)] != 0);
    }
    const auto got = encode_on_device(q8, row_bytes, DType::kQ8_0, n_units, width, starts, &widths);
    expect_same_alloc_bytes(got, want, widths, "q4a, q8_0 rows, width " + std::to_string(width));
  }
}

// q4a's encoder built for the host (no GPU needed): the CPU's bytes on the
// same edge rows at every width 0..8, first blocks and not; and the widths
// table's plane offsets are cpu::alloc_plane_offset's.
TEST(CudaKvChan, HostRunOfTheAllocEncoderIsTheCpus) {
  for (const int width : {32, 96, 1024}) {
    for (const bool sum4 : {true, false}) {
      const int n_units = 6;
      const std::vector<float> rows = make_rows(n_units, width, 500 + static_cast<uint32_t>(width));
      const std::vector<uint8_t> widths = alloc_widths(width, 7 + static_cast<uint32_t>(width), sum4);
      std::vector<uint8_t> table(alloc_table_bytes(width));
      fill_alloc_table(widths.data(), width, table.data());
      EXPECT_TRUE(std::equal(widths.begin(), widths.end(), table.begin()));
      for (int c = 0; c < width; ++c) {
        ASSERT_EQ(alloc_plane_offsets(table.data(), width)[c], cpu::alloc_plane_offset(widths.data(), width, c)) << c;
      }
      const auto block = static_cast<size_t>(cpu::alloc_block_bytes(widths.data(), width));
      for (int u = 0; u < n_units; ++u) {
        for (const bool start : {false, true}) {
          std::vector<uint8_t> want(block), got(block, 0xAB);
          const float* r = rows.data() + static_cast<size_t>(u) * kT * width;
          cpu::quantize_alloc_block(r, width, width, widths.data(), want.data(), start);
          detail::quantize_alloc_block_host(r, width, width, widths.data(), got.data(), start);
          expect_same_alloc_bytes(got, want, widths,
                                  "q4a host run, width " + std::to_string(width) + " unit " + std::to_string(u) +
                                      (sum4 ? "" : ", any sum") + (start ? " (first block)" : ""));
        }
      }
    }
  }
}

// Device time of one layer's RoPE + KV store (rope_store_kv) at the random
// Llama-3.1-8B's shape (32 / 8 heads of 128), a token and 64, for f16 and
// the stores k4c is built from: where a k4c decode step's extra store time
// goes (docs/perf.md). Prints only; asserts that each store ran.
TEST(CudaKvChan, DeviceTimingOfTheStore) {
  RILL_REQUIRE_GPU();
  const int32_t n_head = 32, n_head_kv = 8, hd = 128;
  const int64_t Q = int64_t{n_head} * hd, KV = int64_t{n_head_kv} * hd, QKV = Q + 2 * KV;
  struct Variant {
    const char* name;
    DType dtype;
    bool k_rot, v_rot, rows;
  };
  const Variant variants[] = {{"f16", DType::kF16, false, false, false},
                              {"q8_0", DType::kQ8_0, false, false, false},
                              {"q8_0h (K and V rotated)", DType::kQ8_0, true, true, false},
                              {"q8_0h64 (K and V)", kKvQ8_0x64, true, true, false},
                              {"iq4_nlh64 (K and V)", kKvIq4Nl64, true, true, false},
                              {"k4c (q8_0 rows, V iq4_nlh64)", kKvIq4Nl64, false, true, true}};
  for (const int32_t n_tok : {1, 64}) {
    std::vector<float> qkv = random_floats(static_cast<size_t>(n_tok * QKV), 5, -2, 2);
    std::vector<int32_t> pos(static_cast<size_t>(n_tok)), slots(static_cast<size_t>(n_tok));
    for (int32_t t = 0; t < n_tok; ++t) {
      pos[static_cast<size_t>(t)] = 1024 + t;
      slots[static_cast<size_t>(t)] = t;
    }
    std::vector<float> inv(static_cast<size_t>(hd / 2));
    for (size_t i = 0; i < inv.size(); ++i) inv[i] = std::pow(500000.0f, -2.0f * static_cast<float>(i) / hd);
    auto d_qkv = upload(qkv);
    auto d_pos = upload(pos), d_slots = upload(slots), d_inv = upload(inv);
    const size_t pool = static_cast<size_t>(n_tok) * static_cast<size_t>(KV) * 2;
    auto d_k = upload(std::vector<uint8_t>(pool, 0)), d_v = upload(std::vector<uint8_t>(pool, 0));
    auto d_k_rows = upload(std::vector<uint8_t>(pool, 0)), d_v_rows = upload(std::vector<uint8_t>(pool, 0));
    cudaEvent_t e0, e1;
    RILL_CUDA_CHECK(cudaEventCreate(&e0));
    RILL_CUDA_CHECK(cudaEventCreate(&e1));
    for (const Variant& v : variants) {
      RopeKvArgs a = step_args(d_qkv.as<float>(), n_tok, n_head, n_head_kv, hd, d_pos.as<int32_t>(),
                               d_slots.as<int32_t>(), d_inv.as<float>());
      a.k_cache = d_k.data();
      a.v_cache = d_v.data();
      a.kv_dtype = v.dtype;
      a.k_rotated = v.k_rot;
      a.v_rotated = v.v_rot;
      a.k_rows = v.rows ? d_k_rows.data() : nullptr;
      a.v_rows = v.rows ? d_v_rows.data() : nullptr;
      RILL_CUDA_CHECK(cudaMemset(d_v.data(), 0, pool));
      rope_store_kv(a, nullptr);  // warm up
      RILL_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<uint8_t> v_pool = download<uint8_t>(d_v, pool);
      EXPECT_NE(std::count(v_pool.begin(), v_pool.end(), uint8_t{0}), static_cast<std::ptrdiff_t>(pool))
          << v.name << ": the V pool was written";
      // Back to back, the calls overlap (each lets the next start early,
      // launch_pdl): that is the store's throughput. One call at a time
      // (the median of 50, launch included) is its latency, what a
      // batch-1 decode step waits for.
      constexpr int kReps = 100;
      RILL_CUDA_CHECK(cudaEventRecord(e0, nullptr));
      for (int i = 0; i < kReps; ++i) rope_store_kv(a, nullptr);
      RILL_CUDA_CHECK(cudaEventRecord(e1, nullptr));
      RILL_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0.0f;
      RILL_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      const double alone = median_ms([&] { rope_store_kv(a, nullptr); }, 50);
      std::printf("[ kv store ] %d token(s), %s: %.1f us a call back to back, %.1f us alone\n", n_tok, v.name,
                  1000.0 * ms / kReps, 1000.0 * alone);
    }
    RILL_CUDA_CHECK(cudaEventDestroy(e0));
    RILL_CUDA_CHECK(cudaEventDestroy(e1));
  }
}
}  // namespace
}  // namespace rill::cuda
