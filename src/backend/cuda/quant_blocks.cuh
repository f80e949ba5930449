#pragma once
// Device decoders of the GGUF block types (layouts: backend/cpu/quants.h).
// Values match cpu::ref::dequantize_row bit for bit: each product and sum
// is rounded on its own (__fmul_rn / __fadd_rn), never fused, as the
// reference (built for baseline x86-64, no FMA) computes them.
//
// A block of kElems elements is read as kItems = kElems / 8 items. Item k
// gives 8 values: 4 at block columns col0(k) .. col0(k) + 3 and 4 at
// col1(k) .. col1(k) + 3. An item is 4 (Q8_0: 8) contiguous quant bytes, so
// the lanes of a warp that take consecutive items read a block's bytes side
// by side; it is the unit of work of the GEMV (a lane) and of the
// dequantize kernel (a thread).
//
// decode_run(b, j, w) gives the 8 contiguous elements 8 j .. 8 j + 7 of a
// block instead (j < kElems / 8), with the same products and sums as
// decode, so the same bits; b may point into shared memory (plain loads),
// 2-byte aligned at least but for MXFP4 (tile copies of the block bytes in
// dequant.cu keep each block at its offset from a 16-byte aligned base).
//
// Blocks are 2-byte aligned at least (Q4_0 18 bytes, Q5_0 22, Q8_0 34,
// Q6_K 210), 4-byte for Q4_1/Q5_1, 16-byte for Q4_K/Q5_K, MXFP4 (17
// bytes) 1-byte: loads are sized to that (matrix bases are 256-byte aligned, rows are whole blocks).
#include <cuda_fp16.h>

#include <cstdint>

#include "core/dtype.h"

namespace rill::cuda::quant {

__device__ __forceinline__ float ld_f16(const uint8_t* p) {
  return __half2float(__ushort_as_half(__ldg(reinterpret_cast<const unsigned short*>(p))));
}
// 4 bytes at a 2-byte aligned address, little endian.
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t* p) {
  const auto* h = reinterpret_cast<const unsigned short*>(p);
  return static_cast<uint32_t>(__ldg(h)) | (static_cast<uint32_t>(__ldg(h + 1)) << 16);
}
__device__ __forceinline__ uint32_t ld_u32_a4(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned int*>(p));
}
// Plain (generic-pointer) loads for decode_run: p 2-byte aligned (a2) or
// 4-byte aligned (a4).
__device__ __forceinline__ float f16_at(const uint8_t* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
}
__device__ __forceinline__ uint32_t u32_at_a2(const uint8_t* p) {
  const auto* h = reinterpret_cast<const unsigned short*>(p);
  return static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16);
}
__device__ __forceinline__ uint32_t u32_at_a4(const uint8_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
// q + off as a float, exactly, for 0 <= q < 2^22 and off a small constant,
// without an integer-to-float conversion (those issue at 16 a clock per SM,
// which bound decode_run): q in the low mantissa bits of 2^23, then 2^23 -
// off subtracted (both exact). byte_f: byte i (a constant) of w, likewise.
__device__ __forceinline__ float small_f(uint32_t q, int off) {
  return __fadd_rn(__uint_as_float(0x4B000000u | q), static_cast<float>(off) - 8388608.0f);
}
__device__ __forceinline__ float byte_f(uint32_t w, int i, int off) {
  return __fadd_rn(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u | static_cast<unsigned>(i))),
                   static_cast<float>(off) - 8388608.0f);
}
// Bits 0..3 of x at bit 4 of bytes 0..3 (the fifth bit of 4 elements).
__device__ __forceinline__ uint32_t spread4(uint32_t x) {
  return (((x & 0xFu) * 0x00204081u) & 0x01010101u) << 4;
}
__device__ __forceinline__ int byte_at(uint32_t w, int i) {
  return static_cast<int>((w >> (8 * i)) & 0xffu);
}
__device__ __forceinline__ float mul(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ float add(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ float sub(float a, float b) {
  return __fsub_rn(a, b);
}

// x = d * (q - 8); byte j of qs: element j (low nibble), j + 16 (high).
struct Q4_0 {
  static constexpr int kElems = 32, kBytes = 18, kItems = 4;
  __device__ static int col0(int k) { return 4 * k; }
  __device__ static int col1(int k) { return 16 + 4 * k; }
  __device__ static void decode(const uint8_t* b, int k, float* w) {
    const float d = ld_f16(b);
    const uint32_t q = ld_u32_a2(b + 2 + 4 * k);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[i] = mul(static_cast<float>((byte_at(q, i) & 0xF) - 8), d);
      w[4 + i] = mul(static_cast<float>((byte_at(q, i) >> 4) - 8), d);
    }
  }
  // Elements 8j .. 8j + 7: bytes (8j) & 15 .., low nibbles for j < 2.
  __device__ static void decode_run(const uint8_t* b, int j, float* w) {
    const float d = f16_at(b);
    const int sh = j < 2 ? 0 : 4, o = 2 + 8 * (j & 1);
    const uint32_t n[2] = {(u32_at_a2(b + o) >> sh) & 0x0F0F0F0Fu, (u32_at_a2(b + o + 4) >> sh) & 0x0F0F0F0Fu};
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = mul(byte_f(n[i >> 2], i & 3, -8), d);
  }
};

// x = d * q + m.
struct Q4_1 {
  static constexpr int kElems = 32, kBytes = 20, kItems = 4;
  __device__ static int col0(int k) { return 4 * k; }
  __device__ static int col1(int k) { return 16 + 4 * k; }
  __device__ static void decode(const uint8_t* b, int k, float* w) {
    const float d = ld_f16(b), m = ld_f16(b + 2);
    const uint32_t q = ld_u32_a4(b + 4 + 4 * k);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[i] = add(mul(static_cast<float>(byte_at(q, i) & 0xF), d), m);
      w[4 + i] = add(mul(static_cast<float>(byte_at(q, i) >> 4), d), m);
    }
  }
  __device__ static void decode_run(const uint8_t* b, int j, float* w) {
    const float d = f16_at(b), m = f16_at(b + 2);
    const int sh = j < 2 ? 0 : 4, o = 4 + 8 * (j & 1);
    const uint32_t n[2] = {(u32_at_a4(b + o) >> sh) & 0x0F0F0F0Fu, (u32_at_a4(b + o + 4) >> sh) & 0x0F0F0F0Fu};
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = add(mul(byte_f(n[i >> 2], i & 3, 0), d), m);
  }
};

// x = d * (q - 16), bit 4 of element j in bit j of qh.
struct Q5_0 {
  static constexpr int kElems = 32, kBytes = 22, kItems = 4;
  __device__ static int col0(int k) { return 4 * k; }
  __device__ static int col1(int k) { return 16 + 4 * k; }
  __device__ static void decode(const uint8_t* b, int k, float* w) {
    const float d = ld_f16(b);
    const uint32_t qh = ld_u32_a2(b + 2);
    const uint32_t q = ld_u32_a2(b + 6 + 4 * k);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int j = 4 * k + i;
      const int lo = (byte_at(q, i) & 0xF) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (byte_at(q, i) >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      w[i] = mul(static_cast<float>(lo - 16), d);
      w[4 + i] = mul(static_cast<float>(hi - 16), d);
    }
  }
  // Element e's fifth bit: bit e of qh.
  __device__ static void decode_run(const uint8_t* b, int j, float* w) {
    const float d = f16_at(b);
    const uint32_t qh = u32_at_a2(b + 2) >> (8 * j);
    const int sh = j < 2 ? 0 : 4, o = 6 + 8 * (j & 1);
    const uint32_t n[2] = {((u32_at_a2(b + o) >> sh) & 0x0F0F0F0Fu) | spread4(qh),
                           ((u32_at_a2(b + o + 4) >> sh) & 0x0F0F0F0Fu) | spread4(qh >> 4)};
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = mul(byte_f(n[i >> 2], i & 3, -16), d);
  }
};

// x = d * q + m, q 5 bits as Q5_0.
struct Q5_1 {
  static constexpr int kElems = 32, kBytes = 24, kItems = 4;
  __device__ static int col0(int k) { return 4 * k; }
  __device__ static int col1(int k) { return 16 + 4 * k; }
  __device__ static void decode(const uint8_t* b, int k, float* w) {
    const float d = ld_f16(b), m = ld_f16(b + 2);
    const uint32_t qh = ld_u32_a4(b + 4);
    const uint32_t q = ld_u32_a4(b + 8 + 4 * k);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int j = 4 * k + i;
      const int lo = (byte_at(q, i) & 0xF) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (byte_at(q, i) >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      w[i] = add(mul(static_cast<float>(lo), d), m);
      w[4 + i] = add(mul(static_cast<float>(hi), d), m);
    }
  }
  __device__ static void decode_run(const uint8_t* b, int j, float* w) {
    const float d = f16_at(b), m = f16_at(b + 2);
    const uint32_t qh = u32_at_a4(b + 4) >> (8 * j);
    const int sh = j < 2 ? 0 : 4, o = 8 + 8 * (j & 1);
    const uint32_t n[2] = {((u32_at_a4(b + o) >> sh) & 0x0F0F0F0Fu) | spread4(qh),
                           ((u32_at_a4(b + o + 4) >> sh) & 0x0F0F0F0Fu) | spread4(qh >> 4)};
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = add(mul(byte_f(n[i >> 2], i & 3, 0), d), m);
  }
};

// x = d * q, q int8; item k: elements 8k .. 8k + 7.
struct Q8_0 {
  static constexpr int kElems = 32, kBytes = 34, kItems = 4;
  __device__ static int col0(int k) { return 8 * k; }
  __device__ static int col1(int k) { return 8 * k + 4; }
  __device__ static void decode(const uint8_t* b, int k, float* w) {
    const float d = ld_f16(b);
    const uint32_t q0 = ld_u32_a2(b + 2 + 8 * k), q1 = ld_u32_a2(b + 6 + 8 * k);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[i] = mul(static_cast<float>(static_cast<int8_t>(byte_at(q0, i))), d);
      w[4 + i] = mul(static_cast<float>(static_cast<int8_t>(byte_at(q1, i))), d);
    }
  }
  // int8 q: q + 128 is its byte with the top bit flipped.
  __device__ static void decode_run(const uint8_t* b, int j, float* w) {
    const float d = f16_at(b);
    const uint32_t q[2] = {u32_at_a2(b + 2 + 8 * j) ^ 0x80808080u, u32_at_a2(b + 6 + 8 * j) ^ 0x80808080u};
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = mul(byte_f(q[i >> 2], i & 3, -128), d);
  }
};

// The 6-bit scale and min of sub-block j (0..7) from the 12 scale bytes
// (as cpu::unpack_scale_min_k4); s: those bytes as three little-endian words.
__device__ __forceinline__ void scale_min_k4(int j, const uint32_t* s, int* sc, int* mn) {
  auto sb = [&](int i) { return byte_at(s[i >> 2], i & 3); };
  if (j < 4) {
    *sc = sb(j) & 63;
    *mn = sb(j + 4) & 63;
  } else {
    *sc = (sb(j + 4) & 0xF) | ((sb(j - 4) >> 6) << 4);
    *mn = (sb(j + 4) >> 4) | ((sb(j) >> 6) << 4);
  }
}

// Q4_K (kHigh = false) and Q5_K: 256 elements in 4 groups of 64; group g's
// 32 qs bytes hold sub-block 2g in low nibbles (elements 64g + l) and 2g + 1
// in high ones (64g + 32 + l); x = d * sc * q - dmin * mn. Q5_K's fifth bit
// of element 64g + l is bit 2g of qh[l], of 64g + 32 + l bit 2g + 1.
template <bool kFive>
struct QK4 {
  static constexpr int kElems = 256, kBytes = kFive ? 176 : 144, kItems = 32;
  static constexpr int kQs = kFive ? 48 : 16;
  __device__ static int col0(int k) { return 64 * (k >> 3) + 4 * (k & 7); }
  __device__ static int col1(int k) { return col0(k) + 32; }
  __device__ static void decode(const uint8_t* b, int k, float* w) {
    const float d = ld_f16(b), dmin = ld_f16(b + 2);
    const uint32_t s[3] = {ld_u32_a4(b + 4), ld_u32_a4(b + 8), ld_u32_a4(b + 12)};
    const int g = k >> 3, l0 = 4 * (k & 7);
    int sc, mn;
    scale_min_k4(2 * g, s, &sc, &mn);
    const float d1 = mul(d, static_cast<float>(sc)), m1 = mul(dmin, static_cast<float>(mn));
    scale_min_k4(2 * g + 1, s, &sc, &mn);
    const float d2 = mul(d, static_cast<float>(sc)), m2 = mul(dmin, static_cast<float>(mn));
    const uint32_t q = ld_u32_a4(b + kQs + 32 * g + l0);
    const uint32_t qh = kFive ? ld_u32_a4(b + 16 + l0) : 0u;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int lo = byte_at(q, i) & 0xF, hi = byte_at(q, i) >> 4;
      if (kFive) {
        lo += ((byte_at(qh, i) >> (2 * g)) & 1) << 4;
        hi += ((byte_at(qh, i) >> (2 * g + 1)) & 1) << 4;
      }
      w[i] = sub(mul(d1, static_cast<float>(lo)), m1);
      w[4 + i] = sub(mul(d2, static_cast<float>(hi)), m2);
    }
  }
  // Run j: group g = j / 8, sub-block js = 2g + hi (hi = bit 2 of j: high
  // nibbles), l = 8 (j & 3) ..; js's scale and min read as bytes (as
  // scale_min_k4).
  __device__ static void decode_run(const uint8_t* b, int j, float* w) {
    const float d = f16_at(b), dmin = f16_at(b + 2);
    const int g = j >> 3, hi = (j >> 2) & 1, l0 = 8 * (j & 3), js = 2 * g + hi;
    const uint8_t* sm = b + 4;
    uint32_t sc, mn;
    if (js < 4) {
      sc = sm[js] & 63u;
      mn = sm[js + 4] & 63u;
    } else {
      sc = (sm[js + 4] & 0xFu) | ((sm[js - 4] >> 6) << 4);
      mn = (sm[js + 4] >> 4) | ((sm[js] >> 6) << 4);
    }
    const float ds = mul(d, small_f(sc, 0)), dm = mul(dmin, small_f(mn, 0));
    uint32_t n[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      n[k] = (u32_at_a4(b + kQs + 32 * g + l0 + 4 * k) >> (4 * hi)) & 0x0F0F0F0Fu;
      if (kFive) n[k] |= ((u32_at_a4(b + 16 + l0 + 4 * k) >> js) & 0x01010101u) << 4;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = sub(mul(ds, byte_f(n[i >> 2], i & 3, 0)), dm);
  }
};
using Q4_K = QK4<false>;
using Q5_K = QK4<true>;

// Q6_K: 256 elements in two halves of 128 (ql 64 bytes, qh 32 bytes each);
// element 128h + 32s + l (s = 0..3, l = 0..31) takes nibble (s < 2: low,
// else high) of ql[64h + 32 (s & 1) + l] and bits 2s, 2s + 1 of qh[32h + l];
// x = d * scales[e / 16] * (q - 32). Item k: half k >> 4, s = (k >> 3) & 1
// and s + 2, l = 4 (k & 7) .. + 3.
struct Q6_K {
  static constexpr int kElems = 256, kBytes = 210, kItems = 32;
  __device__ static int col0(int k) { return 128 * (k >> 4) + 32 * ((k >> 3) & 1) + 4 * (k & 7); }
  __device__ static int col1(int k) { return col0(k) + 64; }
  __device__ static void decode(const uint8_t* b, int k, float* w) {
    const int h = k >> 4, s = (k >> 3) & 1, l0 = 4 * (k & 7);
    const float d = ld_f16(b + 208);
    const uint32_t ql = ld_u32_a2(b + 64 * h + 32 * s + l0);
    const uint32_t qh = ld_u32_a2(b + 128 + 32 * h + l0);
    const int c0 = col0(k);
    const float d0 = mul(d, static_cast<float>(static_cast<int8_t>(b[192 + c0 / 16])));
    const float d1 = mul(d, static_cast<float>(static_cast<int8_t>(b[192 + (c0 + 64) / 16])));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int lo = (byte_at(ql, i) & 0xF) | (((byte_at(qh, i) >> (2 * s)) & 3) << 4);
      const int hi = (byte_at(ql, i) >> 4) | (((byte_at(qh, i) >> (2 * s + 4)) & 3) << 4);
      w[i] = mul(d0, static_cast<float>(lo - 32));
      w[4 + i] = mul(d1, static_cast<float>(hi - 32));
    }
  }
  // Run j: half h = j / 16, s = (j / 4) & 3, l = 8 (j & 3) ..; one scale
  // (int8: + 128 is its byte with the top bit flipped).
  __device__ static void decode_run(const uint8_t* b, int j, float* w) {
    const int h = j >> 4, s = (j >> 2) & 3, l0 = 8 * (j & 3);
    const float ds = mul(f16_at(b + 208), small_f(b[192 + j / 2] ^ 0x80u, -128));
    const uint8_t* ql = b + 64 * h + 32 * (s & 1) + l0;
    const uint8_t* qh = b + 128 + 32 * h + l0;
    uint32_t n[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      n[k] = ((u32_at_a2(ql + 4 * k) >> (4 * (s >> 1))) & 0x0F0F0F0Fu) |
             (((u32_at_a2(qh + 4 * k) >> (2 * s)) & 0x03030303u) << 4);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = mul(ds, byte_f(n[i >> 2], i & 3, -32));
  }
};

// MXFP4 (gpt-oss's experts): x = 2^(e - 128) * v with v an e2m1 value
// doubled (cpu::kMxfp4Values: 0, 1, 2, 3, 4, 6, 8, 12 and negatives) and
// the e8m0 byte e first (cpu::e8m0_to_f32_half); byte j of the 16 qs
// bytes: element j (low nibble), j + 16 (high). Blocks are 17 bytes: byte
// loads only.
struct MXFP4 {
  static constexpr int kElems = 32, kBytes = 17, kItems = 4;
  __device__ static int col0(int k) { return 4 * k; }
  __device__ static int col1(int k) { return 16 + 4 * k; }
  __device__ static float value(int nib) {
    const int m = nib & 7;
    const int v = m < 4 ? m : m < 6 ? 2 * m - 4 : 4 * m - 16;
    return static_cast<float>(nib & 8 ? -v : v);
  }
  __device__ static void decode(const uint8_t* b, int k, float* w) {
    const uint32_t e = __ldg(b);
    const float d = __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int q = __ldg(b + 1 + 4 * k + i);
      w[i] = mul(value(q & 0xF), d);
      w[4 + i] = mul(value(q >> 4), d);
    }
  }
  __device__ static void decode_run(const uint8_t* b, int j, float* w) {
    const uint32_t e = b[0];
    const float d = __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
    const int sh = j < 2 ? 0 : 4, o = 1 + 8 * (j & 1);
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = mul(value((b[o + i] >> sh) & 0xF), d);
  }
};

}  // namespace rill::cuda::quant

// Calls the statement list with Q the decoder of a quant_supported dtype
// (other dtypes: nothing).
#define RILL_CUDA_DISPATCH_QUANT(dtype, ...)  \
  do {                                        \
    switch (dtype) {                          \
      case ::rill::DType::kQ4_0: {            \
        using Q = ::rill::cuda::quant::Q4_0;  \
        __VA_ARGS__;                          \
      } break;                                \
      case ::rill::DType::kQ4_1: {            \
        using Q = ::rill::cuda::quant::Q4_1;  \
        __VA_ARGS__;                          \
      } break;                                \
      case ::rill::DType::kQ5_0: {            \
        using Q = ::rill::cuda::quant::Q5_0;  \
        __VA_ARGS__;                          \
      } break;                                \
      case ::rill::DType::kQ5_1: {            \
        using Q = ::rill::cuda::quant::Q5_1;  \
        __VA_ARGS__;                          \
      } break;                                \
      case ::rill::DType::kQ8_0: {            \
        using Q = ::rill::cuda::quant::Q8_0;  \
        __VA_ARGS__;                          \
      } break;                                \
      case ::rill::DType::kQ4_K: {            \
        using Q = ::rill::cuda::quant::Q4_K;  \
        __VA_ARGS__;                          \
      } break;                                \
      case ::rill::DType::kQ5_K: {            \
        using Q = ::rill::cuda::quant::Q5_K;  \
        __VA_ARGS__;                          \
      } break;                                \
      case ::rill::DType::kQ6_K: {            \
        using Q = ::rill::cuda::quant::Q6_K;  \
        __VA_ARGS__;                          \
      } break;                                \
      case ::rill::DType::kMXFP4: {           \
        using Q = ::rill::cuda::quant::MXFP4; \
        __VA_ARGS__;                          \
      } break;                                \
      default:                                \
        break;                                \
    }                                         \
  } while (0)
