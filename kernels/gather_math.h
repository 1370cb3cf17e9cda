// Index arithmetic of GatherTokens, ScatterTokens, GatherBertMask and
// SliceGptMask, shared by the CPU operators and the CUDA twin (TOKENSEL_HD).
//
// All offsets are 64-bit element offsets relative to a view's data pointer,
// valid only for views that passed the op's Validate<Op>() (which bounds every
// extent in int64). Nothing here dereferences tensor data (index elements
// are read with LoadIndex from tensor_view.h, which allows any alignment).
#ifndef TOKENSEL_KERNELS_GATHER_MATH_H_
#define TOKENSEL_KERNELS_GATHER_MATH_H_

#include <cstdint>

#include "kernels/hd.h"
#include "kernels/tensor_view.h"

namespace tokensel::kernels {

// Element offset of index `pos` of row `row` of an index view whose last
// dimension is the row ([B,R] or [L,B,R]).
TOKENSEL_HD int64_t IndexOffset(const TensorView& indices, int64_t row, int64_t pos) {
  return RowOffset(indices, row) + pos * indices.strides[indices.rank - 1];
}

// Sizes of a token gather/scatter. `tokens` is the [B,S,C] / [S,B,C] tensor
// (activations or all), `indices` is [B,R].
struct TokenDims {
  int64_t batch = 0;     // B
  int64_t seq = 0;       // S
  int64_t retained = 0;  // R
  int64_t channels = 0;  // C
};

TOKENSEL_HD TokenDims GetTokenDims(const TensorView& tokens, const TensorView& indices,
                                   bool batch_first) {
  TokenDims d;
  d.batch = tokens.shape[batch_first ? 0 : 1];
  d.seq = tokens.shape[batch_first ? 1 : 0];
  d.retained = indices.shape[1];
  d.channels = tokens.shape[2];
  return d;
}

// Element offset of token (b, s) (channel 0) of a [B,S,C] (batch_first) or
// [S,B,C] view. Also used for the retained side: token (b, r) of [B,R,C] /
// [R,B,C].
TOKENSEL_HD int64_t TokenOffset(const TensorView& v, bool batch_first, int64_t b, int64_t s) {
  return batch_first ? b * v.strides[0] + s * v.strides[1] : s * v.strides[0] + b * v.strides[1];
}

// Dense row numbering of the retained side ([B,R,C] or [R,B,C]): row `row`
// in that tensor's own leading-dim order maps to (b, r). Iterating rows in
// this order walks the retained tensor sequentially.
struct BatchPos {
  int64_t b = 0;
  int64_t r = 0;
};

TOKENSEL_HD BatchPos RetainedRowToBatchPos(int64_t row, int64_t batch, int64_t retained,
                                           bool batch_first) {
  BatchPos p;
  if (batch_first) {
    p.b = row / retained;
    p.r = row % retained;
  } else {
    p.r = row / batch;
    p.b = row % batch;
  }
  return p;
}

// GatherBertMask. mask [B,H,Sq,S], indices [L,B,R], out [L,B,H,R,R].
// Output row `row` (of L*B*H*R rows of R elements) is (l, b, h, i).
struct BertMaskRow {
  int64_t l = 0;
  int64_t b = 0;
  int64_t h = 0;
  int64_t i = 0;
};

TOKENSEL_HD BertMaskRow BertMaskRowOf(const TensorView& out, int64_t row) {
  BertMaskRow m;
  m.i = row % out.shape[3];
  row /= out.shape[3];
  m.h = row % out.shape[2];
  row /= out.shape[2];
  m.b = row % out.shape[1];
  m.l = row / out.shape[1];
  return m;
}

// Element offset of out[l,b,h,i,0].
TOKENSEL_HD int64_t BertMaskOutOffset(const TensorView& out, const BertMaskRow& m) {
  return m.l * out.strides[0] + m.b * out.strides[1] + m.h * out.strides[2] + m.i * out.strides[3];
}

// Element offset of mask[b, h, Sq == 1 ? 0 : query, 0]; add key * strides[3].
TOKENSEL_HD int64_t BertMaskSourceRowOffset(const TensorView& mask, int64_t b, int64_t h,
                                            int64_t query) {
  const int64_t q = mask.shape[2] == 1 ? 0 : query;
  return b * mask.strides[0] + h * mask.strides[1] + q * mask.strides[2];
}

// Index-tensor row (of L*B rows) that output row (l, b, ...) reads.
TOKENSEL_HD int64_t BertMaskIndexRow(const TensorView& indices, const BertMaskRow& m) {
  return m.l * indices.shape[1] + m.b;
}

// SliceGptMask. mask [B,H,S,S], out [B,H,R,R]. Output row `row` (of B*H*R)
// is (b, h, i); returns the element offsets of out[b,h,i,0] and mask[b,h,i,0].
struct GptMaskRowOffsets {
  int64_t out = 0;
  int64_t mask = 0;
};

TOKENSEL_HD GptMaskRowOffsets GptMaskRowOffsetsOf(const TensorView& mask, const TensorView& out,
                                                  int64_t row) {
  const int64_t i = row % out.shape[2];
  row /= out.shape[2];
  const int64_t h = row % out.shape[1];
  const int64_t b = row / out.shape[1];
  GptMaskRowOffsets o;
  o.out = b * out.strides[0] + h * out.strides[1] + i * out.strides[2];
  o.mask = b * mask.strides[0] + h * mask.strides[1] + i * mask.strides[2];
  return o;
}

}  // namespace tokensel::kernels

#endif  // TOKENSEL_KERNELS_GATHER_MATH_H_
