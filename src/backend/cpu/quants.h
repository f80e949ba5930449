#pragma once
// Quantized block layouts, byte-for-byte as GGML defines them (so GGUF tensor
// data is used in place), and the scalar reference kernels over them.
//
// A row of n elements is n / block_size consecutive blocks. Values:
//   Q4_0  x = d * (q - 8),          q in 0..15   (nibbles: low = elem j, high = elem j+16)
//   Q4_1  x = d * q + m,            q in 0..15
//   Q5_0  x = d * (q - 16),         q in 0..31   (bit 4 of elem j in qh bit j)
//   Q5_1  x = d * q + m,            q in 0..31
//   Q8_0  x = d * q,                q in -127..127
//   Q8_1  x = d * q, s = d * sum(q) (activations only)
//   Q4_K  super-block of 256 = 8 sub-blocks of 32; x = d*sc[j]*q - dmin*mn[j],
//         6-bit sc/mn packed in 12 bytes (see unpack_scale_min_k4)
//   Q5_K  as Q4_K with a fifth bit per element in qh
//   Q6_K  16 sub-blocks of 16; x = d * sc[j] * (q - 32), q 6 bits (ql low 4, qh high 2)
//   Q8_K  x = d * q (d is f32), bsums[j] = sum of q over elements 16j..16j+15
//   Q2_K  16 sub-blocks of 16; x = d*(sc[j]&15)*q - dmin*(sc[j]>>4), q 2 bits
//   Q3_K  16 sub-blocks of 16; x = d*(s[j]-32)*(q-4), q = 2 low bits | hmask bit << 2,
//         6-bit s packed in 12 bytes (see q3_k_scale)
//   IQ4_NL x = d * kIq4nlValues[q], q 4 bits (nibbles as Q4_0)
//   IQ4_XS 8 sub-blocks of 32; x = d * (s[j]-32) * kIq4nlValues[q], 6-bit s
//         (low 4 bits in scales_l, high 2 in scales_h)
// In a Q2_K/Q3_K super-block, element 128h + 32k + l (l < 32) takes its low
// bits from (qs[32h + l] >> 2k) & 3 (and Q3_K its third bit from bit 4h + k
// of hmask[l]).
#include <bit>
#include <cstdint>

#include "core/dtype.h"

namespace rill::cpu {

inline constexpr int kQK = 32;    // classic quant block
inline constexpr int kQKK = 256;  // K-quant super-block

struct BlockQ4_0 {
  uint16_t d;  // f16
  uint8_t qs[kQK / 2];
};
struct BlockQ4_1 {
  uint16_t d;  // f16
  uint16_t m;  // f16
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // little-endian u32: bit j is bit 4 of element j
  uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockQ8_1 {
  uint16_t d;
  uint16_t s;  // f16 of d * sum(qs), d taken before its f16 rounding (as llama.cpp)
  int8_t qs[kQK];
};
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[kQKK / 2];  // per 64 elements: 32 bytes, low nibbles first 32, high next 32
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQKK / 8];
  uint8_t qs[kQKK / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;
};
struct BlockQ8_K {
  float d;
  int8_t qs[kQKK];
  int16_t bsums[kQKK / 16];
};

// MXFP4 (OCP microscaling): x = 2^(e - 127) * v, v an e2m1 value (0, 0.5,
// 1, 1.5, 2, 3, 4, 6 and their negatives); stored as llama.cpp does, the
// values doubled (kMxfp4Values) and the scale halved
// (e8m0_to_f32_half). Nibbles: low = element j, high = element j + 16.
struct BlockMXFP4 {
  uint8_t e;  // e8m0 exponent
  uint8_t qs[kQK / 2];
};
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
// 2^(e - 128) as f32 (subnormal for e < 2), ggml's GGML_E8M0_TO_FP32_HALF.
inline float e8m0_to_f32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? uint32_t{0x00200000} << e : static_cast<uint32_t>(e - 1) << 23;
  return std::bit_cast<float>(bits);
}

static_assert(sizeof(BlockMXFP4) == 17);
struct BlockQ2_K {
  uint8_t scales[kQKK / 16];  // low nibble: scale, high nibble: min
  uint8_t qs[kQKK / 4];
  uint16_t d;
  uint16_t dmin;
};
struct BlockQ3_K {
  uint8_t hmask[kQKK / 8];
  uint8_t qs[kQKK / 4];
  uint8_t scales[12];
  uint16_t d;
};
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;            // 2 high bits of sub-block j's scale at bits 2j, 2j+1
  uint8_t scales_l[kQKK / 64];  // low 4 bits: sub-block 2i in the low nibble of byte i
  uint8_t qs[kQKK / 2];         // per sub-block 16 bytes, nibbles as Q4_0
};

// The 16 values of the IQ4_NL / IQ4_XS codes (GGML's kvalues_iq4nl).
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136);

// The 6-bit scale s (0..63, before the -32) of sub-block j (0..15) of a Q3_K
// super-block: low 4 bits from the nibbles of bytes 0..7, high 2 bits from bytes 8..11.
inline int q3_k_scale(int j, const uint8_t* scales) {
  const int low = j < 8 ? (scales[j] & 0xF) : (scales[j - 8] >> 4);
  const int high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return low | (high << 4);
}

// The 6-bit scale (0..63, before the -32) of sub-block j (0..7) of an IQ4_XS block.
inline int iq4_xs_scale(int j, const BlockIQ4_XS& b) {
  return ((b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b.scales_h >> (2 * j)) & 3) << 4);
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block.
inline void unpack_scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// The activation type a weight type's dot product pairs with: Q8_0 for
// Q4_0/Q5_0/Q8_0/MXFP4/IQ4_NL, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants
// and IQ4_XS, F32 for float weights (llama.cpp's vec_dot_type pairs).
DType vec_dot_partner(DType w);

namespace ref {

// Dequantizes n elements (a multiple of the block size). F32/F16/BF16 too.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Activation quantizers (n a multiple of the block size). They follow what
// llama.cpp runs on x86: Q8_0/Q8_1 take d = amax/127 and q = round-half-even
// (x * (127/amax)) like its AVX2 quantizers; Q8_K is quantize_row_q8_K_ref
// (signed max, iscale = -127/max, q = min(127, nearest_int(iscale*x)), d = 1/iscale).
void quantize_row_q8_0(const float* x, void* y, int64_t n);
void quantize_row_q8_1(const float* x, void* y, int64_t n);
void quantize_row_q8_k(const float* x, void* y, int64_t n);
// Dispatches on the partner type (F32: plain copy).
void quantize_row(DType partner, const float* x, void* y, int64_t n);

// Dot product of one weight row (type w) with one activation row of
// vec_dot_partner(w), n elements. Integer sums per block, scaled in f32 per
// block as llama.cpp's reference does. F16/BF16 weights are widened to f32.
float vec_dot(DType w, int64_t n, const void* wrow, const void* arow);

}  // namespace ref
}  // namespace rill::cpu
