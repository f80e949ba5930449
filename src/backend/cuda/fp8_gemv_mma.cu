// fp8_gemv_mma (fp8.h, RILL_FP8_GEMV=mma): the FP8 GEMV of 1..8 bf16 tokens
// on the tensor cores.
//
// Why: fp8_gemv spends ~3.75 instructions a weight byte at one token (each
// e4m3 pair to f16x2, to two f32, one f32 FMA a weight a token) and more
// with every token. Here a weight pair costs one cvt.rn.f16x2.e4m3x2 and
// one mma.m16n8k16 (f16 operands, f32 accumulation) multiplies 16 rows x
// 16 columns by all eight token columns at once. The main loop a lane and
// 64-column chunk (32 R weight bytes; sm_90 SASS of CUDA 13.0): 2 R 16-byte
// loads, 2 shared loads of x, 16 R F2FP.F16.E4M3, 4 R HMMA and ~8 of
// addressing and control: ~1.0 instruction a weight byte at R = 1, ~0.9 at
// R = 2, whatever the token count; plus each warp's work on x once a block
// (below), which grows with the tokens.
//
// Work: a block (8 warps) owns R row groups of 16 rows (R = 2 where the
// groups leave two blocks an SM anyway: auto_config) and every column; the
// row's 64-column chunks are cut into 8 contiguous ranges, one a warp, by
// n_cols alone. Warp w streams its range of the R groups' rows through a
// ring of D chunks of 16-byte loads (the first D issued before the wait
// for the previous kernel: weights are never written), runs the mma chain
// over its chunks in increasing order, and its sums go through shared
// memory, where warp 0 .. R - 1 add the 8 warps' in warp order, times the
// row's scale (its header), then y (+)=.
//
// Fragments (PTX ISA, mma.m16n8k16 .f16 .row.col; lane = 4 g + t): as
// fp8_mma.cu: lane (g, t) loads bytes [16 t, 16 t + 16) of the chunk of rows
// g and g + 8 of a group; step s (0..3) takes word s of each, its low 16
// bits the k pair 2t, 2t+1 (a0 row g, a1 row g + 8), its high 16 bits
// 2t+8, 2t+9 (a2, a3); B (k x token) is token g's x at the same columns
// (b0 = columns 16 t + 4 s + 0, 1, b1 = + 2, 3): a dot product does not
// care which k goes where as long as A and B agree.
//
// x (bf16) -> f16 (mma's B): bf16 reaches 3.4e38, f16 65,504, and f16
// keeps full precision only down to 2^-14 (down's inputs sit at 1e-3 ..
// 1e-6). So, per token and warp range, max |x| over the values the warp
// uses picks a power of two 2^-s that puts that max in [2^14, 2^15)
// (s of either sign: scaling up keeps small activations out of f16's
// subnormals); x 2^-s is exact in bf16 and then exact in f16 for every
// value down to 2^-31 of the max (smaller ones round on f16's 2^-24 grid:
// at most 2^-39 of the max). The warp's f32 sums of that token are
// multiplied by 2^s (exact) before the warps' sums are added. The warp
// converts its range of x once a block into shared memory (B fragments
// then cost two 16-byte shared loads a chunk; converting in registers cost
// each lane ~34 instructions a chunk, 28 of 32 lanes idle at one token),
// in phases of at most kWarpXBytes (down's 1,792 columns a warp at eight
// tokens are 29 KB): a phase boundary changes when x is converted, never
// which values nor the order of any sum.
//
// Summation order of an output (row r, token t), fixed by n_cols: per warp,
// the HMMA chain over its chunks in increasing order, four k16 steps each;
// times 2^s of (t, warp); the warps added in warp order; times the row's
// scale; + y when accumulating. The token count, a token's place in the
// batch (an mma's output column reads only its own B column), R, D and the
// grid never enter it: a token's result is the same bits alone and in any
// batch of 1..8 (tested), unlike fp8_gemv's bits (another order).
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/fp8.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/smem_opt_in.h"

namespace rill::cuda {
namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kRowsPerGroup = 16, kChunk = 64;  // an m16 tile; a chunk: 4 k16 steps
// x in f16 a warp holds at once: a whole range of 4,096-column matrices
// (8 chunks) at eight tokens, 72 KB a block, two blocks an SM.
constexpr int kWarpXBytes = 9216;

struct Params {
  const uint8_t* w;        // kFp8Rows [n_rows, n_cols]
  const __nv_bfloat16* x;  // [n_tokens, n_cols]
  float* y;                // [n_tokens, n_rows]
  int64_t n_rows, n_cols, ld;
  int per;           // chunks of a warp's range (the last ranges may be short or empty)
  int phase_chunks;  // chunks of x a warp converts at once (a multiple of D)
  int warp_bytes;    // shared memory a warp: its x, then its sums
  bool accumulate;
};

// Shared x of a warp, [chunk][h][token][t] 16-byte units, unit (c, h, tok,
// t) = token tok's columns 64 c + 16 t + 8 h .. + 7 in f16: lane (g, t)'s
// B fragments are units (c, 0, g, t) and (c, 1, g, t), and a quarter-warp's
// 8 lanes (g = 2 i, 2 i + 1; t = 0..3) read 128 contiguous bytes. The h
// stride is padded to an odd number of 64-byte token blocks so that a
// quarter-warp's stores (h = 0 and 1, 4 units each) fall on distinct banks.
template <int N>
inline constexpr int kHStride = 64 * (N | 1);
template <int N>
inline constexpr int kCStride = 2 * kHStride<N>;

// f16x2 of e4m3 bytes 0, 1 (lo) or 2, 3 (hi) of v, exact; the lower byte
// in the lower half. One F2FP.F16.E4M3.UNPACK_B each (it reads either half).
__device__ __forceinline__ uint32_t e4m3x2_lo(uint32_t v) {
  uint32_t d;
  asm("{.reg .b16 l, h;\n\tmov.b32 {l, h}, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, l;}" : "=r"(d) : "r"(v));
  return d;
}
__device__ __forceinline__ uint32_t e4m3x2_hi(uint32_t v) {
  uint32_t d;
  asm("{.reg .b16 l, h;\n\tmov.b32 {l, h}, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, h;}" : "=r"(d) : "r"(v));
  return d;
}

__device__ __forceinline__ uint32_t max_u16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// m with the magnitudes of v's 8 bf16 values folded in, as 16-bit
// integers: without the sign bit, a bf16's bits order as its magnitude.
__device__ __forceinline__ uint32_t abs_max(uint32_t m, const uint4& v) {
  constexpr uint32_t kMag = 0x7fff7fffu;
  m = max_u16x2(m, max_u16x2(v.x & kMag, v.y & kMag));
  return max_u16x2(m, max_u16x2(v.z & kMag, v.w & kMag));
}

// The scale of a token from its max |x| (bf16 bits, 0..0x7fff): e its
// exponent field, clamped to [15, 254] so 2^-s and 2^s are normal in bf16
// and f32 (an all-zero or subnormal max scales up by 2^126; inf and NaN
// stay inf and NaN). s = e - 141: max 2^-s in [2^14, 2^15).
__device__ __forceinline__ int scale_exp(uint32_t max_bits) {
  return min(254, max(15, static_cast<int>(max_bits >> 7)));
}
// 2^-s as a bf16 pair (both halves).
__device__ __forceinline__ uint32_t down_bf16x2(int e) {
  return static_cast<uint32_t>(268 - e) << 7 | static_cast<uint32_t>(268 - e) << 23;
}
// 2^s as f32.
__device__ __forceinline__ float up_f32(int e) {
  return __uint_as_float(static_cast<uint32_t>(e - 14) << 23);
}

// 8 bf16 values times 2^-s (a bf16 multiply by a power of two: exact), as
// f16 (exact from bf16 for the normal range, see the top).
__device__ __forceinline__ uint4 to_f16(const uint4& v, uint32_t down) {
  const uint32_t in[4] = {v.x, v.y, v.z, v.w};
  uint32_t out[4];
  const __nv_bfloat162 d = *reinterpret_cast<const __nv_bfloat162*>(&down);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 s = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&in[i]), d);
    const uint32_t b = *reinterpret_cast<const uint32_t*>(&s);
    const __half2 h = __floats2half2_rn(__uint_as_float(b << 16), __uint_as_float(b & 0xffff0000u));
    out[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

__device__ __forceinline__ uint32_t word(const uint4& u, int s) {
  return s == 0 ? u.x : s == 1 ? u.y : s == 2 ? u.z : u.w;
}

// N tokens (1..8), R row groups a block, a ring of D chunks. Registers:
// __launch_bounds__(256, 2) allows 128; the ring holds 8 R D of them
// (ptxas of CUDA 13.0: 105-128 in every configuration, no spills; a ring
// of 16 loads, R2 D4, spilled up to 128 bytes).
template <int N, int R, int D>
__global__ void __launch_bounds__(kThreads, 2) fp8_gemv_mma_kernel(const Params p) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int kHs = kHStride<N>, kCs = kCStride<N>;
  // x loads in flight a lane while the warp scans or converts x: 8, or 4
  // beside a ring of 12+ loads (within 128 registers).
  constexpr int kXLoads = 2 * R * D >= 12 ? 4 : 8;
  constexpr int kJU = N >= kXLoads ? 1 : kXLoads / N;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n_chunks = static_cast<int>(p.n_cols / kChunk);
  const int k0 = min(n_chunks, warp * p.per), nk = min(n_chunks, k0 + p.per) - k0;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * (kRowsPerGroup * R);

  // Rows g and g + 8 of each group from this lane's 16 bytes of the warp's
  // first chunk; a short last group re-reads row n_rows - 1 (not written).
  const uint4* wr[R][2];
  float row_scale[R][2];
#pragma unroll
  for (int q = 0; q < R; ++q) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = min(r0 + kRowsPerGroup * q + g + 8 * h, p.n_rows - 1);
      const uint8_t* rp = p.w + row * p.ld;
      wr[q][h] = reinterpret_cast<const uint4*>(rp + kFp8RowHeader + k0 * kChunk + 16 * t);
      row_scale[q][h] = __ldg(reinterpret_cast<const float*>(rp));
    }
  }
  uint4 ring[D][R][2];  // ring[j]: chunk i + j of the round starting at i
#pragma unroll
  for (int j = 0; j < D; ++j) {
#pragma unroll
    for (int q = 0; q < R; ++q) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (j < nk) ring[j][q][h] = __ldcs(wr[q][h] + 4 * j);  // a slot past the range is never read
      }
    }
  }
  detail::pdl_wait();  // x is the previous kernel's output
  detail::pdl_trigger();

  // Each token's max |x| over the warp's range, 8 columns a unit, unit u
  // at columns 8 u of the range; then over the warp: tokens 2i and 2i + 1
  // share a register (low and high half).
  const __nv_bfloat16* xw = p.x + static_cast<int64_t>(k0) * kChunk;
  uint32_t mx[N];
#pragma unroll
  for (int tok = 0; tok < N; ++tok) mx[tok] = 0;
  {
    const int units = 8 * nk;
    for (int j0 = 0; 32 * j0 < units; j0 += kJU) {
      uint4 v[kJU][N];
#pragma unroll
      for (int ju = 0; ju < kJU; ++ju) {
        const int u = lane + 32 * (j0 + ju);
#pragma unroll
        for (int tok = 0; tok < N; ++tok) {
          v[ju][tok] = u < units ? __ldg(reinterpret_cast<const uint4*>(xw + tok * p.n_cols + 8 * u)) : uint4{};
        }
      }
#pragma unroll
      for (int ju = 0; ju < kJU; ++ju) {
        if (32 * (j0 + ju) >= units) break;  // the warp's last units
#pragma unroll
        for (int tok = 0; tok < N; ++tok) mx[tok] = abs_max(mx[tok], v[ju][tok]);
      }
    }
  }
  constexpr int kPairs = (N + 1) / 2;
  uint32_t tok_max[kPairs];  // token 2 i's max |x| bits in the low half, 2 i + 1's in the high
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const uint32_t a = mx[2 * i], b = 2 * i + 1 < N ? mx[2 * i + 1] : 0u;
    uint32_t m = max(a & 0xffffu, a >> 16) | max(b & 0xffffu, b >> 16) << 16;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = max_u16x2(m, __shfl_xor_sync(0xffffffffu, m, o));
    tok_max[i] = m;
  }
  auto exp_of = [&](int tok) { return scale_exp((tok_max[tok >> 1] >> (16 * (tok & 1))) & 0xffffu); };

  // Converts chunks [cb, cb + n) of the range (a phase) into the warp's
  // shared x (unit u: chunk u / 8, columns 8 (u % 8): h = u & 1, t = u / 2 % 4).
  uint8_t* x16 = smem + warp * p.warp_bytes;
  auto convert = [&](int cb, int n) {
    uint32_t down[N];
#pragma unroll
    for (int tok = 0; tok < N; ++tok) down[tok] = down_bf16x2(exp_of(tok));
    const int units = 8 * n;
    const __nv_bfloat16* xc = xw + cb * kChunk;
    for (int j0 = 0; 32 * j0 < units; j0 += kJU) {
      uint4 v[kJU][N];
#pragma unroll
      for (int ju = 0; ju < kJU; ++ju) {
        const int u = lane + 32 * (j0 + ju);
#pragma unroll
        for (int tok = 0; tok < N; ++tok) {
          v[ju][tok] = u < units ? __ldg(reinterpret_cast<const uint4*>(xc + tok * p.n_cols + 8 * u)) : uint4{};
        }
      }
#pragma unroll
      for (int ju = 0; ju < kJU; ++ju) {
        const int u = lane + 32 * (j0 + ju);
        if (32 * (j0 + ju) >= units) break;  // the phase's last units
        if (u < units) {
          uint8_t* dst = x16 + (u >> 3) * kCs + (u & 1) * kHs + ((u >> 1) & 3) * 16;
#pragma unroll
          for (int tok = 0; tok < N; ++tok) *reinterpret_cast<uint4*>(dst + 64 * tok) = to_f16(v[ju][tok], down[tok]);
        }
      }
    }
  };

  // Token g's B (tokens past N read token N - 1: their output columns are
  // not stored, and an mma's column reads only its own B column).
  const int b_off = (g < N ? g : N - 1) * 64 + 16 * t;
  float acc[R][4];
#pragma unroll
  for (int q = 0; q < R; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.0f;
  int phase_start = 0, phase_end = 0;
  for (int i = 0; i < nk; i += D) {
    if (i == phase_end) {  // phase_chunks is a multiple of D: a phase starts a round
      __syncwarp();        // the previous phase's x is read
      phase_start = i;
      phase_end = i + min(p.phase_chunks, nk - i);
      convert(i, phase_end - i);
      __syncwarp();
    }
#pragma unroll
    for (int j = 0; j < D; ++j) {
      const int c = i + j;
      if (c >= nk) break;
      const uint8_t* xb = x16 + (c - phase_start) * kCs + b_off;
      const uint4 x0 = *reinterpret_cast<const uint4*>(xb), x1 = *reinterpret_cast<const uint4*>(xb + kHs);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint4& xv = s < 2 ? x0 : x1;
        const uint32_t b0 = word(xv, 2 * (s & 1)), b1 = word(xv, 2 * (s & 1) + 1);
#pragma unroll
        for (int q = 0; q < R; ++q) {
          const uint32_t lo = word(ring[j][q][0], s), hi = word(ring[j][q][1], s);
          mma_m16n8k16<__half>(acc[q], e4m3x2_lo(lo), e4m3x2_lo(hi), e4m3x2_hi(lo), e4m3x2_hi(hi), b0, b1);
        }
      }
      const int next = c + D;
#pragma unroll
      for (int q = 0; q < R; ++q) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (next < nk) ring[j][q][h] = __ldcs(wr[q][h] + 4 * next);
        }
      }
    }
  }

  // The warp's sums times 2^s of their tokens (2t, 2t + 1), over its own x
  // (each warp's region holds R x 32 float4).
  float up_a = 1.0f, up_b = 1.0f;
#pragma unroll
  for (int tok = 0; tok < N; ++tok) {
    const float up = up_f32(exp_of(tok));
    if (tok == 2 * t) up_a = up;
    if (tok == 2 * t + 1) up_b = up;
  }
  __syncwarp();  // the warp's last B loads are done
  float4* red = reinterpret_cast<float4*>(x16);
#pragma unroll
  for (int q = 0; q < R; ++q) {
    red[q * 32 + lane] = make_float4(__fmul_rn(acc[q][0], up_a), __fmul_rn(acc[q][1], up_b), __fmul_rn(acc[q][2], up_a),
                                     __fmul_rn(acc[q][3], up_b));
  }
  __syncthreads();
  // Warp q adds group q's sums over the warps in warp order: lane (g, t)
  // holds rows g, g + 8 and tokens 2t, 2t + 1.
#pragma unroll
  for (int q = 0; q < R; ++q) {
    if (warp != q) continue;
    float4 s = reinterpret_cast<const float4*>(smem)[q * 32 + lane];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) {
      const float4 o = reinterpret_cast<const float4*>(smem + w * p.warp_bytes)[q * 32 + lane];
      s.x += o.x;
      s.y += o.y;
      s.z += o.z;
      s.w += o.w;
    }
    const int64_t row = r0 + kRowsPerGroup * q + g;
    auto put = [&](int tok, int64_t r, float v, float scale) {
      if (tok < N && r < p.n_rows) {
        float* out = p.y + tok * p.n_rows + r;
        const float sv = __fmul_rn(v, scale);  // not contracted into the add below
        *out = p.accumulate ? __fadd_rn(*out, sv) : sv;
      }
    };
    put(2 * t, row, s.x, row_scale[q][0]);
    put(2 * t + 1, row, s.y, row_scale[q][0]);
    put(2 * t, row + 8, s.z, row_scale[q][1]);
    put(2 * t + 1, row + 8, s.w, row_scale[q][1]);
  }
}

// The configurations: R row groups a block, a ring of D chunks a warp.
struct Config {
  int rows, ring;
  const char* name;
};
constexpr Config kConfigs[] = {{1, 4, "R1 D4"}, {1, 8, "R1 D8"}, {2, 2, "R2 D2"}, {2, 3, "R2 D3"}};
constexpr int kNConfigs = sizeof(kConfigs) / sizeof(kConfigs[0]);
static_assert(kNConfigs == 4, "run() dispatches each configuration");

// The configuration by shape: two groups a block where that still leaves
// two blocks an SM (gate_up, the LM head: half the x work a weight byte),
// else one (qkv, o, down: 4,096-6,144 rows are 256-384 groups, about two
// an SM of 132).
constexpr int kOneGroup = 0, kTwoGroups = 2;  // kConfigs' R1 D4 and R2 D2
int auto_config(int64_t n_rows) {
  const int64_t groups = (n_rows + kRowsPerGroup - 1) / kRowsPerGroup;
  return groups / 2 >= 2 * static_cast<int64_t>(sm_count()) ? kTwoGroups : kOneGroup;
}

template <int N, int R, int D>
void launch_nrd(Params p, cudaStream_t stream) {
  // Chunks a phase: what kWarpXBytes holds, whole rounds of the ring.
  constexpr int kMaxPhase = std::max(D, kWarpXBytes / kCStride<N> / D * D);
  const int n_chunks = static_cast<int>(p.n_cols / kChunk);
  p.per = (n_chunks + kWarps - 1) / kWarps;
  p.phase_chunks = kMaxPhase;
  p.warp_bytes = std::max(std::min(p.per, kMaxPhase) * kCStride<N>, R * 32 * 16);
  const size_t smem = static_cast<size_t>(kWarps) * p.warp_bytes;
  auto* kernel = fp8_gemv_mma_kernel<N, R, D>;
  // Past 48 KB (5+ tokens at 4,096 columns) the kernel opts in; the
  // driver sizes the L1 / shared carveout for two blocks an SM itself.
  if (smem > 48 * 1024) {
    static SmemOptIn opt_in;
    opt_in.ensure(reinterpret_cast<const void*>(kernel),
                  static_cast<size_t>(kWarps) * std::max(kMaxPhase * kCStride<N>, R * 32 * 16));
  }
  const int64_t groups = (p.n_rows + kRowsPerGroup - 1) / kRowsPerGroup;
  launch_pdl(kernel, static_cast<unsigned>((groups + R - 1) / R), kThreads, smem, stream, p);
}

template <int R, int D>
void launch_rd(const Params& p, int n_tokens, cudaStream_t stream) {
  switch (n_tokens) {
    case 1:
      launch_nrd<1, R, D>(p, stream);
      break;
    case 2:
      launch_nrd<2, R, D>(p, stream);
      break;
    case 3:
      launch_nrd<3, R, D>(p, stream);
      break;
    case 4:
      launch_nrd<4, R, D>(p, stream);
      break;
    case 5:
      launch_nrd<5, R, D>(p, stream);
      break;
    case 6:
      launch_nrd<6, R, D>(p, stream);
      break;
    case 7:
      launch_nrd<7, R, D>(p, stream);
      break;
    default:
      launch_nrd<8, R, D>(p, stream);
      break;
  }
}

void run(int config, const uint8_t* w, const void* x_bf16, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y,
         bool accumulate, cudaStream_t stream) {
  if (n_tokens <= 0 || n_rows <= 0) return;
  assert(fp8_gemv_mma_supported(DType::kBF16, n_tokens, n_cols));
  Params p{};
  p.w = w;
  p.x = static_cast<const __nv_bfloat16*>(x_bf16);
  p.y = y;
  p.n_rows = n_rows;
  p.n_cols = n_cols;
  p.ld = static_cast<int64_t>(fp8_row_bytes(n_cols));
  p.accumulate = accumulate;
  const int n = static_cast<int>(n_tokens);
  switch (config) {
    case 0:
      launch_rd<kConfigs[0].rows, kConfigs[0].ring>(p, n, stream);
      break;
    case 1:
      launch_rd<kConfigs[1].rows, kConfigs[1].ring>(p, n, stream);
      break;
    case 2:
      launch_rd<kConfigs[2].rows, kConfigs[2].ring>(p, n, stream);
      break;
    default:
      launch_rd<kConfigs[3].rows, kConfigs[3].ring>(p, n, stream);
      break;
  }
  RILL_CUDA_CHECK_LAUNCH();
}

std::atomic<int> g_forced{-1};  // force_fp8_gemv_mma's choice; -1: the environment's

bool env_on() {
  static const bool on = [] {
    const char* e = std::getenv("RILL_FP8_GEMV");
    return e != nullptr && std::strcmp(e, "mma") == 0;
  }();
  return on;
}

}  // namespace

bool fp8_gemv_mma_on() {
  const int f = g_forced.load(std::memory_order_relaxed);
  return f >= 0 ? f != 0 : env_on();
}

void force_fp8_gemv_mma(int on) {
  g_forced.store(on < 0 ? -1 : on == 0 ? 0 : 1, std::memory_order_relaxed);
}

bool fp8_gemv_mma_supported(DType x_dtype, int64_t n_tokens, int64_t n_cols) {
  return x_dtype == DType::kBF16 && n_tokens >= 1 && n_tokens <= kFp8GemvMmaMaxTokens && n_cols > 0 &&
         n_cols % kChunk == 0;
}

void fp8_gemv_mma(const uint8_t* w, const void* x_bf16, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y,
                  bool accumulate, cudaStream_t stream) {
  run(auto_config(n_rows), w, x_bf16, n_tokens, n_rows, n_cols, y, accumulate, stream);
}

int fp8_gemv_mma_n_variants() {
  return kNConfigs;
}

const char* fp8_gemv_mma_variant_name(int variant) {
  return variant >= 0 && variant < kNConfigs ? kConfigs[variant].name : "fp8_gemv_mma";
}

void fp8_gemv_mma_variant(int variant, const uint8_t* w, const void* x_bf16, int64_t n_tokens, int64_t n_rows,
                          int64_t n_cols, float* y, bool accumulate, cudaStream_t stream) {
  run(variant >= 0 && variant < kNConfigs ? variant : auto_config(n_rows), w, x_bf16, n_tokens, n_rows, n_cols, y,
      accumulate, stream);
}

}  // namespace rill::cuda
