// ScatterTokens on the CPU: validate metadata, snapshot and validate every
// index (range and uniqueness per row, all rows before any write;
// index_check.h), then copy each layer row to its token row of `all`, rows in
// parallel. The copies read the indices from the snapshot only, so the
// uniqueness that was checked is the uniqueness that holds: the row writes
// are disjoint and no two threads touch the same bytes.
#include "common/status_macros.h"
#include "kernels/cpu/copy_rows.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/index_check.h"
#include "kernels/cpu/scratch.h"
#include "kernels/gather_math.h"

namespace tokensel::kernels::cpu {

absl::Status ScatterTokens(const ScatterTokensArgs& args, ThreadPool* pool) {
  RETURN_IF_ERROR(ValidateScatterTokens(args));
  const TensorView& all = args.all;
  const TensorView& layer = args.layer;
  const bool batch_first = args.batch_first;
  const TokenDims d = GetTokenDims(all, args.indices, batch_first);
  IndexSnapshot snapshot;
  RETURN_IF_ERROR(SnapshotIndexRows(args.indices, d.seq, /*unique=*/true, pool, &snapshot));
  const TensorView& idx = snapshot.view();  // private, row-major [B,R]

  const int64_t rows = d.batch * d.retained;
  if (rows == 0 || d.channels == 0) return absl::OkStatus();
  const int64_t elem = all.elem_size();
  // Rows run in `layer` order, so the reads stream through the input.
  DispatchRowCopy(elem, d.channels, all.strides[2], layer.strides[2], rows, [&](const auto& copy) {
    ParallelFor(pool, rows, RowGrain(d.channels * elem), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const BatchPos p = RetainedRowToBatchPos(row, d.batch, d.retained, batch_first);
        const int64_t s = LoadIndex(idx, p.b * d.retained + p.r);
        copy(all.At(TokenOffset(all, batch_first, p.b, s)),
             layer.At(TokenOffset(layer, batch_first, p.b, p.r)));
      }
      copy.Finish();
    });
  });
  return CheckStop();
}

uint64_t ScratchBytes(const ScatterTokensArgs& args, int threads) {
  if (!ValidateScatterTokens(args).ok()) return kStatusScratchBytes;
  const TokenDims d = GetTokenDims(args.all, args.indices, args.batch_first);
  return SatAdd(SnapshotIndexRowsScratchBytes(args.indices, d.seq, /*unique=*/true, threads),
                kStatusScratchBytes);
}

}  // namespace tokensel::kernels::cpu
