// GatherTokens on the GPU (contract: kernels/cuda/cuda_ops.h, kernels/ops.h).
// Async: reset the status word, snapshot the indices into the workspace
// (snapshot.cuh: the only read of the client's index tensor), range-check
// the snapshot (CheckIndicesKernel), then copy one C-element row per
// retained token with the row-copy engine of copy_kernels.cuh, the source
// row taken from the snapshot; rows run in `out` order, so the writes stream.
// Workspace: workspace_layout.h (GatherTokensLayout).
#include <cuda_runtime.h>

#include "common/status_macros.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/copy_kernels.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/index_check.cuh"
#include "kernels/cuda/oracle_args.h"
#include "kernels/cuda/snapshot.cuh"
#include "kernels/cuda/status.cuh"
#include "kernels/cuda/workspace_layout.h"
#include "kernels/gather_math.h"

namespace tokensel::kernels::cuda {
namespace {

// Row `row` of out ([B,R,C] / [R,B,C] order) <- its activations token row.
// `idx` is the snapshot of the indices (workspace memory), never the client's.
struct GatherRowMap {
  TensorView act;
  TensorView idx;
  TensorView out;
  int64_t batch;
  int64_t retained;
  bool batch_first;

  __device__ __forceinline__ RowPtrs operator()(int64_t row) const {
    const BatchPos p = RetainedRowToBatchPos(row, batch, retained, batch_first);
    const int64_t s = LoadIndex(idx, IndexOffset(WithRank<2>(idx), p.b, p.r));
    return {out.At(TokenOffset(out, batch_first, p.b, p.r)),
            act.At(TokenOffset(act, batch_first, p.b, s))};
  }
};

}  // namespace

size_t GatherTokensWorkspaceBytes(const GatherTokensArgs& args) {
  return GatherTokensLayout(args).total;
}

absl::Status GatherTokensAsync(const GatherTokensArgs& args, Workspace ws, Stream stream) {
  RETURN_IF_ERROR(ValidateGatherTokens(args));
  const IndexOpLayout layout = GatherTokensLayout(args);
  RETURN_IF_ERROR(CheckWorkspace(ws, layout.total, "GatherTokens"));
  RETURN_IF_ERROR(ResetStatusAsync(ws, stream));
  const TensorView& act = args.activations;
  const TensorView& out = args.out;
  const bool bf = args.batch_first;
  const TokenDims d = GetTokenDims(act, args.indices, bf);
  const TensorView idx = SnapshotView(args.indices, SectionAt(ws, layout.snapshot));
  RETURN_IF_ERROR(LaunchSnapshot(args.indices, idx.data, stream));
  // Indices are checked even when C == 0, like the CPU twin.
  RETURN_IF_ERROR(LaunchIndexCheck(idx, d.seq, /*bitmap=*/nullptr, ws, stream));
  const int64_t rows = d.batch * d.retained;
  if (rows == 0 || d.channels == 0) return absl::OkStatus();
  const int b_axis = bf ? 0 : 1;
  const int s_axis = bf ? 1 : 0;
  const RowCopyPlan plan =
      PlanRowCopy(rows, d.channels, act.elem_size(), out.data, act.data,
                  {{out.strides[b_axis], d.batch}, {out.strides[s_axis], d.retained}},
                  {{act.strides[b_axis], d.batch}, {act.strides[s_axis], d.seq}}, out.strides[2],
                  act.strides[2]);
  return LaunchRowCopy(plan, GatherRowMap{act, idx, out, d.batch, d.retained, bf}, ws, stream);
}

absl::Status GatherTokensFinish(const GatherTokensArgs& args, Workspace ws, Stream stream) {
  // The message is computed from the snapshot the device validated (a copy
  // of the client's tensor now could hold other values), with the payload
  // shrunk away (oracle_args.h: no host copies of activations and out).
  GatherTokensArgs host =
      GatherTokensOracleArgs(args, SectionAt(ws, GatherTokensLayout(args).snapshot));
  return FinishWithCpuOracle(ws, stream, "GatherTokens", {&host.indices},
                             {&host.activations, &host.out},
                             [&] { return cpu::GatherTokens(host, nullptr); });
}

}  // namespace tokensel::kernels::cuda
