// attention_chan_impl.h compiled for AVX2 + FMA + F16C (the same loops,
// vectorized 8 lanes wide; within rounding of the baseline build).
#define RILL_CHAN_ISA avx2
#include "backend/cpu/attention_chan_impl.h"

namespace rill::cpu::detail {

void attend_chan_avx2(const ChanAttendArgs& a) {
  avx2::attend(a);
}

void attend_chan_tile_avx2(const ChanTileArgs& a) {
  avx2::attend_tile(a);
}

}  // namespace rill::cpu::detail
