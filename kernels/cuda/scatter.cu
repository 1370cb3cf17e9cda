// ScatterTokens on the GPU (contract: kernels/cuda/cuda_ops.h, kernels/ops.h).
// Async: reset the status word, snapshot the indices into the workspace
// (snapshot.cuh: the only read of the client's index tensor), check every
// snapshot index for range and per-row uniqueness (a bitmap of S bits per
// row in the workspace: atomicOr returns the old word, so a duplicate is seen
// by exactly one of its threads), then copy each layer row to its token row
// of `all`, the target row taken from the same snapshot. Uniqueness makes the
// row writes disjoint; rows run in `layer` order, so the reads stream.
// Sparse rows (PreferSortingToBitmap(R, S), the CPU twin's rule) are checked
// without a bitmap: a sorted copy of each snapshot row, O(B * R) workspace
// whatever S is (sparse_sort.h), is range-checked and compared with
// neighbours; the copy still reads the unsorted snapshot.
// Workspace: workspace_layout.h (ScatterTokensLayout).
#include <cuda_runtime.h>

#include "common/status_macros.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/copy_kernels.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/index_check.cuh"
#include "kernels/cuda/oracle_args.h"
#include "kernels/cuda/snapshot.cuh"
#include "kernels/cuda/sparse_sort.h"
#include "kernels/cuda/status.cuh"
#include "kernels/cuda/workspace_layout.h"
#include "kernels/gather_math.h"

namespace tokensel::kernels::cuda {
namespace {

// Row `row` of layer ([B,R,C] / [R,B,C] order) -> its token row of all.
// `idx` is the snapshot of the indices (workspace memory), never the client's.
struct ScatterRowMap {
  TensorView all;
  TensorView layer;
  TensorView idx;
  int64_t batch;
  int64_t retained;
  bool batch_first;

  __device__ __forceinline__ RowPtrs operator()(int64_t row) const {
    const BatchPos p = RetainedRowToBatchPos(row, batch, retained, batch_first);
    const int64_t s = LoadIndex(idx, IndexOffset(WithRank<2>(idx), p.b, p.r));
    return {all.At(TokenOffset(all, batch_first, p.b, s)),
            layer.At(TokenOffset(layer, batch_first, p.b, p.r))};
  }
};

}  // namespace

size_t ScatterTokensWorkspaceBytes(const ScatterTokensArgs& args) {
  return ScatterTokensLayout(args).total;
}

absl::Status ScatterTokensAsync(const ScatterTokensArgs& args, Workspace ws, Stream stream) {
  RETURN_IF_ERROR(ValidateScatterTokens(args));
  const IndexOpLayout layout = ScatterTokensLayout(args);
  RETURN_IF_ERROR(CheckWorkspace(ws, layout.total, "ScatterTokens"));
  RETURN_IF_ERROR(ResetStatusAsync(ws, stream));
  const TensorView& all = args.all;
  const TensorView& layer = args.layer;
  const bool bf = args.batch_first;
  const TokenDims d = GetTokenDims(all, args.indices, bf);
  const int64_t rows = d.batch * d.retained;
  if (rows == 0) return absl::OkStatus();
  const TensorView idx = SnapshotView(args.indices, SectionAt(ws, layout.snapshot));
  RETURN_IF_ERROR(LaunchSnapshot(args.indices, idx.data, stream));
  // Indices are checked even when C == 0, like the CPU twin.
  if (layout.sparse.used) {
    RETURN_IF_ERROR(
        LaunchSparseSortAndCheck(layout.sparse, idx.dtype, idx.data, d.seq, ws, stream));
  } else {
    RETURN_IF_ERROR(LaunchIndexCheck(
        idx, d.seq, static_cast<unsigned int*>(SectionAt(ws, layout.bitmap)), ws, stream));
  }
  if (d.channels == 0) return absl::OkStatus();
  const int b_axis = bf ? 0 : 1;
  const int s_axis = bf ? 1 : 0;
  const RowCopyPlan plan =
      PlanRowCopy(rows, d.channels, all.elem_size(), all.data, layer.data,
                  {{all.strides[b_axis], d.batch}, {all.strides[s_axis], d.seq}},
                  {{layer.strides[b_axis], d.batch}, {layer.strides[s_axis], d.retained}},
                  all.strides[2], layer.strides[2]);
  return LaunchRowCopy(plan, ScatterRowMap{all, layer, idx, d.batch, d.retained, bf}, ws, stream);
}

absl::Status ScatterTokensFinish(const ScatterTokensArgs& args, Workspace ws, Stream stream) {
  // The message is computed from the snapshot the device validated, with the
  // payload shrunk away (oracle_args.h: no host copies of all and layer).
  ScatterTokensArgs host =
      ScatterTokensOracleArgs(args, SectionAt(ws, ScatterTokensLayout(args).snapshot));
  return FinishWithCpuOracle(ws, stream, "ScatterTokens", {&host.indices}, {&host.all, &host.layer},
                             [&] { return cpu::ScatterTokens(host, nullptr); });
}

}  // namespace tokensel::kernels::cuda
