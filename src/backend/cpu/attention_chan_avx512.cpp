// attention_chan_impl.h compiled for AVX-512 (the same loops, vectorized
// 16 lanes wide; within rounding of the baseline build).
#define RILL_CHAN_ISA avx512
#include "backend/cpu/attention_chan_impl.h"

namespace rill::cpu::detail {

void attend_chan_avx512(const ChanAttendArgs& a) {
  avx512::attend(a);
}

}  // namespace rill::cpu::detail
