// What the op homes (server/core/ops/) derive for an output returned inline,
// and the byte count of a view they report as bytes moved.
//
// Each op's shape derivations live in its own ops/<op>.h, beside its
// bytes-moved formula. A derivation checks only what it needs to compute a
// shape (input ranks, non-negative scalars, no overflow) and names the
// offending field; every other rule is left to the kernels' own validation,
// which runs afterwards on the full set of views.
#ifndef TOKENSEL_SERVER_CORE_OUTPUT_SHAPES_H_
#define TOKENSEL_SERVER_CORE_OUTPUT_SHAPES_H_

#include <cstdint>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/tensor_view.h"

namespace tokensel::core {

struct OutputShape {
  kernels::DType dtype = kernels::DType::kInt32;
  std::vector<int64_t> shape;
  // The op accepts int32 or int64 here (ids outputs): a requested dtype of
  // either is honoured, `dtype` is the default.
  bool index_dtype_choice = false;
};

// Logical bytes of a view (elements x element size, strides ignored); 0 for
// an empty view; saturating (a broadcast input may have more elements than
// bytes).
uint64_t ViewBytes(const kernels::TensorView& v);

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_OUTPUT_SHAPES_H_
