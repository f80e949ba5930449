#pragma once
// What the CPU we run on supports, read once with cpuid. Kernels compiled
// for AVX2 / AVX-512 (files *_avx2.cpp / *_avx512.cpp) are only called when
// these say the instructions exist.
namespace rill::cpu {

enum class Isa { kScalar, kAvx2, kAvx512 };

struct CpuFeatures {
  bool avx2 = false;    // with FMA and F16C
  bool avx512 = false;  // F, BW, VL, DQ
  bool avx512_vnni = false;
};

const CpuFeatures& cpu_features();

// The best ISA this CPU supports: the kernel table every model uses. The
// lower tables are tested through kernels(Isa) (tests/backend); the
// environment switch that lowered this one for whole runs (RILL_CPU_ISA)
// is gone: the tables are process-wide, so it could not be a ModelOptions
// field, and no script, benchmark or test set it. The CPU models'
// Model::kv_numerics() names the ISA, since the tables' sums differ.
Isa best_isa();
const char* isa_name(Isa isa);

}  // namespace rill::cpu
