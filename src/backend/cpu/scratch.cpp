#include "backend/cpu/ops.h"

namespace rill::cpu {

void Scratch::reserve(size_t bytes) {
  // 64 bytes of slack so kernels may align the start to a cache line.
  if (buf_.size() < bytes + 64) buf_.resize(bytes + 64);
}

}  // namespace rill::cpu
