// CPU SegmentSeqlens (op 6): Transformer Engine THD seqlens/offsets in O(T).
//
// Phase 1 (rows in parallel): each row is walked run by run (a run = maximal
// stretch of equal ids, found with a blocked SIMD-friendly scan on contiguous
// rows). The first token of every run is validated (segment_math.h), so a
// valid row costs one read of its ids. Self-attention stages seqlen = run
// length and offset = run start directly. Cross-attention first builds the
// per-id aggregates (cnt, minpos, maxpos, start) of both sides, then walks the
// runs again from the aggregates (no second read of the ids) applying the keep
// predicate per token (positions only for causal masks). Results are staged in
// O(NS) scratch per row; the first error (lowest row, q before kv, lowest
// token) is reported before any output is written.
// Phase 2 (rows in parallel): copy the staged rows to the outputs and, for the
// packed layout, scatter each row's compacted entries at bases from a serial
// exclusive scan over B; every row also fills its share of the tails.
//
// Racing clients. The ids and positions are the whole input, so instead of
// snapshotting them (twice the memory traffic of the op) every read is made
// safe where it is used, whatever the client writes meanwhile:
//  - An id that picks an output slot or an aggregate (seqlen[v-1], agg[v]) is
//    read once, at the run's first token, checked in [0, NS] there and kept in
//    a register; RunEnd() compares later tokens with that value and never
//    reads the first token again. Every run ends inside the row (t < end <= T),
//    so lengths, starts and sums stay in [0, T] and every staged offset count
//    is capped at NS+1: phase 2 writes only slots the staging bounds.
//  - Positions are only data: they decide which tokens are kept (counts <= the
//    run length), never an address. Each position is loaded once per use, the
//    min/max of a run come from the same loads, and the negative-position
//    search for the message stays inside the run: if the client has made the
//    position non-negative again, the run's first token is named with the
//    minimum that was seen. The keep keys are computed in wrapping unsigned
//    arithmetic, so a position rewritten to INT_MIN is not an overflow.
//  - Staging, totals and aggregates are private; phase 2 reads only them.
// Runs longer than kStopSpan tokens (a zero-strided id view is one run of up
// to 2^31 tokens from a tiny request) check the stop token every kStopSpan
// tokens; shorter runs take the plain scan.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/status_macros.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/scratch.h"
#include "kernels/segment_math.h"
#include "kernels/validate.h"
#include "kernels/validate_segments.h"

namespace tokensel::kernels::cpu {
namespace {

// Reads element t of one row of a [B, T] index tensor (unaligned-safe).
template <typename T, bool kContig>
struct RowReader {
  using Type = T;
  static constexpr bool kContiguous = kContig;
  const char* p = nullptr;
  int64_t stride = 1;  // elements; ignored when kContig
  T operator[](int64_t t) const {
    T v;
    // A null reader (no positions) is never read (DispatchRow); the analyzer
    // cannot see that through the generic callers.
    // NOLINTNEXTLINE(clang-analyzer-core.NonNullParamChecker)
    std::memcpy(&v, p + (kContig ? t : t * stride) * static_cast<int64_t>(sizeof(T)), sizeof(T));
    return v;
  }
};

template <typename T, bool kContig>
RowReader<T, kContig> MakeReader(const TensorView& v, int64_t row) {
  if (v.data == nullptr) return {};
  return {v.At(row * v.strides[0]), v.strides[1]};
}

bool RowContiguous(const TensorView& v) { return v.shape[1] <= 1 || v.strides[1] == 1; }

// Calls fn(ids_reader, pos_reader) for row `row`. Without positions the pos
// reader is a null reader that must not be read.
template <typename Fn>
void DispatchRow(const TensorView& ids, const TensorView* pos, int64_t row, Fn&& fn) {
  auto with_ids = [&](auto contig_tag) {
    constexpr bool kC = decltype(contig_tag)::value;
    auto with_pos = [&](auto id_reader) {
      if (pos == nullptr) {
        fn(id_reader, RowReader<int32_t, kC>{});
      } else if (pos->dtype == DType::kInt64) {
        fn(id_reader, MakeReader<int64_t, kC>(*pos, row));
      } else {
        fn(id_reader, MakeReader<int32_t, kC>(*pos, row));
      }
    };
    if (ids.dtype == DType::kInt64) {
      with_pos(MakeReader<int64_t, kC>(ids, row));
    } else {
      with_pos(MakeReader<int32_t, kC>(ids, row));
    }
  };
  if (RowContiguous(ids) && (pos == nullptr || RowContiguous(*pos))) {
    with_ids(std::true_type{});
  } else {
    with_ids(std::false_type{});
  }
}

// Advances t over whole blocks of kBlock ids equal to v. The OR of XORs is a
// branch-free reduction the compiler vectorizes.
template <int64_t kBlock, typename R>
int64_t SkipEqualBlocks(const R& ids, int64_t t, int64_t n, typename R::Type v) {
  using T = typename R::Type;
  while (t + kBlock <= n) {
    T differs = 0;
    for (int64_t i = 0; i < kBlock; ++i) differs |= static_cast<T>(ids[t + i] ^ v);
    if (differs != 0) break;
    t += kBlock;
  }
  return t;
}

// Tokens of a long run between two stop checks.
constexpr int64_t kStopSpan = int64_t{1} << 16;

// The first index in [t, end) whose id differs from v, or end.
template <typename R>
int64_t SkipEqual(const R& ids, int64_t t, int64_t end, typename R::Type v) {
  if constexpr (R::kContiguous) {
    t = SkipEqualBlocks<256 / sizeof(typename R::Type)>(ids, t, end, v);
    t = SkipEqualBlocks<32 / sizeof(typename R::Type)>(ids, t, end, v);
  }
  while (t < end && ids[t] == v) ++t;
  return t;
}

// RunEnd for a run that may be longer than kStopSpan: span by span, checking
// the stop token between spans (kept out of line, off the hot path). On a
// stop, n (the caller's row is abandoned; the phase's CheckStop() reports).
template <typename R>
__attribute__((noinline)) int64_t LongRunEnd(const R& ids, int64_t t, int64_t n,
                                             typename R::Type v) {
  for (;;) {
    const int64_t end = n - t > kStopSpan ? t + kStopSpan : n;
    t = SkipEqual(ids, t, end, v);
    if (t < end || end == n) return t;
    if (!CheckStop().ok()) return n;
  }
}

// End of the run of id `v` starting at t (ids[t] was read as v): the first
// index after t whose id differs from v, in (t, n]. On a stop, n.
template <typename R>
int64_t RunEnd(const R& ids, int64_t t, int64_t n, typename R::Type v) {
  using T = typename R::Type;
  ++t;
  if (n - t > kStopSpan) return LongRunEnd(ids, t, n, v);
  if constexpr (R::kContiguous) {
    // 256-byte blocks, then 32-byte blocks, then single ids.
    t = SkipEqualBlocks<256 / sizeof(T)>(ids, t, n, v);
    t = SkipEqualBlocks<32 / sizeof(T)>(ids, t, n, v);
  }
  while (t < n && ids[t] == v) ++t;
  return t;
}

// Staged outputs of one (row, side): seqlen [NS] then offset [NS+1].
struct Stage {
  int32_t* seqlen;
  int32_t* offset;
  int64_t num_offsets = 0;  // run starts recorded (<= NS+1)
};

void PushOffset(Stage* st, int64_t ns, int64_t t) {
  if (st->num_offsets < ns + 1) st->offset[st->num_offsets++] = static_cast<int32_t>(t);
}

// Self-attention row: validate and stage in one pass over the ids.
template <typename IdR>
SegmentError SelfRow(const IdR& ids, int64_t n, int64_t ns, Stage* st) {
  int64_t last = 0;
  for (int64_t t = 0; t < n;) {
    const typename IdR::Type id = ids[t];  // the one read of this run's id
    const int64_t v = id;
    const SegmentErrorKind kind = SegmentCheckRunStart(v, last, ns);
    if (kind != SegmentErrorKind::kNone) return {kind, false, false, t, v, last};
    const int64_t end = RunEnd(ids, t, n, id);
    if (v != 0) {
      st->seqlen[v - 1] = static_cast<int32_t>(end - t);
      PushOffset(st, ns, t);
      last = v;
    }
    t = end;
  }
  return {};
}

// Cross-attention pass 1 for one side: validate, fill agg[0..NS] (cnt == 0
// for absent ids; caller zeroed cnt).
template <typename IdR, typename PosR>
SegmentError AggregateSide(const IdR& ids, const PosR& pos, bool read_pos, int64_t n, int64_t ns,
                           bool kv_side, SegmentAgg* agg) {
  int64_t last = 0;
  for (int64_t t = 0; t < n;) {
    const typename IdR::Type id = ids[t];  // the one read of this run's id
    const int64_t v = id;
    const SegmentErrorKind kind = SegmentCheckRunStart(v, last, ns);
    if (kind != SegmentErrorKind::kNone) return {kind, kv_side, false, t, v, last};
    const int64_t end = RunEnd(ids, t, n, id);
    if (v != 0) {
      SegmentAgg& a = agg[v];
      a.cnt = end - t;
      a.start = t;
      if (read_pos) {
        using P = typename PosR::Type;
        P lo = pos[t];
        P hi = lo;
        for (int64_t span = t + 1; span < end; span += kStopSpan) {
          const int64_t span_end = std::min(end, span + kStopSpan);
          for (int64_t i = span; i < span_end; ++i) {
            const P p = pos[i];
            lo = p < lo ? p : lo;
            hi = p > hi ? p : hi;
          }
          if (span_end < end && !CheckStop().ok()) return {};
        }
        if (lo < 0) {
          // The first negative position, searched inside the run only.
          for (int64_t i = t; i < end; ++i) {
            const P p = pos[i];
            if (p < 0) return {SegmentErrorKind::kNegativePosition, kv_side, true, i, p, last};
          }
          return {SegmentErrorKind::kNegativePosition, kv_side, true, t, lo, last};
        }
        a.minpos = lo;
        a.maxpos = hi;
      }
      last = v;
    }
    t = end;
  }
  return {};
}

// Cross-attention pass 2 for one side: walk the side's runs in order of
// appearance (= increasing id) and stage the kept-id stream's core.
template <bool kQSide, typename PosR>
void KeepSide(const PosR& pos, int64_t ns, AttnMaskType mask, const SegmentAgg* self,
              const SegmentAgg* other, Stage* st) {
  for (int64_t v = 1; v <= ns; ++v) {
    const SegmentAgg& mine = self[v];
    if (mine.cnt == 0 || other[v].cnt == 0) continue;
    if (mask == AttnMaskType::kPadding) {  // the whole run is kept
      st->seqlen[v - 1] = static_cast<int32_t>(mine.cnt);
      PushOffset(st, ns, mine.start);
      continue;
    }
    // The token before the run has another id (or is padding), so a kept
    // token right at the start always begins a new run of the kept stream.
    const SegmentKeepRule rule =
        kQSide ? SegmentQRule(mask, mine, other[v]) : SegmentKvRule(mask, other[v], mine);
    // Keys in the position type: for int32 positions a - pos and c fit int32
    // (a, |c| <= T - 1 + 2^31 - 1 bounds hold since cnt <= T <= 2^31 - 1)
    // for the validated positions (>= 0). The subtraction wraps in unsigned
    // arithmetic: a position a client rewrote since (say to INT_MIN) gives a
    // meaningless key, not an overflow.
    using P = typename PosR::Type;
    using U = std::make_unsigned_t<P>;
    const P a = static_cast<P>(rule.a);
    const P c = static_cast<P>(rule.c);
    auto keep = [&](int64_t t) {
      const P key = static_cast<P>(static_cast<U>(a) - static_cast<U>(pos[t]));
      return kQSide ? key <= c : key >= c;
    };
    // Pass A (branch-free, vectorizable): kept count and kept-run starts.
    const int64_t begin = mine.start;
    const int64_t end = mine.start + mine.cnt;
    int64_t kept = keep(begin) ? 1 : 0;
    int64_t starts = kept;
    for (int64_t span = begin + 1; span < end; span += kStopSpan) {
      const int64_t span_end = std::min(end, span + kStopSpan);
      for (int64_t t = span; t < span_end; ++t) {
        const int cur = keep(t) ? 1 : 0;
        kept += cur;
        starts += cur & (keep(t - 1) ? 0 : 1);
      }
      if (span_end < end && !CheckStop().ok()) return;
    }
    // Pass B: record the starts, stopping after the last one (or when the
    // NS+1 offset slots are full).
    bool prev_kept = false;
    for (int64_t t = begin; t < end && starts > 0 && st->num_offsets < ns + 1; ++t) {
      if (((t - begin) & (kStopSpan - 1)) == kStopSpan - 1 && !CheckStop().ok()) return;
      const bool k = keep(t);
      if (k && !prev_kept) {
        PushOffset(st, ns, t);
        --starts;
      }
      prev_kept = k;
    }
    st->seqlen[v - 1] = static_cast<int32_t>(kept);
  }
}

struct SideInput {
  const TensorView* ids;
  const TensorView* pos;  // null when positions are not read
};

// Per-row summary used by the packed compaction.
struct RowTotals {
  int64_t segments = 0;  // non-zero seqlens
  int64_t offsets = 0;   // recorded offsets
  int64_t tokens = 0;    // sum of seqlens
};

void Summarize(const Stage& st, int64_t ns, RowTotals* totals) {
  totals->offsets = st.num_offsets;
  for (int64_t j = 0; j < ns; ++j) {
    totals->segments += st.seqlen[j] != 0 ? 1 : 0;
    totals->tokens += st.seqlen[j];
  }
}

void Store32(const TensorView& v, int64_t elem_offset, int64_t value) {
  const int32_t x = static_cast<int32_t>(value);
  std::memcpy(v.At(elem_offset), &x, sizeof(x));
}

// out[row, :] = src[0..n) for an int32 [B, n] view.
void WriteRow(const TensorView& out, int64_t row, const int32_t* src, int64_t n) {
  const int64_t base = row * out.strides[0];
  if (n <= 1 || out.strides[1] == 1) {
    std::memcpy(out.At(base), src, static_cast<size_t>(n) * sizeof(int32_t));
    return;
  }
  for (int64_t j = 0; j < n; ++j) Store32(out, base + j * out.strides[1], src[j]);
}

// Writes one side's outputs from the staged rows (stage row stride 2NS+1).
void WriteSide(const SegmentSeqlensSide& side, const int32_t* stage, int64_t stage_stride,
               const std::vector<RowTotals>& totals, int64_t batch, int64_t ns, int64_t row_length,
               ThreadPool* pool) {
  std::vector<int64_t> seg_base(batch + 1, 0);
  std::vector<int64_t> off_base(batch + 1, 0);
  std::vector<int64_t> tok_base(batch + 1, 0);
  for (int64_t b = 0; b < batch; ++b) {
    seg_base[b + 1] = seg_base[b] + totals[b].segments;
    off_base[b + 1] = off_base[b] + totals[b].offsets;
    tok_base[b + 1] = tok_base[b] + totals[b].tokens;
  }
  const PackedSeqlens* packed = side.packed.has_value() ? &*side.packed : nullptr;
  if (packed != nullptr) Store32(packed->cu_seqlens, 0, 0);
  const int64_t fill_offset = batch * row_length;
  const int64_t grain = std::max<int64_t>(1, 4096 / (ns + 1));
  ParallelFor(pool, batch, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int32_t* seqlen = stage + b * stage_stride;
      const int32_t* offset = seqlen + ns;
      WriteRow(side.seqlen, b, seqlen, ns);
      WriteRow(side.offset, b, offset, ns + 1);
      if (packed == nullptr) continue;
      const int64_t s_seq = packed->seqlens.strides[0];
      const int64_t s_off = packed->offsets.strides[0];
      const int64_t s_cu = packed->cu_seqlens.strides[0];
      int64_t i = seg_base[b];
      int64_t sum = tok_base[b];
      for (int64_t j = 0; j < ns; ++j) {
        if (seqlen[j] == 0) continue;
        sum += seqlen[j];
        Store32(packed->seqlens, i * s_seq, seqlen[j]);
        Store32(packed->cu_seqlens, (i + 1) * s_cu, sum);
        ++i;
      }
      for (int64_t k = 0; k < totals[b].offsets; ++k) {
        Store32(packed->offsets, (off_base[b] + k) * s_off, offset[k] + b * row_length);
      }
      // This row's share of the tails: slots [b*NS, (b+1)*NS) of seqlens,
      // [b*NS+1, (b+1)*NS+1) of cu_seqlens, [b*(NS+1), (b+1)*(NS+1)) of offsets.
      for (int64_t x = std::max(seg_base[batch], b * ns); x < (b + 1) * ns; ++x) {
        Store32(packed->seqlens, x * s_seq, 0);
        Store32(packed->cu_seqlens, (x + 1) * s_cu, tok_base[batch]);
      }
      for (int64_t x = std::max(off_base[batch], b * (ns + 1)); x < (b + 1) * (ns + 1); ++x) {
        Store32(packed->offsets, x * s_off, fill_offset);
      }
    }
  });
}

}  // namespace

absl::Status SegmentSeqlens(const SegmentSeqlensArgs& args, ThreadPool* pool) {
  RETURN_IF_ERROR(ValidateSegmentSeqlens(args));
  const int64_t batch = args.segment_ids_q.shape[0];
  const int64_t ns = args.max_segments;
  const bool cross = args.segment_ids_kv.has_value();
  const AttnMaskType mask = args.mask;
  const bool read_pos = SegmentMaskNeedsPositions(cross, mask);
  const SideInput q_in{&args.segment_ids_q, read_pos ? &*args.segment_pos_q : nullptr};
  const SideInput kv_in{cross ? &*args.segment_ids_kv : nullptr,
                        read_pos ? &*args.segment_pos_kv : nullptr};
  const int64_t tq = args.segment_ids_q.shape[1];
  const int64_t tkv = cross ? args.segment_ids_kv->shape[1] : 0;

  // Scratch: staged outputs (O(NS) per row and side) + per-row summaries.
  const int64_t stage_stride = 2 * ns + 1;
  const int sides = cross ? 2 : 1;
  std::vector<int32_t> stage(static_cast<size_t>(batch * sides * stage_stride), 0);
  std::vector<RowTotals> totals(static_cast<size_t>(batch * sides));
  std::vector<SegmentError> errors(static_cast<size_t>(batch));

  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, tq + tkv + ns));
  ParallelFor(pool, batch, grain, [&](int64_t b0, int64_t b1) {
    std::vector<SegmentAgg> agg(cross ? static_cast<size_t>(2 * (ns + 1)) : 0);
    for (int64_t b = b0; b < b1; ++b) {
      Stage st[2];
      for (int s = 0; s < sides; ++s) {
        int32_t* base = stage.data() + (b * sides + s) * stage_stride;
        st[s] = {base, base + ns, 0};
        std::fill(st[s].offset, st[s].offset + ns + 1, -1);
      }
      SegmentError& err = errors[b];
      if (!cross) {
        DispatchRow(*q_in.ids, nullptr, b,
                    [&](const auto& ids, const auto&) { err = SelfRow(ids, tq, ns, &st[0]); });
      } else {
        SegmentAgg* agg_q = agg.data();
        SegmentAgg* agg_kv = agg.data() + ns + 1;
        for (auto& a : agg) a = SegmentAgg{};
        DispatchRow(*q_in.ids, q_in.pos, b, [&](const auto& ids, const auto& pos) {
          err = AggregateSide(ids, pos, read_pos, tq, ns, false, agg_q);
        });
        if (err.kind == SegmentErrorKind::kNone) {
          DispatchRow(*kv_in.ids, kv_in.pos, b, [&](const auto& ids, const auto& pos) {
            err = AggregateSide(ids, pos, read_pos, tkv, ns, true, agg_kv);
          });
        }
        if (err.kind != SegmentErrorKind::kNone) continue;
        DispatchRow(*q_in.ids, q_in.pos, b, [&](const auto&, const auto& pos) {
          KeepSide<true>(pos, ns, mask, agg_q, agg_kv, &st[0]);
        });
        DispatchRow(*kv_in.ids, kv_in.pos, b, [&](const auto&, const auto& pos) {
          KeepSide<false>(pos, ns, mask, agg_kv, agg_q, &st[1]);
        });
      }
      if (err.kind != SegmentErrorKind::kNone) continue;
      for (int s = 0; s < sides; ++s) Summarize(st[s], ns, &totals[b * sides + s]);
    }
  });

  // Skipped chunks left rows unstaged (and unchecked): stop before using any.
  RETURN_IF_ERROR(CheckStop());
  for (int64_t b = 0; b < batch; ++b) {
    const SegmentError& err = errors[b];
    if (err.kind == SegmentErrorKind::kNone) continue;
    const SideInput& in = err.kv_side ? kv_in : q_in;
    const TensorView& view = err.position ? *in.pos : *in.ids;
    return SegmentDataError(view, SegmentErrorField(err), b, err, ns);
  }

  // Every row is valid: write.
  for (int s = 0; s < sides; ++s) {
    std::vector<RowTotals> side_totals(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) side_totals[b] = totals[b * sides + s];
    const SegmentSeqlensSide& out = s == 0 ? args.q : *args.kv;
    // (stage is empty when B == 0: no pointer arithmetic on its null data.)
    const int32_t* side_stage = stage.empty() ? nullptr : stage.data() + s * stage_stride;
    WriteSide(out, side_stage, sides * stage_stride, side_totals, batch, ns, s == 0 ? tq : tkv,
              pool);
    RETURN_IF_ERROR(CheckStop());
  }
  return absl::OkStatus();
}

uint64_t ScratchBytes(const SegmentSeqlensArgs& args, int threads) {
  if (!ValidateSegmentSeqlens(args).ok()) return kStatusScratchBytes;
  const int64_t batch = args.segment_ids_q.shape[0];
  const int64_t ns = args.max_segments;
  const bool cross = args.segment_ids_kv.has_value();
  const int64_t sides = cross ? 2 : 1;
  // stage + totals + errors, alive for the whole call.
  const uint64_t fixed = SatAdd(SatAdd(SatMul3(batch * sides, 2 * ns + 1, sizeof(int32_t)),
                                       SatMul3(batch, sides, sizeof(RowTotals))),
                                SatMul3(batch, sizeof(SegmentError), 1));
  // Phase 1: the aggregates of both sides per live chunk (cross-attention).
  const uint64_t phase1 =
      cross ? SatMul(LiveChunks(threads, batch), SatMul3(2 * (ns + 1), sizeof(SegmentAgg), 1)) : 0;
  // Phase 2, per side: the side's totals and the three bases of the scan.
  const uint64_t phase2 =
      SatAdd(SatMul3(batch, sizeof(RowTotals), 1), SatMul3(3, batch + 1, sizeof(int64_t)));
  return SatAdd(SatAdd(fixed, std::max(phase1, phase2)), kStatusScratchBytes);
}

}  // namespace tokensel::kernels::cpu
