// The ISA choice never exceeds what the OS enabled: derive_features on
// synthetic CPUID/XCR0 inputs, and this machine's choice against its own
// XGETBV (read here independently of cpu_features.cpp).
#include "backend/cpu/cpu_features.h"

#include <gtest/gtest.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace rill::cpu {
namespace {

CpuidBits all_bits() {
  CpuidBits b;
  b.osxsave = b.avx = b.fma = b.f16c = b.avx2 = true;
  b.avx512f = b.avx512bw = b.avx512vl = b.avx512dq = b.avx512vnni = true;
  b.amx_tile = b.amx_int8 = b.amx_bf16 = true;
  return b;
}

constexpr uint64_t kYmm = kXcr0Sse | kXcr0Avx | 1;  // x87 | SSE | AVX
constexpr uint64_t kZmm = kYmm | kXcr0Opmask | kXcr0ZmmHi256 | kXcr0Hi16Zmm;
constexpr uint64_t kTiles = kXcr0TileCfg | kXcr0TileData;

TEST(CpuFeatures, OsStateGatesEachIsa) {
  EXPECT_EQ(isa_for(derive_features(all_bits(), kZmm | kTiles)), Isa::kAvx512);
  // CPUID says AVX-512 but the OS saves only YMM state: AVX2.
  EXPECT_EQ(isa_for(derive_features(all_bits(), kYmm)), Isa::kAvx2);
  // Partial ZMM state (no Hi16_ZMM) is not enough.
  EXPECT_EQ(isa_for(derive_features(all_bits(), kYmm | kXcr0Opmask | kXcr0ZmmHi256)), Isa::kAvx2);
  // No AVX state at all, or XGETBV unusable (OSXSAVE clear): scalar.
  EXPECT_EQ(isa_for(derive_features(all_bits(), kXcr0Sse | 1)), Isa::kScalar);
  CpuidBits no_osxsave = all_bits();
  no_osxsave.osxsave = false;
  const CpuFeatures f = derive_features(no_osxsave, kZmm | kTiles);
  EXPECT_EQ(isa_for(f), Isa::kScalar);
  EXPECT_FALSE(f.amx_int8);
  // AMX in CPUID but the tile state off in XCR0 (this is what some VMs report).
  const CpuFeatures g = derive_features(all_bits(), kZmm);
  EXPECT_FALSE(g.amx_int8);
  EXPECT_FALSE(g.amx_bf16);
  EXPECT_TRUE(g.avx512_vnni);
  EXPECT_TRUE(derive_features(all_bits(), kZmm | kTiles).amx_int8);
  // Missing CPUID bits gate as before.
  CpuidBits no_bw = all_bits();
  no_bw.avx512bw = false;
  EXPECT_EQ(isa_for(derive_features(no_bw, kZmm)), Isa::kAvx2);
  CpuidBits no_f16c = all_bits();
  no_f16c.f16c = false;
  EXPECT_EQ(isa_for(derive_features(no_f16c, kZmm)), Isa::kScalar);
}

#if defined(__x86_64__)
TEST(CpuFeatures, ChosenIsaIsConsistentWithXgetbv) {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  ASSERT_TRUE(__get_cpuid(1, &eax, &ebx, &ecx, &edx));
  const bool osxsave = (ecx >> 27) & 1;
  uint64_t xcr0 = 0;
  if (osxsave) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  }
  EXPECT_EQ(cpu_features().xcr0, xcr0);
  const Isa isa = best_isa();
  if (isa != Isa::kScalar) {
    EXPECT_EQ(xcr0 & 0x6, 0x6u) << "AVX chosen without the OS saving YMM state";
    EXPECT_TRUE(__builtin_cpu_supports("avx2"));
  }
  if (isa == Isa::kAvx512) {
    EXPECT_EQ(xcr0 & 0xE6, 0xE6u) << "AVX-512 chosen without the OS saving opmask/ZMM state";
    EXPECT_TRUE(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"));
  }
  // And the choice is the best the state allows.
  if ((xcr0 & 0xE6) == 0xE6 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma")) {
    EXPECT_EQ(isa, Isa::kAvx512);
  }
  RecordProperty("isa", isa_name(isa));
  RecordProperty("xcr0", std::to_string(xcr0));
}

TEST(CpuFeatures, AmxPermissionMatchesTheKernel) {
  const bool granted = amx_request_permission();
  EXPECT_EQ(amx_request_permission(), granted);  // asked once
  if (!cpu_features().amx_int8 && !cpu_features().amx_bf16) {
    EXPECT_FALSE(granted);
    return;
  }
#if defined(__linux__)
  uint64_t perm = 0;
  constexpr long kArchGetXcompPerm = 0x1022;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &perm) == 0) {
    EXPECT_EQ(granted, ((perm >> 18) & 1) != 0) << "permitted xfeatures " << perm;
  }
#endif
}
#endif

}  // namespace
}  // namespace rill::cpu
