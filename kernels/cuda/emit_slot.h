// The output slot rule of the in-order emission of a radix select
// (BlockEmitSelected in select.cuh), as a TOKENSEL_HD function without CUDA
// includes so host tests check it (tests/kernels/cuda/emit_slot_test.cc).
//
// A row's r selected positions are every key > T plus the first `ties` keys
// == T; a position whose earlier positions hold `gt_before` keys > T and
// `eq_before` keys == T goes to slot gt_before + min(eq_before, ties).
//
// Bounded by the row: TopKTokens recomputes the keys from client scores on
// every pass, and a client may rewrite them between the passes that found T
// and the emission pass. Then more than r keys may be > T (or ties may be
// stale) and the slot can reach past r. EmitSlot returns -1 for any slot >=
// r, so every write stays inside the output row; the selection is then wrong
// but in bounds, and slots stay distinct (they increase along the row).
#ifndef TOKENSEL_KERNELS_CUDA_EMIT_SLOT_H_
#define TOKENSEL_KERNELS_CUDA_EMIT_SLOT_H_

#include <cstdint>

#include "kernels/hd.h"

namespace tokensel::kernels::cuda {

// The slot in [0, r) of a position whose key is > T (`is_gt`) or == T
// (`is_eq`), or -1 when it is not taken (or would fall outside the row).
TOKENSEL_HD int64_t EmitSlot(bool is_gt, bool is_eq, int64_t gt_before, int64_t eq_before,
                             int64_t ties, int64_t r) {
  const bool taken = is_gt || (is_eq && eq_before < ties);
  if (!taken) return -1;
  const int64_t slot = gt_before + (eq_before < ties ? eq_before : ties);
  return slot < r ? slot : -1;
}

}  // namespace tokensel::kernels::cuda

#endif  // TOKENSEL_KERNELS_CUDA_EMIT_SLOT_H_
