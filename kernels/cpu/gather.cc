// GatherTokens on the CPU: validate metadata, snapshot and validate every
// index (index_check.h), then copy one C-element row per retained token, rows
// in parallel. The copies read the indices from the snapshot only: the
// client's index tensor is read exactly once.
#include "common/status_macros.h"
#include "kernels/cpu/copy_rows.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/index_check.h"
#include "kernels/cpu/scratch.h"
#include "kernels/gather_math.h"

namespace tokensel::kernels::cpu {

absl::Status GatherTokens(const GatherTokensArgs& args, ThreadPool* pool) {
  RETURN_IF_ERROR(ValidateGatherTokens(args));
  const TensorView& act = args.activations;
  const TensorView& out = args.out;
  const bool batch_first = args.batch_first;
  const TokenDims d = GetTokenDims(act, args.indices, batch_first);
  IndexSnapshot snapshot;
  RETURN_IF_ERROR(SnapshotIndexRows(args.indices, d.seq, /*unique=*/false, pool, &snapshot));
  const TensorView& idx = snapshot.view();  // private, row-major [B,R]

  const int64_t rows = d.batch * d.retained;
  if (rows == 0 || d.channels == 0) return absl::OkStatus();
  const int64_t elem = act.elem_size();
  // Rows run in `out` order, so the writes stream through the output; the
  // source rows, in index order, are prefetched ahead (copy_rows.h).
  DispatchRowCopy(elem, d.channels, out.strides[2], act.strides[2], rows, [&](const auto& copy) {
    ParallelFor(pool, rows, RowGrain(d.channels * elem), [&](int64_t begin, int64_t end) {
      GatherRowRange(
          copy, d.channels * elem, begin, end,
          [&](int64_t row) {
            const BatchPos p = RetainedRowToBatchPos(row, d.batch, d.retained, batch_first);
            return out.At(TokenOffset(out, batch_first, p.b, p.r));
          },
          [&](int64_t row) {
            const BatchPos p = RetainedRowToBatchPos(row, d.batch, d.retained, batch_first);
            const int64_t s = LoadIndex(idx, p.b * d.retained + p.r);
            return static_cast<const char*>(act.At(TokenOffset(act, batch_first, p.b, s)));
          });
      copy.Finish();
    });
  });
  return CheckStop();
}

uint64_t ScratchBytes(const GatherTokensArgs& args, int threads) {
  if (!ValidateGatherTokens(args).ok()) return kStatusScratchBytes;
  const TokenDims d = GetTokenDims(args.activations, args.indices, args.batch_first);
  return SatAdd(SnapshotIndexRowsScratchBytes(args.indices, d.seq, /*unique=*/false, threads),
                kStatusScratchBytes);
}

}  // namespace tokensel::kernels::cpu
