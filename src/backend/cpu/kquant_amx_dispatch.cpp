// Run-time dispatch of the AMX K-quant gemm (gemm_kquant_amx.h). Compiled
// without AMX or AVX-512 flags: it decides, the AMX translation unit runs.
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/gemm_kquant_amx.h"

namespace rill::cpu {

namespace amx_detail {
GemmTileFn g_fallback[kNumDTypeIds] = {};
}  // namespace amx_detail

namespace {

constexpr DType kAmxTypes[] = {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kIQ4_XS};

// RILL_CPU_AMX: unset or "1" -> true, "0" -> false. Any other value is
// refused by the CLI before a model loads (kquant_amx_env_error); a program
// that embeds the engine without that check gets the default.
bool amx_wanted() {
  const char* env = std::getenv("RILL_CPU_AMX");
  return env == nullptr || std::strcmp(env, "0") != 0;
}

}  // namespace

std::optional<std::string> kquant_amx_env_error() {
  const char* env = std::getenv("RILL_CPU_AMX");
  if (env == nullptr || std::strcmp(env, "0") == 0 || std::strcmp(env, "1") == 0) return std::nullopt;
  return std::string("RILL_CPU_AMX: expected 0 or 1, got '") + env + "'";
}

bool kquant_amx_usable() {
  static const bool usable = [] {
    const CpuFeatures& f = cpu_features();
    // amx_int8: CPUID AMX-TILE + AMX-INT8 and XCR0 bits 17-18; then Linux's permission.
    return f.amx_int8 && f.avx512_vnni && amx_request_permission();
  }();
  return usable;
}

int kquant_amx_min_tokens() {
  return amx_detail::kMinTokens;
}

void fill_kquant_amx(Kernels& k) {
  for (DType t : kAmxTypes) amx_detail::g_fallback[static_cast<size_t>(t)] = k.gemm[static_cast<size_t>(t)];
  // Not wanted: no permission asked either (Linux would give the process
  // AMX's larger signal frames for nothing).
  if (!amx_wanted() || !kquant_amx_usable()) return;
  for (DType t : kAmxTypes) k.gemm[static_cast<size_t>(t)] = amx_detail::amx_entry(t);
}

GemmTileFn kquant_amx_gemm(DType w) {
  if (!kquant_amx_usable()) return nullptr;
  (void)kernels(Isa::kAvx512);  // sets the fallbacks
  return amx_detail::amx_entry(w);
}

GemmTileFn kquant_amx_fallback(DType w) {
  if (!kquant_amx_usable() || amx_detail::amx_entry(w) == nullptr) return nullptr;
  (void)kernels(Isa::kAvx512);
  return amx_detail::g_fallback[static_cast<size_t>(w)];
}

}  // namespace rill::cpu
