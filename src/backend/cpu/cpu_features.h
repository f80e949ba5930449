#pragma once
// What the CPU we run on supports *and the OS lets us use*, read once. Kernels
// compiled for AVX2 / AVX-512 (files *_avx2.cpp / *_avx512.cpp) are only
// called when these say the instructions exist and their register state is
// enabled: CPUID alone is not enough (a hypervisor or kernel may leave the
// AVX / AVX-512 state off in XCR0, and Linux hands out AMX tile state only
// after an arch_prctl(ARCH_REQ_XCOMP_PERM) request), and using an
// instruction whose state is off faults with SIGILL.
#include <cstdint>

namespace rill::cpu {

enum class Isa { kScalar, kAvx2, kAvx512 };

// The raw inputs of the decision, for diagnostics and for tests of it.
struct CpuidBits {
  bool osxsave = false;  // CPUID.1:ECX.27: XGETBV is usable
  bool avx = false, fma = false, f16c = false, avx2 = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512vnni = false;
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false;
};

// XCR0 bits (the state components the OS saves and restores).
inline constexpr uint64_t kXcr0Sse = 1u << 1, kXcr0Avx = 1u << 2;
inline constexpr uint64_t kXcr0Opmask = 1u << 5, kXcr0ZmmHi256 = 1u << 6, kXcr0Hi16Zmm = 1u << 7;
inline constexpr uint64_t kXcr0TileCfg = 1u << 17, kXcr0TileData = 1u << 18;

struct CpuFeatures {
  bool avx2 = false;    // with FMA and F16C, and the OS saving YMM state
  bool avx512 = false;  // F, BW, VL, DQ, and the OS saving opmask + ZMM state
  bool avx512_vnni = false;
  // AMX: in CPUID and in XCR0. Usable only after amx_request_permission().
  bool amx_int8 = false;
  bool amx_bf16 = false;
  CpuidBits cpuid;
  uint64_t xcr0 = 0;  // 0 when XGETBV is not usable
};

// Pure: the features implied by these CPUID bits and this XCR0.
CpuFeatures derive_features(const CpuidBits& bits, uint64_t xcr0);

const CpuFeatures& cpu_features();

// Asks Linux for the AMX tile-data state (once; later calls return the first
// answer). False when the CPU/OS lacks AMX or the kernel refuses. An AMX path
// must call this and get true before its first tile instruction (the K-quant
// gemm's does: gemm_kquant_amx.h).
bool amx_request_permission();

// The best ISA this CPU and OS support: the kernel table every model uses.
// The lower tables are tested through kernels(Isa) (tests/backend); the
// environment switch that lowered this one for whole runs (RILL_CPU_ISA)
// is gone: the tables are process-wide, so it could not be a ModelOptions
// field, and no script, benchmark or test set it. The CPU models'
// Model::kv_numerics() names the ISA, since the tables' sums differ.
Isa best_isa();
Isa isa_for(const CpuFeatures& f);
const char* isa_name(Isa isa);

}  // namespace rill::cpu
