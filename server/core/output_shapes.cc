#include "server/core/output_shapes.h"

#include <limits>

namespace tokensel::core {

uint64_t ViewBytes(const kernels::TensorView& v) {
  for (int d = 0; d < v.rank; ++d) {
    if (v.shape[d] == 0) return 0;
  }
  uint64_t n = static_cast<uint64_t>(v.elem_size());
  for (int d = 0; d < v.rank; ++d) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(v.shape[d]), &n)) {
      return std::numeric_limits<uint64_t>::max();
    }
  }
  return n;
}

}  // namespace tokensel::core
