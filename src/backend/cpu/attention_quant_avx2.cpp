// attention_quant_impl.h compiled with -mavx2 -mfma -mf16c.
#define RILL_QUANT_ISA avx2
#include "backend/cpu/attention_quant_impl.h"

namespace rill::cpu::detail {

KvDequant kv_dequant_avx2(DType t) {
  return avx2::dequant_for(t);
}
void attend_quant_avx2(const QuantAttendArgs& a) {
  avx2::attend(a);
}

}  // namespace rill::cpu::detail
