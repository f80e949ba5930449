#include "backend/cpu/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace rill::cpu {
namespace {

#if defined(__x86_64__) || defined(__i386__)
CpuidBits read_cpuid() {
  CpuidBits b;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return b;
  b.osxsave = (ecx >> 27) & 1;
  b.avx = (ecx >> 28) & 1;
  b.fma = (ecx >> 12) & 1;
  b.f16c = (ecx >> 29) & 1;
  if (__get_cpuid_max(0, nullptr) < 7) return b;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  b.avx2 = (ebx >> 5) & 1;
  b.avx512f = (ebx >> 16) & 1;
  b.avx512dq = (ebx >> 17) & 1;
  b.avx512bw = (ebx >> 30) & 1;
  b.avx512vl = (ebx >> 31) & 1;
  b.avx512vnni = (ecx >> 11) & 1;
  b.amx_bf16 = (edx >> 22) & 1;
  b.amx_tile = (edx >> 24) & 1;
  b.amx_int8 = (edx >> 25) & 1;
  return b;
}

// XGETBV(0) by opcode (no -mxsave needed); only valid when OSXSAVE is set.
uint64_t read_xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}
#endif

}  // namespace

CpuFeatures derive_features(const CpuidBits& b, uint64_t xcr0) {
  CpuFeatures f;
  f.cpuid = b;
  f.xcr0 = b.osxsave ? xcr0 : 0;
  const bool os_ymm = (f.xcr0 & (kXcr0Sse | kXcr0Avx)) == (kXcr0Sse | kXcr0Avx);
  const uint64_t zmm = kXcr0Opmask | kXcr0ZmmHi256 | kXcr0Hi16Zmm;
  const bool os_zmm = os_ymm && (f.xcr0 & zmm) == zmm;
  const bool os_tiles = (f.xcr0 & (kXcr0TileCfg | kXcr0TileData)) == (kXcr0TileCfg | kXcr0TileData);
  f.avx2 = os_ymm && b.avx && b.avx2 && b.fma && b.f16c;
  f.avx512 = f.avx2 && os_zmm && b.avx512f && b.avx512bw && b.avx512vl && b.avx512dq;
  f.avx512_vnni = f.avx512 && b.avx512vnni;
  f.amx_int8 = os_tiles && b.amx_tile && b.amx_int8;
  f.amx_bf16 = os_tiles && b.amx_tile && b.amx_bf16;
  return f;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
#if defined(__x86_64__) || defined(__i386__)
    const CpuidBits b = read_cpuid();
    return derive_features(b, b.osxsave ? read_xcr0() : 0);
#else
    return CpuFeatures{};
#endif
  }();
  return features;
}

bool amx_request_permission() {
  static const bool granted = [] {
    const CpuFeatures& f = cpu_features();
    if (!f.amx_int8 && !f.amx_bf16) return false;
#if defined(__linux__) && defined(__x86_64__)
    constexpr long kArchReqXcompPerm = 0x1023;  // ARCH_REQ_XCOMP_PERM
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return granted;
}

Isa isa_for(const CpuFeatures& f) {
  return f.avx512 ? Isa::kAvx512 : f.avx2 ? Isa::kAvx2 : Isa::kScalar;
}

Isa best_isa() {
  static const Isa isa = isa_for(cpu_features());
  return isa;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

}  // namespace rill::cpu
