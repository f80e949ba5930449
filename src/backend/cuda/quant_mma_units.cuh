#pragma once
// The int8 tensor-core matmuls' shared parts (quant_mma.cu: x fragments
// straight from global memory; quant_mmq.cu: staged through shared
// memory): where quantize_x8 puts a column, the weight decoders, the mma
// instructions and the scaling step. Both kernels run the same decoders
// and the same scaling, so a (row, token)'s result is the same bits from
// either (quant.h).
//
// Fragment layouts (PTX ISA, mma.m16n8k32 .s8): lane = 4 g + t; A regs
// a0 / a1: rows g / g + 8 at block columns 4 t .. 4 t + 3, a2 / a3: the same
// rows at 16 + 4 t ..; B regs b0 / b1: token g at columns 4 t .. and 16 +
// 4 t ..; C: rows g (c0, c1) and g + 8 (c2, c3), tokens 2 t and 2 t + 1.
#include <cuda_fp16.h>

#include <cstdint>

namespace rill::cuda::mma_units {

// The K split: a row's columns are cut into kSplit equal ranges of units,
// each summed on its own in unit order, then the ranges' sums added in
// range order (quant_mma: one warp a range).
constexpr int kSplit = 8;

// Where column c of a 32-column block sits in xq: lane t of a quad reads
// its B words (columns 4 t .. 4 t + 3 and 16 + 4 t ..) as 8 bytes at 8 t.
__device__ __forceinline__ int x8_pos(int c) {
  return 8 * ((c & 15) >> 2) + 4 * (c >> 4) + (c & 3);
}

// ------------------------------------------------------- weight fragments
// A decoder gives, for one row and one unit, lane t's A words of each of
// the unit's kBlocks 32-column blocks (q[b][0]: block columns 4 t .. 4 t + 3,
// q[b][1]: 16 + 4 t ..) as int8 x 4, and the block's scale d[b] (kMin: the
// min m[b], value = d q - m; kHalves: a scale per 16 columns, h[b][0..1],
// the value d * h * q).

// The loads (fetch<L>) are apart from the decoding (decode), fetch keeping
// the words as loaded (2-byte aligned words as their two halves). Issuing
// the next unit's loads before multiplying this one was measured on the
// H200 (RILL_CUDA_QUANT_MMA_PIPE in e46ff69): 5-25% slower at one token
// (more registers: 2 blocks per SM instead of 3), even at 8; not kept.
// Where fetch reads the blocks: global memory through the read-only path
// (quant_mma's direct loads) or shared memory (quant_mmq's staged copies),
// both at the alignment the block gives (u16: 2 bytes, u32: 4, u128: 16).
struct GlobalLoads {
  __device__ static unsigned short u16(const uint8_t* p) { return __ldg(reinterpret_cast<const unsigned short*>(p)); }
  __device__ static uint32_t u32(const uint8_t* p) { return __ldg(reinterpret_cast<const unsigned int*>(p)); }
  __device__ static uint4 u128(const uint8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
};
struct SharedLoads {
  __device__ static unsigned short u16(const uint8_t* p) { return *reinterpret_cast<const unsigned short*>(p); }
  __device__ static uint32_t u32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
  __device__ static uint4 u128(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
};
__device__ __forceinline__ int join16(unsigned short lo, unsigned short hi) {
  return static_cast<int>(static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16));
}

// Q8_0: x = d q. Unit = one block (34 bytes, 2-byte aligned).
struct MmaQ8_0 {
  static constexpr int kElems = 32, kBytes = 34, kCols = 32, kBlocks = 1, kUnroll = 4;
  static constexpr bool kMin = false, kHalves = false;
  struct Raw {
    unsigned short d, q[4];
  };
  struct Unit {
    int q[kBlocks][2];
    float d[kBlocks];
  };
  template <class L>
  __device__ static void fetch(const uint8_t* row, int u, int t, Raw& r) {
    const uint8_t* b = row + static_cast<int64_t>(u) * kBytes;
    r.d = L::u16(b);
    r.q[0] = L::u16(b + 2 + 4 * t);
    r.q[1] = L::u16(b + 4 + 4 * t);
    r.q[2] = L::u16(b + 18 + 4 * t);
    r.q[3] = L::u16(b + 20 + 4 * t);
  }
  __device__ static void decode(const Raw& r, Unit& a) {
    a.d[0] = __half2float(__ushort_as_half(r.d));
    a.q[0][0] = join16(r.q[0], r.q[1]);
    a.q[0][1] = join16(r.q[2], r.q[3]);
  }
};

// Q4_K: unit = one 144-byte super-block (16-byte aligned), 256 columns =
// blocks j = 0..7 with 6-bit scale and min each (scale_min_k4's values,
// decoded once per super-block); group g's 32 qs bytes hold block 2g in low
// nibbles, 2g + 1 in high ones; x = d sc q - dmin mn.
struct MmaQ4_K {
  static constexpr int kElems = 256, kBytes = 144, kCols = 256, kBlocks = 8, kUnroll = 1;
  static constexpr bool kMin = true, kHalves = false;
  struct Raw {
    uint4 h;
    uint32_t qw[4][2];
  };
  struct Unit {
    int q[kBlocks][2];
    float d[kBlocks], m[kBlocks];
  };
  template <class L>
  __device__ static void fetch(const uint8_t* row, int u, int t, Raw& r) {
    const uint8_t* b = row + static_cast<int64_t>(u) * kBytes;
    r.h = L::u128(b);
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      r.qw[g][0] = L::u32(b + 16 + 32 * g + 4 * t);
      r.qw[g][1] = L::u32(b + 32 + 32 * g + 4 * t);
    }
  }
  __device__ static void decode(const Raw& r, Unit& a) {
    const uint4 h = r.h;
    const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(h.x & 0xffffu)));
    const float dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(h.x >> 16)));
    // scale_min_k4 for all 8 blocks, four 6-bit values per word: bytes
    // 0-3 scales 0-3, 4-7 mins 0-3, 8-11 the low nibbles of scales / mins
    // 4-7 whose top two bits are those of bytes 0-3 / 4-7.
    const uint32_t sc_w[2] = {h.y & 0x3F3F3F3Fu, (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u)};
    const uint32_t mn_w[2] = {h.z & 0x3F3F3F3Fu, ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u)};
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
      a.d[j] = __fmul_rn(d, static_cast<float>((sc_w[j >> 2] >> (8 * (j & 3))) & 0xFFu));
      a.m[j] = __fmul_rn(dmin, static_cast<float>((mn_w[j >> 2] >> (8 * (j & 3))) & 0xFFu));
    }
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      a.q[2 * g][0] = static_cast<int>(r.qw[g][0] & 0x0F0F0F0Fu);
      a.q[2 * g][1] = static_cast<int>(r.qw[g][1] & 0x0F0F0F0Fu);
      a.q[2 * g + 1][0] = static_cast<int>((r.qw[g][0] >> 4) & 0x0F0F0F0Fu);
      a.q[2 * g + 1][1] = static_cast<int>((r.qw[g][1] >> 4) & 0x0F0F0F0Fu);
    }
  }
};

// Q6_K: unit = half h of a 210-byte super-block (2-byte aligned), 128
// columns = blocks s = 0..3: element 32 s + l of the half takes nibble
// (s < 2: low, else high) of ql[64 h + 32 (s & 1) + l] and bits 2 s, 2 s + 1
// of qh[32 h + l]; x = d * scales[16-column group] * (q - 32).
struct MmaQ6_K {
  static constexpr int kElems = 256, kBytes = 210, kCols = 128, kBlocks = 4, kUnroll = 1;
  static constexpr bool kMin = false, kHalves = true;
  // Words as halves: qh at 4 t and 16 + 4 t; ql at 4 t, 16 + 4 t (s = 0 / 2),
  // 32 + 4 t, 48 + 4 t (s = 1 / 3); the half's 8 scales; d.
  struct Raw {
    unsigned short qh[4], ql[8], sc[4], d;
  };
  struct Unit {
    int q[kBlocks][2];
    float d[kBlocks];
    int h[kBlocks][2];
  };
  template <class L>
  __device__ static void fetch(const uint8_t* row, int u, int t, Raw& r) {
    const uint8_t* b = row + static_cast<int64_t>(u >> 1) * kBytes;
    const int hf = u & 1;
    const uint8_t* ql = b + 64 * hf;
    const uint8_t* qh = b + 128 + 32 * hf;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      r.qh[2 * i] = L::u16(qh + 16 * i + 4 * t);
      r.qh[2 * i + 1] = L::u16(qh + 16 * i + 4 * t + 2);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      r.ql[2 * i] = L::u16(ql + 16 * i + 4 * t);
      r.ql[2 * i + 1] = L::u16(ql + 16 * i + 4 * t + 2);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) r.sc[i] = L::u16(b + 192 + 8 * hf + 2 * i);
    r.d = L::u16(b + 208);
  }
  __device__ static void decode(const Raw& r, Unit& a) {
    const uint32_t qh0 = static_cast<uint32_t>(join16(r.qh[0], r.qh[1]));
    const uint32_t qh1 = static_cast<uint32_t>(join16(r.qh[2], r.qh[3]));
    const uint32_t ql_a[2] = {static_cast<uint32_t>(join16(r.ql[0], r.ql[1])),
                              static_cast<uint32_t>(join16(r.ql[2], r.ql[3]))};  // s = 0 / 2
    const uint32_t ql_b[2] = {static_cast<uint32_t>(join16(r.ql[4], r.ql[5])),
                              static_cast<uint32_t>(join16(r.ql[6], r.ql[7]))};  // s = 1 / 3
    const float d = __half2float(__ushort_as_half(r.d));
    // The 8 int8 scales of this half: groups 8 hf .. 8 hf + 7.
    const uint32_t sc_lo = static_cast<uint32_t>(join16(r.sc[0], r.sc[1]));
    const uint32_t sc_hi = static_cast<uint32_t>(join16(r.sc[2], r.sc[3]));
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint32_t* l = (s & 1) ? ql_b : ql_a;
      const int shift = s < 2 ? 0 : 4;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const uint32_t qh_w = q == 0 ? qh0 : qh1;
        const uint32_t v = ((l[q] >> shift) & 0x0F0F0F0Fu) | (((qh_w >> (2 * s)) & 0x03030303u) << 4);
        a.q[s][q] = static_cast<int>(__vsub4(v, 0x20202020u));
        const uint32_t sw = s < 2 ? sc_lo : sc_hi;
        a.h[s][q] = static_cast<int>(static_cast<int8_t>((sw >> (8 * (2 * (s & 1) + q))) & 0xffu));
      }
      a.d[s] = d;
    }
  }
};

__device__ __forceinline__ void mma_k32(int (&c)[4], int a0, int a1, int a2, int a3, int b0, int b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_k16(int (&c)[4], int a0, int a1, int b0) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a0), "r"(a1), "r"(b0));
}

// acc += d_w (d_x dot) [- m_w (d_x sum q_x)], every rounding explicit.
__device__ __forceinline__ float apply(float acc, float dw, float mw, int dot, float2 dx, bool with_min) {
  acc = __fmaf_rn(dw, __fmul_rn(dx.x, static_cast<float>(dot)), acc);
  return with_min ? __fmaf_rn(-mw, dx.y, acc) : acc;
}

}  // namespace rill::cuda::mma_units
