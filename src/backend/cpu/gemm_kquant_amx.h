#pragma once
// The AMX int8 path of the K-quant gemm for token batches (Q4_K, Q5_K, Q6_K,
// IQ4_XS weights against Q8_K activations; gemm_kquant_amx.cpp), and its
// run-time dispatch (kquant_amx_dispatch.cpp). It computes rill's K-quant
// definition (quants_ref.cpp, quants_iq_ref.cpp) exactly as the AVX-512
// row tile does (gemm_kquant_rows_avx512_impl.h): the same exact int32 per
// super-block, the same float convert and fma per super-block, in the same
// order, so its results equal the row tile's bit for bit.
//
// Dispatch never faults: the entries are installed only when CPUID reports
// AMX-TILE and AMX-INT8, XCR0 has the tile state enabled (bits 17-18), the
// Linux permission request (arch_prctl ARCH_REQ_XCOMP_PERM) was granted and
// AVX-512 VNNI is there (the entries fall back to the table's previous
// entry for calls of few tokens). The environment variable RILL_CPU_AMX=0
// keeps the previous (AVX-512 VNNI) entries; 1 or unset uses AMX where it
// works. Since both compute the same bits, the switch changes speed only.
#include <optional>
#include <string>

#include "backend/cpu/kernels.h"
#include "core/dtype.h"

namespace rill::cpu {

// Whether this CPU and OS can run the AMX path (CPUID, XCR0, AVX-512 VNNI,
// and the permission request, made on the first call).
bool kquant_amx_usable();

// Installs the AMX entries over k's gemm entries for Q4_K, Q5_K, Q6_K and
// IQ4_XS when kquant_amx_usable() and RILL_CPU_AMX is not 0, keeping the
// replaced entries as the fallback for calls of fewer than
// kquant_amx_min_tokens() tokens. RILL_CPU_AMX=0: nothing installed and
// no AMX permission asked.
void fill_kquant_amx(Kernels& k);

// The error for an RILL_CPU_AMX other than unset, 0 or 1 (the CLI refuses
// it at start, before a model loads), or nullopt.
std::optional<std::string> kquant_amx_env_error();

// Calls of fewer token rows take the previous entry.
int kquant_amx_min_tokens();

// For tests and benchmarks (the AVX-512 table is built first): the AMX
// entry for w and the entry it falls back to (the AVX-512 VNNI row tile),
// whatever RILL_CPU_AMX says; nullptr when !kquant_amx_usable() or w has no
// AMX path. The AMX entry takes any token count (fewer than
// kquant_amx_min_tokens() go to the fallback).
GemmTileFn kquant_amx_gemm(DType w);
GemmTileFn kquant_amx_fallback(DType w);

namespace amx_detail {
// Defined in the AMX translation unit (gemm_kquant_amx.cpp, the only one
// compiled with -mamx-*): the entry for w, or nullptr. Call only when
// kquant_amx_usable().
GemmTileFn amx_entry(DType w);
// The fallback entries by dtype id, set by fill_kquant_amx before any AMX
// entry can run.
extern GemmTileFn g_fallback[kNumDTypeIds];
inline constexpr int kMinTokens = 32;
}  // namespace amx_detail

}  // namespace rill::cpu
