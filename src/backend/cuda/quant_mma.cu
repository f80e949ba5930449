// Decode-sized matmuls over GGUF blocks on the int8 tensor cores (quant.h:
// quantize_x8, quant_mma).
//
// quantize_x8: one warp per 32 columns of one token; d = max |x| / 127,
// q = x / d rounded to nearest even (|q| <= 127), and d * sum(q) for the
// block types with a min term.
//
// quant_mma: a block of kWarps warps owns 16 rows; warp w takes the w-th
// of kWarps equal ranges of the row's units (a unit: kCols columns, whole
// 32-column blocks, see the decoders below) and, per 32-column block, runs
// mma.m16n8k32 (m16n8k16 twice for Q6_K's 16-column scales) of the 16 rows'
// int8 weights with 8 tokens' int8 x per token tile: an exact int32 dot of
// 32 (16) products. Each (row, token) then takes, in block order,
//   acc = fma(d_w, d_x * dot, acc)  [and  acc = fma(-m_w, d_x * sum q_x, acc)]
// with every rounding explicit (__fmul_rn / __fmaf_rn: no contraction can
// differ between instantiations); the warps' partial sums are added in warp
// order. Nothing a (row, token) computes depends on the other tokens or on
// their number: batch invariant per row like quant_gemv.
//
// Fragment layouts (PTX ISA, mma.m16n8k32 .s8): lane = 4 g + t; A regs
// a0 / a1: rows g / g + 8 at block columns 4 t .. 4 t + 3, a2 / a3: the same
// rows at 16 + 4 t ..; B regs b0 / b1: token g at columns 4 t .. and 16 +
// 4 t ..; C: rows g (c0, c1) and g + 8 (c2, c3), tokens 2 t and 2 t + 1.
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/quant.h"
#include "backend/cuda/quant_blocks.cuh"

namespace rill::cuda {
namespace {

using quant::ld_f16;
using quant::ld_u32_a2;
using quant::ld_u32_a4;

constexpr int kWarps = 8;  // per block: the K split of 16 rows
constexpr int kMaxTiles = kMmaMaxTokens / 8;

// ---------------------------------------------------------------- x to int8

// Where column c of a 32-column block sits in xq: lane t of a quad reads
// its B words (columns 4 t .. 4 t + 3 and 16 + 4 t ..) as 8 bytes at 8 t.
__device__ __forceinline__ int x8_pos(int c) {
  return 8 * ((c & 15) >> 2) + 4 * (c >> 4) + (c & 3);
}

template <typename T>
__global__ void quantize_x8_kernel(const T* __restrict__ x, int64_t n_blocks, int8_t* __restrict__ q,
                                   float2* __restrict__ ds) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (b >= n_blocks) return;
  const float v = detail::to_f32(x[b * 32 + lane]);
  const float amax = detail::warp_max(fabsf(v));
  const float d = __fdiv_rn(amax, 127.0f);
  const int qi = amax > 0.0f ? __float2int_rn(__fdiv_rn(v, d)) : 0;
  q[b * 32 + x8_pos(lane)] = static_cast<int8_t>(qi);
  int s = qi;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) ds[b] = make_float2(d, __fmul_rn(d, static_cast<float>(s)));
}

// ------------------------------------------------------- weight fragments
// A decoder gives, for one row and one unit, lane t's A words of each of
// the unit's kBlocks 32-column blocks (q[b][0]: block columns 4 t .. 4 t + 3,
// q[b][1]: 16 + 4 t ..) as int8 x 4, and the block's scale d[b] (kMin: the
// min m[b], value = d q - m; kHalves: a scale per 16 columns, h[b][0..1],
// the value d * h * q).

// The loads (fetch) are apart from the decoding (decode), fetch keeping
// the words as loaded (2-byte aligned words as their two halves). Issuing
// the next unit's loads before multiplying this one was measured on the
// H200 (RILL_CUDA_QUANT_MMA_PIPE in e46ff69): 5-25% slower at one token
// (more registers: 2 blocks per SM instead of 3), even at 8; not kept.
__device__ __forceinline__ unsigned short ld_u16(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned short*>(p));
}
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
  __device__ static void fetch(const uint8_t* row, int u, int t, Raw& r) {
    const uint8_t* b = row + static_cast<int64_t>(u) * kBytes;
    r.d = ld_u16(b);
    r.q[0] = ld_u16(b + 2 + 4 * t);
    r.q[1] = ld_u16(b + 4 + 4 * t);
    r.q[2] = ld_u16(b + 18 + 4 * t);
    r.q[3] = ld_u16(b + 20 + 4 * t);
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
  __device__ static void fetch(const uint8_t* row, int u, int t, Raw& r) {
    const uint8_t* b = row + static_cast<int64_t>(u) * kBytes;
    r.h = __ldg(reinterpret_cast<const uint4*>(b));
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      r.qw[g][0] = ld_u32_a4(b + 16 + 32 * g + 4 * t);
      r.qw[g][1] = ld_u32_a4(b + 32 + 32 * g + 4 * t);
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
  __device__ static void fetch(const uint8_t* row, int u, int t, Raw& r) {
    const uint8_t* b = row + static_cast<int64_t>(u >> 1) * kBytes;
    const int hf = u & 1;
    const uint8_t* ql = b + 64 * hf;
    const uint8_t* qh = b + 128 + 32 * hf;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      r.qh[2 * i] = ld_u16(qh + 16 * i + 4 * t);
      r.qh[2 * i + 1] = ld_u16(qh + 16 * i + 4 * t + 2);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      r.ql[2 * i] = ld_u16(ql + 16 * i + 4 * t);
      r.ql[2 * i + 1] = ld_u16(ql + 16 * i + 4 * t + 2);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) r.sc[i] = ld_u16(b + 192 + 8 * hf + 2 * i);
    r.d = ld_u16(b + 208);
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

// y[t, row] (+)= sum_c W[row, c] x[t, c] over kTiles tiles of 8 tokens
// (tiles at or past n_tok are skipped; tokens past it read token n_tok - 1
// and are not written).
template <class Q, int kTiles>
__global__ void __launch_bounds__(kWarps * 32)
    quant_mma_kernel(const uint8_t* __restrict__ w, const int8_t* __restrict__ xq, const float2* __restrict__ xds,
                     int n_tok, int64_t n_rows, int64_t n_cols, float* __restrict__ y, int64_t y_stride,
                     bool accumulate) {
  static_assert(!(Q::kHalves && Q::kMin), "a type with 16-column scales and a min term");
  __shared__ float red[kWarps][kTiles * 8][16];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * 16;
  const int64_t row_bytes = n_cols / Q::kElems * Q::kBytes;
  const uint8_t* wa = w + min(row0 + g, n_rows - 1) * row_bytes;
  const uint8_t* wb = w + min(row0 + g + 8, n_rows - 1) * row_bytes;
  const int n_units = static_cast<int>(n_cols / Q::kCols);
  const int per = (n_units + kWarps - 1) / kWarps;
  const int u_begin = warp * per, u_end = min(n_units, u_begin + per);
  const int64_t x_blocks = n_cols / 32;  // per token
  detail::pdl_wait();
  detail::pdl_trigger();
  float acc[kTiles][4];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  typename Q::Raw ra, rb;  // rows g and g + 8
#pragma unroll Q::kUnroll
  for (int u = u_begin; u < u_end; ++u) {
    typename Q::Unit A, B;
    Q::fetch(wa, u, t, ra);
    Q::fetch(wb, u, t, rb);
    Q::decode(ra, A);
    Q::decode(rb, B);
#pragma unroll
    for (int blk = 0; blk < Q::kBlocks; ++blk) {
      const int64_t xb = static_cast<int64_t>(u) * Q::kBlocks + blk;
      // Every tile's x words and scales first (addresses clamped to valid
      // tokens), so their loads overlap; then the tiles' mma and scaling.
      int2 bx[kTiles];
      float2 dx0[kTiles], dx1[kTiles];
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        bx[j] = *reinterpret_cast<const int2*>(xq + min(j * 8 + g, n_tok - 1) * n_cols + xb * 32 + 8 * t);  // x8_pos
        dx0[j] = xds[min(j * 8 + 2 * t, n_tok - 1) * x_blocks + xb];
        dx1[j] = xds[min(j * 8 + 2 * t + 1, n_tok - 1) * x_blocks + xb];
      }
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        if (j * 8 >= n_tok) break;
        const int b0 = bx[j].x, b1 = bx[j].y;
        int c[4] = {0, 0, 0, 0};
        if constexpr (Q::kHalves) {
          int c1[4] = {0, 0, 0, 0};
          mma_k16(c, A.q[blk][0], B.q[blk][0], b0);
          mma_k16(c1, A.q[blk][1], B.q[blk][1], b1);
          // Each 16-column half with its own scale d * h (|dot| < 2^17: exact in f32).
          const float da0 = __fmul_rn(A.d[blk], static_cast<float>(A.h[blk][0]));
          const float da1 = __fmul_rn(A.d[blk], static_cast<float>(A.h[blk][1]));
          const float db0 = __fmul_rn(B.d[blk], static_cast<float>(B.h[blk][0]));
          const float db1 = __fmul_rn(B.d[blk], static_cast<float>(B.h[blk][1]));
          acc[j][0] = apply(apply(acc[j][0], da0, 0.0f, c[0], dx0[j], false), da1, 0.0f, c1[0], dx0[j], false);
          acc[j][1] = apply(apply(acc[j][1], da0, 0.0f, c[1], dx1[j], false), da1, 0.0f, c1[1], dx1[j], false);
          acc[j][2] = apply(apply(acc[j][2], db0, 0.0f, c[2], dx0[j], false), db1, 0.0f, c1[2], dx0[j], false);
          acc[j][3] = apply(apply(acc[j][3], db0, 0.0f, c[3], dx1[j], false), db1, 0.0f, c1[3], dx1[j], false);
        } else {
          mma_k32(c, A.q[blk][0], B.q[blk][0], A.q[blk][1], B.q[blk][1], b0, b1);
          float ma = 0.0f, mb = 0.0f;
          if constexpr (Q::kMin) {
            ma = A.m[blk];
            mb = B.m[blk];
          }
          acc[j][0] = apply(acc[j][0], A.d[blk], ma, c[0], dx0[j], Q::kMin);
          acc[j][1] = apply(acc[j][1], A.d[blk], ma, c[1], dx1[j], Q::kMin);
          acc[j][2] = apply(acc[j][2], B.d[blk], mb, c[2], dx0[j], Q::kMin);
          acc[j][3] = apply(acc[j][3], B.d[blk], mb, c[3], dx1[j], Q::kMin);
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    red[warp][j * 8 + 2 * t][g] = acc[j][0];
    red[warp][j * 8 + 2 * t + 1][g] = acc[j][1];
    red[warp][j * 8 + 2 * t][g + 8] = acc[j][2];
    red[warp][j * 8 + 2 * t + 1][g + 8] = acc[j][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n_tok * 16; i += kWarps * 32) {
    const int tok = i >> 4, r = i & 15;
    if (row0 + r >= n_rows) continue;
    float s = red[0][tok][r];
#pragma unroll
    for (int p = 1; p < kWarps; ++p) s = __fadd_rn(s, red[p][tok][r]);
    float* out = y + tok * y_stride + row0 + r;
    *out = accumulate ? __fadd_rn(*out, s) : s;
  }
}

template <class Q, int kTiles>
void launch_tiles(const uint8_t* w, const int8_t* xq, const float2* xds, int n_tok, int64_t n_rows, int64_t n_cols,
                  float* y, int64_t y_stride, bool accumulate, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((n_rows + 15) / 16);
  launch_pdl(quant_mma_kernel<Q, kTiles>, blocks, kWarps * 32, 0, stream, w, xq, xds, n_tok, n_rows, n_cols, y,
             y_stride, accumulate);
}

template <class Q>
void launch(const void* w, const void* xq, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y, int64_t y_stride,
            bool accumulate, cudaStream_t stream) {
  const auto* wq = static_cast<const uint8_t*>(w);
  const auto* q = static_cast<const int8_t*>(xq);
  const auto* ds = reinterpret_cast<const float2*>(q + n_tokens * n_cols);
  const int n = static_cast<int>(n_tokens);
  // Tiles of 8 tokens: 1, 2, 4 or 8 of them (a tile past n_tok is skipped).
  if (n <= 8) {
    launch_tiles<Q, 1>(wq, q, ds, n, n_rows, n_cols, y, y_stride, accumulate, stream);
  } else if (n <= 16) {
    launch_tiles<Q, 2>(wq, q, ds, n, n_rows, n_cols, y, y_stride, accumulate, stream);
  } else if (n <= 32) {
    launch_tiles<Q, 4>(wq, q, ds, n, n_rows, n_cols, y, y_stride, accumulate, stream);
  } else {
    launch_tiles<Q, kMaxTiles>(wq, q, ds, n, n_rows, n_cols, y, y_stride, accumulate, stream);
  }
}

}  // namespace

bool quant_mma_supported(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ4_K || t == DType::kQ6_K;
}

size_t quantized_x_bytes(int64_t n_tokens, int64_t n_cols) {
  // int8 values, then a float2 (d, d sum q) per 32 columns.
  return static_cast<size_t>(n_tokens * n_cols) + static_cast<size_t>(n_tokens * (n_cols / 32)) * sizeof(float2);
}

void quantize_x8(DType x_dtype, const void* x, int64_t n_tokens, int64_t n_cols, void* xq, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  const int64_t n_blocks = n_tokens * (n_cols / 32);
  auto* q = static_cast<int8_t*>(xq);
  auto* ds = reinterpret_cast<float2*>(q + n_tokens * n_cols);
  const auto grid = static_cast<unsigned>((n_blocks + 7) / 8);
  if (x_dtype == DType::kF32) {
    launch_pdl(quantize_x8_kernel<float>, grid, 256, 0, stream, static_cast<const float*>(x), n_blocks, q, ds);
  } else {
    launch_pdl(quantize_x8_kernel<__nv_bfloat16>, grid, 256, 0, stream, static_cast<const __nv_bfloat16*>(x), n_blocks,
               q, ds);
  }
  RILL_CUDA_CHECK_LAUNCH();
}

void quant_mma(DType w_dtype, const void* w, const void* xq, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y,
               int64_t y_stride, bool accumulate, cudaStream_t stream) {
  if (n_tokens <= 0 || n_rows <= 0) return;
  switch (w_dtype) {
    case DType::kQ8_0:
      launch<MmaQ8_0>(w, xq, n_tokens, n_rows, n_cols, y, y_stride, accumulate, stream);
      break;
    case DType::kQ4_K:
      launch<MmaQ4_K>(w, xq, n_tokens, n_rows, n_cols, y, y_stride, accumulate, stream);
      break;
    case DType::kQ6_K:
      launch<MmaQ6_K>(w, xq, n_tokens, n_rows, n_cols, y, y_stride, accumulate, stream);
      break;
    default:
      break;
  }
  RILL_CUDA_CHECK_LAUNCH();
}

}  // namespace rill::cuda
