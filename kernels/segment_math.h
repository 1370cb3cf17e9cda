// Per-token and per-run arithmetic of SegmentSeqlens (op 6), shared by the CPU
// implementation (kernels/cpu/segment_seqlens.cc) and its future CUDA twin so
// both make exactly the same decisions. No CUDA includes, no tensor access:
// callers load ids/positions and feed these functions.
//
// Row model (after validation): a row is a sequence of maximal runs of equal
// ids. Id 0 is padding; every non-zero id v in [1, NS] forms exactly one run,
// and the non-zero ids strictly increase along the row. Hence a side has at
// most NS segments and "run length of id v" == "count of id v".
//
// Cross-attention keeps a token iff some token of the same id on the other
// side is visible to it (spec section 6). With per-id aggregates
// (cnt, minpos, maxpos) of both sides this is an O(1) predicate per token:
//   keep q : PADDING cnt_kv > 0;  CAUSAL pos_q >= minpos_kv;
//            CAUSAL_BOTTOM_RIGHT cnt_q - pos_q <= cnt_kv - minpos_kv
//   keep kv: PADDING cnt_q > 0;   CAUSAL pos_kv <= maxpos_q;
//            CAUSAL_BOTTOM_RIGHT cnt_kv - pos_kv >= cnt_q - maxpos_q
// (an id absent on the other side is never kept). The core then runs on the
// kept-id stream: a run starts at t iff kept_id[t] != 0 and
// kept_id[t] != kept_id[t-1]; offset = first NS+1 run starts (fill -1);
// seqlen[v-1] = number of kept tokens with id v (fill 0).
//
// Positions are read only when the predicate needs them (cross-attention with
// CAUSAL or CAUSAL_BOTTOM_RIGHT) and only for non-padding tokens.
#ifndef TOKENSEL_KERNELS_SEGMENT_MATH_H_
#define TOKENSEL_KERNELS_SEGMENT_MATH_H_

#include <cstdint>

#include "kernels/hd.h"
#include "kernels/ops.h"

namespace tokensel::kernels {

// Per-(row, side, id) aggregate. cnt == 0 means the id is absent on that side
// (minpos/maxpos are then meaningless).
struct SegmentAgg {
  int64_t cnt = 0;
  int64_t minpos = 0;
  int64_t maxpos = 0;
  int64_t start = 0;  // first token of the id's run (lets a second pass skip the ids)
};

// True when the keep predicate reads positions.
TOKENSEL_HD bool SegmentMaskNeedsPositions(bool cross, AttnMaskType mask) {
  return cross && mask != AttnMaskType::kPadding;
}

// Every keep predicate is a threshold on a per-id key: a q token at position
// pos is kept iff a - pos <= c, a kv token iff a - pos >= c, with (a, c)
// fixed per (row, id). No overflow: 0 <= a <= 2^31 and 0 <= pos < 2^63.
//   q : CAUSAL a = 0, c = -minpos_kv;   BRCM a = cnt_q,  c = cnt_kv - minpos_kv
//   kv: CAUSAL a = 0, c = -maxpos_q;    BRCM a = cnt_kv, c = cnt_q - maxpos_q
// PADDING keeps every token of an id present on both sides (a = c = 0 with
// pos taken as 0). `present` is false when the id is absent on either side.
struct SegmentKeepRule {
  bool present = false;
  int64_t a = 0;
  int64_t c = 0;
};

TOKENSEL_HD SegmentKeepRule SegmentQRule(AttnMaskType mask, const SegmentAgg& q,
                                         const SegmentAgg& kv) {
  if (q.cnt == 0 || kv.cnt == 0) return {};
  if (mask == AttnMaskType::kCausal) return {true, 0, -kv.minpos};
  if (mask == AttnMaskType::kCausalBottomRight) return {true, q.cnt, kv.cnt - kv.minpos};
  return {true, 0, 0};
}

TOKENSEL_HD SegmentKeepRule SegmentKvRule(AttnMaskType mask, const SegmentAgg& q,
                                          const SegmentAgg& kv) {
  if (q.cnt == 0 || kv.cnt == 0) return {};
  if (mask == AttnMaskType::kCausal) return {true, 0, -q.maxpos};
  if (mask == AttnMaskType::kCausalBottomRight) return {true, kv.cnt, q.cnt - q.maxpos};
  return {true, 0, 0};
}

TOKENSEL_HD bool SegmentKeepQ(const SegmentKeepRule& rule, int64_t pos_q) {
  return rule.present && rule.a - pos_q <= rule.c;
}
TOKENSEL_HD bool SegmentKeepKv(const SegmentKeepRule& rule, int64_t pos_kv) {
  return rule.present && rule.a - pos_kv >= rule.c;
}

// Data-error kinds, in the order a token is checked: id range, then the run
// structure (at the first token of a run), then the position (non-padding
// tokens, only when positions are read).
enum class SegmentErrorKind : uint8_t {
  kNone = 0,
  kIdOutOfRange,   // id < 0 or id > NS
  kPaddingInside,  // id == previous segment's id with padding in between
  kNotIncreasing,  // id < previous segment's id (decreasing or repeated)
  kNegativePosition,
};

// The first data error of one row (lowest token of the q side, else of the kv
// side). `token` is the position in the row, `value` the offending id or
// position, `prev_id` the id of the previous segment (structure errors).
struct SegmentError {
  SegmentErrorKind kind = SegmentErrorKind::kNone;
  bool kv_side = false;
  bool position = false;  // the offending tensor is segment_pos_* (else ids)
  int64_t token = -1;
  int64_t value = 0;
  int64_t prev_id = 0;
};

// Classifies the first token of a maximal run with id `id`, given the id of
// the previous non-padding run (`last_id`, 0 if none) and NS. Padding runs
// (id 0) are always fine.
TOKENSEL_HD SegmentErrorKind SegmentCheckRunStart(int64_t id, int64_t last_id, int64_t ns) {
  if (id < 0 || id > ns) return SegmentErrorKind::kIdOutOfRange;
  if (id == 0) return SegmentErrorKind::kNone;
  // Runs are maximal, so id == last_id implies padding in between.
  if (id == last_id) return SegmentErrorKind::kPaddingInside;
  if (id < last_id) return SegmentErrorKind::kNotIncreasing;
  return SegmentErrorKind::kNone;
}

// Scratch the CPU implementation uses per row: the staged outputs of each
// side (seqlen [NS] + offset [NS+1], int32) plus, for cross-attention, the
// per-id aggregates of both sides (2 x (NS+1) SegmentAgg). O(NS), never O(T).
TOKENSEL_HD int64_t SegmentSeqlensScratchBytesPerRow(int64_t ns, bool cross) {
  const int64_t sides = cross ? 2 : 1;
  const int64_t staged = sides * (2 * ns + 1) * static_cast<int64_t>(sizeof(int32_t));
  const int64_t aggs = cross ? 2 * (ns + 1) * static_cast<int64_t>(sizeof(SegmentAgg)) : 0;
  return staged + aggs;
}

}  // namespace tokensel::kernels

#endif  // TOKENSEL_KERNELS_SEGMENT_MATH_H_
