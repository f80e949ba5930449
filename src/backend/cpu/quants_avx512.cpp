#include "backend/cpu/kernels.h"
namespace rill::cpu {
void fill_kernels_avx512(Kernels& k) { k.isa = Isa::kAvx512; }
}
