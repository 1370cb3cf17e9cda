// MergeTokens and SplitTokens on the CPU: the Random-LTD pair without
// DeepSpeed's clone of the activations.
//
// Both validate metadata, snapshot and validate the indices (range and
// per-row uniqueness, all rows before any write; index_check.h), then write
// each output row exactly once, rows in parallel, reading the indices from
// the snapshot only:
//   MergeTokens: the R retained rows of `out` from `layer` (ScatterTokens'
//     copy), then, unless `out` is `x` itself, the S - R other rows from `x`:
//     a membership bitmap of the snapshot (one bit per (b, s), rows aligned
//     to 64-bit words so that batch rows fill it in parallel) says which.
//   SplitTokens: `layer_grad` gathered from `grad` first; then the rows of
//     `rest_grad` named by the indices zeroed and, unless `rest_grad` is
//     `grad` itself, the other rows copied from `grad`. ParallelFor returns
//     after every chunk ran, so in place the gather has read a row before it
//     is zeroed.
// Uniqueness makes the retained-row writes disjoint; the bitmap makes the
// two kinds of rows disjoint; the retained rows are written first, so a
// membership bug would overwrite them (and show in the tests). Scratch: the
// snapshot, its check, and the bitmap of B * ceil(S / 64) words, only when
// C > 0 and out of place (8 bytes per 64 rows of an output that holds
// B * S * C real elements), counted by ScratchBytes.
#include <cstring>
#include <memory>

#include "common/status_macros.h"
#include "kernels/cpu/copy_rows.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/index_check.h"
#include "kernels/cpu/scratch.h"
#include "kernels/gather_math.h"

namespace tokensel::kernels::cpu {
namespace {

int64_t WordsPerRow(int64_t seq) { return (seq + 63) / 64; }

// One bit per (b, s) set where indices[b, r] == s; `idx` is the validated
// snapshot. Row b owns words [b * words, (b + 1) * words).
std::unique_ptr<uint64_t[]> Membership(const TensorView& idx, const TokenDims& d,
                                       ThreadPool* pool) {
  const int64_t words = WordsPerRow(d.seq);
  auto bits = std::make_unique<uint64_t[]>(static_cast<size_t>(d.batch * words));  // zeroed
  ParallelFor(pool, d.batch, RowGrain(d.retained * 8), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      uint64_t* row = bits.get() + b * words;
      for (int64_t r = 0; r < d.retained; ++r) {
        const int64_t s = LoadIndex(idx, b * d.retained + r);
        row[s >> 6] |= uint64_t{1} << (s & 63);
      }
    }
  });
  return bits;
}

bool IsMember(const uint64_t* bits, int64_t words, int64_t b, int64_t s) {
  return ((bits[b * words + (s >> 6)] >> (s & 63)) & 1) != 0;
}

// Copies the token rows (b, s) of `src` to `dst` ([B,S,C] / [S,B,C] views of
// one shape) whose membership bit is clear.
void CopyOtherRows(const TensorView& dst, const TensorView& src, const TokenDims& d,
                   const uint64_t* bits, bool batch_first, ThreadPool* pool) {
  const int64_t rows = d.batch * d.seq;
  const int64_t words = WordsPerRow(d.seq);
  DispatchRowCopy(
      dst.elem_size(), d.channels, dst.strides[2], src.strides[2], rows, [&](const auto& copy) {
        ParallelFor(pool, rows, RowGrain(d.channels * dst.elem_size()),
                    [&](int64_t begin, int64_t end) {
                      for (int64_t row = begin; row < end; ++row) {
                        // In dst's own order: (b, s) for batch_first, (s, b) else.
                        const BatchPos p = RetainedRowToBatchPos(row, d.batch, d.seq, batch_first);
                        if (IsMember(bits, words, p.b, p.r)) continue;
                        copy(dst.At(TokenOffset(dst, batch_first, p.b, p.r)),
                             src.At(TokenOffset(src, batch_first, p.b, p.r)));
                      }
                      copy.Finish();
                    });
      });
}

// For every (b, r): copy(token (b, idx[b, r]) of `tokens`, row (b, r) of
// `retained`) when to_tokens, else the other way round (a gather).
void CopyRetainedRows(const TensorView& tokens, const TensorView& retained, const TensorView& idx,
                      const TokenDims& d, bool batch_first, bool to_tokens, ThreadPool* pool) {
  const int64_t rows = d.batch * d.retained;
  const int64_t elem = tokens.elem_size();
  const int64_t dst_stride = to_tokens ? tokens.strides[2] : retained.strides[2];
  const int64_t src_stride = to_tokens ? retained.strides[2] : tokens.strides[2];
  DispatchRowCopy(elem, d.channels, dst_stride, src_stride, rows, [&](const auto& copy) {
    const auto token_of = [&](int64_t row) {
      const BatchPos p = RetainedRowToBatchPos(row, d.batch, d.retained, batch_first);
      return tokens.At(
          TokenOffset(tokens, batch_first, p.b, LoadIndex(idx, p.b * d.retained + p.r)));
    };
    const auto kept_of = [&](int64_t row) {
      const BatchPos p = RetainedRowToBatchPos(row, d.batch, d.retained, batch_first);
      return retained.At(TokenOffset(retained, batch_first, p.b, p.r));
    };
    ParallelFor(pool, rows, RowGrain(d.channels * elem), [&](int64_t begin, int64_t end) {
      if (to_tokens) {
        for (int64_t row = begin; row < end; ++row) copy(token_of(row), kept_of(row));
      } else {  // a gather: the token rows are read in index order, prefetched
        GatherRowRange(copy, d.channels * elem, begin, end, kept_of, token_of);
      }
      copy.Finish();
    });
  });
}

// Zeroes the token rows (b, idx[b, r]) of `tokens` (all-zero bytes: +0.0).
void ZeroRetainedRows(const TensorView& tokens, const TensorView& idx, const TokenDims& d,
                      bool batch_first, ThreadPool* pool) {
  const int64_t rows = d.batch * d.retained;
  const int64_t elem = tokens.elem_size();
  const int64_t stride = tokens.strides[2] * elem;  // bytes
  const bool contiguous = tokens.strides[2] == 1 || d.channels == 1;
  ParallelFor(pool, rows, RowGrain(d.channels * elem), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const BatchPos p = RetainedRowToBatchPos(row, d.batch, d.retained, batch_first);
      char* dst =
          tokens.At(TokenOffset(tokens, batch_first, p.b, LoadIndex(idx, p.b * d.retained + p.r)));
      if (contiguous) {
        std::memset(dst, 0, static_cast<size_t>(d.channels * elem));
      } else {
        for (int64_t c = 0; c < d.channels; ++c) std::memset(dst + c * stride, 0, elem);
      }
    }
  });
}

uint64_t MembershipBytes(const TokenDims& d) {
  return d.channels == 0 ? 0 : SatMul3(d.batch, WordsPerRow(d.seq), sizeof(uint64_t));
}

}  // namespace

absl::Status MergeTokens(const MergeTokensArgs& args, ThreadPool* pool) {
  RETURN_IF_ERROR(ValidateMergeTokens(args));
  const bool bf = args.batch_first;
  const TokenDims d = GetTokenDims(args.x, args.indices, bf);
  IndexSnapshot snapshot;
  RETURN_IF_ERROR(SnapshotIndexRows(args.indices, d.seq, /*unique=*/true, pool, &snapshot));
  const TensorView& idx = snapshot.view();  // private, row-major [B,R]
  if (d.batch * d.seq == 0 || d.channels == 0) return absl::OkStatus();
  // Retained rows first: a membership bug that copied them from x as well
  // would overwrite layer's rows, which the tests see.
  CopyRetainedRows(args.out, args.layer, idx, d, bf, /*to_tokens=*/true, pool);
  if (SameView(args.out, args.x)) return CheckStop();
  const std::unique_ptr<uint64_t[]> bits = Membership(idx, d, pool);
  RETURN_IF_ERROR(CheckStop());
  CopyOtherRows(args.out, args.x, d, bits.get(), bf, pool);
  return CheckStop();
}

absl::Status SplitTokens(const SplitTokensArgs& args, ThreadPool* pool) {
  RETURN_IF_ERROR(ValidateSplitTokens(args));
  const bool bf = args.batch_first;
  const TokenDims d = GetTokenDims(args.grad, args.indices, bf);
  IndexSnapshot snapshot;
  RETURN_IF_ERROR(SnapshotIndexRows(args.indices, d.seq, /*unique=*/true, pool, &snapshot));
  const TensorView& idx = snapshot.view();  // private, row-major [B,R]
  if (d.batch * d.seq == 0 || d.channels == 0) return absl::OkStatus();
  // layer_grad first (in place, these rows of grad are zeroed next), then the
  // zeroing, then the other rows (a membership bug would overwrite zeros).
  CopyRetainedRows(args.grad, args.layer_grad, idx, d, bf, /*to_tokens=*/false, pool);
  RETURN_IF_ERROR(CheckStop());
  ZeroRetainedRows(args.rest_grad, idx, d, bf, pool);
  if (SameView(args.rest_grad, args.grad)) return CheckStop();
  const std::unique_ptr<uint64_t[]> bits = Membership(idx, d, pool);
  RETURN_IF_ERROR(CheckStop());
  CopyOtherRows(args.rest_grad, args.grad, d, bits.get(), bf, pool);
  return CheckStop();
}

uint64_t ScratchBytes(const MergeTokensArgs& args, int threads) {
  if (!ValidateMergeTokens(args).ok()) return kStatusScratchBytes;
  const TokenDims d = GetTokenDims(args.x, args.indices, args.batch_first);
  const uint64_t check = SnapshotIndexRowsScratchBytes(args.indices, d.seq, true, threads);
  const uint64_t bits = SameView(args.out, args.x) ? 0 : MembershipBytes(d);
  return SatAdd(SatAdd(check, bits), kStatusScratchBytes);
}

uint64_t ScratchBytes(const SplitTokensArgs& args, int threads) {
  if (!ValidateSplitTokens(args).ok()) return kStatusScratchBytes;
  const TokenDims d = GetTokenDims(args.grad, args.indices, args.batch_first);
  const uint64_t check = SnapshotIndexRowsScratchBytes(args.indices, d.seq, true, threads);
  const uint64_t bits = SameView(args.rest_grad, args.grad) ? 0 : MembershipBytes(d);
  return SatAdd(SatAdd(check, bits), kStatusScratchBytes);
}

}  // namespace tokensel::kernels::cpu
