// Naive single-threaded references for MergeTokens and SplitTokens, written
// from the definitions in docs/ops.md (sections 9-10), independently of
// kernels/: element loops over multi-indices, a linear search for the
// retained position of each token. They trust their inputs (valid args).
#ifndef TOKENSEL_TESTS_KERNELS_MERGE_SPLIT_REFERENCE_H_
#define TOKENSEL_TESTS_KERNELS_MERGE_SPLIT_REFERENCE_H_

#include <cstdint>
#include <cstring>

#include "kernels/tensor_view.h"
#include "tests/kernels/gather_reference.h"

namespace tokensel::testing {

// The r with idx[b, r] == s, or -1.
inline int64_t RefRetainedPosition(const kernels::TensorView& idx, int64_t b, int64_t s) {
  for (int64_t r = 0; r < idx.shape[1]; ++r) {
    if (RefIndex(idx, {b, r}) == s) return r;
  }
  return -1;
}

// Element (b, s, c) of a [B,S,C] (batch_first) / [S,B,C] view.
inline char* RefToken(const kernels::TensorView& v, bool batch_first, int64_t b, int64_t s,
                      int64_t c) {
  return batch_first ? RefElem(v, {b, s, c}) : RefElem(v, {s, b, c});
}

// out[b,s,:] = layer[b,r,:] where idx[b,r] == s, else x[b,s,:]. `out` may
// be `x` itself: a row of x is only ever read for the same row of out.
inline void RefMerge(const kernels::TensorView& x, const kernels::TensorView& layer,
                     const kernels::TensorView& idx, const kernels::TensorView& out,
                     bool batch_first) {
  const int64_t batch = idx.shape[0], seq = x.shape[batch_first ? 1 : 0], channels = x.shape[2];
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < seq; ++s) {
      const int64_t r = RefRetainedPosition(idx, b, s);
      for (int64_t c = 0; c < channels; ++c) {
        const char* src =
            r >= 0 ? RefToken(layer, batch_first, b, r, c) : RefToken(x, batch_first, b, s, c);
        RefCopyElem(RefToken(out, batch_first, b, s, c), src, x);
      }
    }
  }
}

// layer_grad = Gather(grad, idx); rest_grad = grad with the indexed rows set
// to all-zero bytes. When rest_grad is grad itself, layer_grad is read first.
inline void RefSplit(const kernels::TensorView& grad, const kernels::TensorView& idx,
                     const kernels::TensorView& layer_grad, const kernels::TensorView& rest_grad,
                     bool batch_first) {
  RefGather(grad, idx, layer_grad, batch_first);
  const int64_t batch = idx.shape[0], seq = grad.shape[batch_first ? 1 : 0];
  const int64_t channels = grad.shape[2];
  const size_t elem = static_cast<size_t>(kernels::ElementSize(grad.dtype));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < seq; ++s) {
      const bool zero = RefRetainedPosition(idx, b, s) >= 0;
      for (int64_t c = 0; c < channels; ++c) {
        char* dst = RefToken(rest_grad, batch_first, b, s, c);
        if (zero) {
          std::memset(dst, 0, elem);
        } else {
          std::memmove(dst, RefToken(grad, batch_first, b, s, c), elem);
        }
      }
    }
  }
}

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_KERNELS_MERGE_SPLIT_REFERENCE_H_
