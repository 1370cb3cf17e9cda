// MergeTokens and SplitTokens on the GPU (contracts: kernels/ops.h,
// kernels/cuda/cuda_ops.h; the CPU twins are kernels/cpu/merge_split.cc).
//
// Async, on the op's stream, in this order:
//   1. reset the status word; snapshot the indices into the workspace
//      (snapshot.cuh: the only read of the client's index tensor);
//   2. check every snapshot index for range and per-row uniqueness
//      (index_check.cuh). The check's bitmap stays in the workspace: after a
//      valid check, bit (b, s) is set iff s is retained in row b;
//   3. the copies, each a row-copy launch (copy_kernels.cuh) that returns at
//      once when the check set the status word, so nothing is written on
//      bad data. Every output row is written by exactly one launch:
//      MergeTokens:  the retained rows layer -> out at their snapshot index,
//                    then [unless out is x] the other rows x -> out (the map
//                    skips rows whose bit is set);
//      SplitTokens:  layer_grad gathered from grad; the retained rows of
//                    rest_grad zeroed (copied from one zero element in the
//                    workspace, source stride 0); then [unless rest_grad is
//                    grad] the other rows grad -> rest_grad.
//      Launches on one stream run in order, so in place the gather of
//      layer_grad has read a row of grad before the zeroing writes it. The
//      rows of the launches are disjoint; the retained ones go first so that
//      a membership bug (a retained row copied from x / grad as well) would
//      overwrite them and show in the byte comparisons of the tests.
// Finish: the CPU oracle on the snapshot, payload shrunk (oracle_args.h).
// Workspace: workspace_layout.h (MergeTokensLayout, SplitTokensLayout).
#include <cuda_runtime.h>

#include "common/status_macros.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/copy_kernels.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/index_check.cuh"
#include "kernels/cuda/oracle_args.h"
#include "kernels/cuda/snapshot.cuh"
#include "kernels/cuda/status.cuh"
#include "kernels/cuda/workspace_layout.h"
#include "kernels/gather_math.h"

namespace tokensel::kernels::cuda {
namespace {

// Row (b, r) of the retained side ([B,R,C] / [R,B,C] order) and token
// (b, idx[b, r]) of the token side: kToTokens copies retained -> tokens,
// else tokens -> retained (a gather). `idx` is the snapshot.
template <bool kToTokens>
struct RetainedRowMap {
  TensorView tokens;
  TensorView retained;
  TensorView idx;
  int64_t batch;
  int64_t retained_count;
  bool batch_first;

  __device__ __forceinline__ RowPtrs operator()(int64_t row) const {
    const BatchPos p = RetainedRowToBatchPos(row, batch, retained_count, batch_first);
    const int64_t s = LoadIndex(idx, IndexOffset(WithRank<2>(idx), p.b, p.r));
    char* token = tokens.At(TokenOffset(tokens, batch_first, p.b, s));
    char* kept = retained.At(TokenOffset(retained, batch_first, p.b, p.r));
    if constexpr (kToTokens) {
      return {token, kept};
    } else {
      return {kept, token};
    }
  }
};

// Token row (b, s) of dst in dst's own order, from the same row of src;
// skipped (null dst) when the check's bitmap marks s retained in row b.
struct OtherRowMap {
  TensorView dst;
  TensorView src;
  const unsigned int* bitmap;
  int64_t words_per_row;
  int64_t batch;
  int64_t seq;
  bool batch_first;

  __device__ __forceinline__ RowPtrs operator()(int64_t row) const {
    const BatchPos p = RetainedRowToBatchPos(row, batch, seq, batch_first);  // p.r is s
    const unsigned int word = bitmap[p.b * words_per_row + (p.r >> 5)];
    if (((word >> (p.r & 31)) & 1u) != 0) return {nullptr, nullptr};
    return {dst.At(TokenOffset(dst, batch_first, p.b, p.r)),
            src.At(TokenOffset(src, batch_first, p.b, p.r))};
  }
};

// Token row (b, idx[b, r]) of `tokens` <- the zero element (every channel).
struct ZeroRowMap {
  TensorView tokens;
  TensorView idx;
  const char* zero;
  int64_t batch;
  int64_t retained_count;
  bool batch_first;

  __device__ __forceinline__ RowPtrs operator()(int64_t row) const {
    const BatchPos p = RetainedRowToBatchPos(row, batch, retained_count, batch_first);
    const int64_t s = LoadIndex(idx, IndexOffset(WithRank<2>(idx), p.b, p.r));
    return {tokens.At(TokenOffset(tokens, batch_first, p.b, s)), zero};
  }
};

// Zeroes the membership bitmap when no index ran the check (B * R == 0).
cudaError_t ClearBitmap(unsigned int* bitmap, const TokenDims& d, Stream stream) {
  return cudaMemsetAsync(bitmap, 0, static_cast<size_t>(d.batch * BitmapWordsPerRow(d.seq)) * 4,
                         stream);
}

template <bool kToTokens>
absl::Status CopyRetained(const TensorView& tokens, const TensorView& retained,
                          const TensorView& idx, const TokenDims& d, bool bf, Workspace ws,
                          Stream stream) {
  const int b_axis = bf ? 0 : 1;
  const int s_axis = bf ? 1 : 0;
  const RowDim token_dims[2] = {{tokens.strides[b_axis], d.batch}, {tokens.strides[s_axis], d.seq}};
  const RowDim kept_dims[2] = {{retained.strides[b_axis], d.batch},
                               {retained.strides[s_axis], d.retained}};
  const TensorView& dst = kToTokens ? tokens : retained;
  const TensorView& src = kToTokens ? retained : tokens;
  const RowDim* dd = kToTokens ? token_dims : kept_dims;
  const RowDim* sd = kToTokens ? kept_dims : token_dims;
  const RowCopyPlan plan =
      PlanRowCopy(d.batch * d.retained, d.channels, tokens.elem_size(), dst.data, src.data,
                  {dd[0], dd[1]}, {sd[0], sd[1]}, dst.strides[2], src.strides[2]);
  return LaunchRowCopy(
      plan, RetainedRowMap<kToTokens>{tokens, retained, idx, d.batch, d.retained, bf}, ws, stream);
}

absl::Status CopyOthers(const TensorView& dst, const TensorView& src, const unsigned int* bitmap,
                        const TokenDims& d, bool bf, Workspace ws, Stream stream) {
  const int b_axis = bf ? 0 : 1;
  const int s_axis = bf ? 1 : 0;
  const RowCopyPlan plan =
      PlanRowCopy(d.batch * d.seq, d.channels, dst.elem_size(), dst.data, src.data,
                  {{dst.strides[b_axis], d.batch}, {dst.strides[s_axis], d.seq}},
                  {{src.strides[b_axis], d.batch}, {src.strides[s_axis], d.seq}}, dst.strides[2],
                  src.strides[2]);
  return LaunchRowCopy(plan,
                       OtherRowMap{dst, src, bitmap, BitmapWordsPerRow(d.seq), d.batch, d.seq, bf},
                       ws, stream);
}

absl::Status ZeroRetained(const TensorView& tokens, const TensorView& idx, const char* zero,
                          const TokenDims& d, bool bf, Workspace ws, Stream stream) {
  const int b_axis = bf ? 0 : 1;
  const int s_axis = bf ? 1 : 0;
  // The source is one element (stride 0 everywhere): with C > 1 the plan is
  // the strided kernel; with C == 1 a one-element contiguous row.
  const RowCopyPlan plan =
      PlanRowCopy(d.batch * d.retained, d.channels, tokens.elem_size(), tokens.data, zero,
                  {{tokens.strides[b_axis], d.batch}, {tokens.strides[s_axis], d.seq}}, {{0, 1}},
                  tokens.strides[2], 0);
  return LaunchRowCopy(plan, ZeroRowMap{tokens, idx, zero, d.batch, d.retained, bf}, ws, stream);
}

}  // namespace

size_t MergeTokensWorkspaceBytes(const MergeTokensArgs& args) {
  return MergeTokensLayout(args).total;
}

absl::Status MergeTokensAsync(const MergeTokensArgs& args, Workspace ws, Stream stream) {
  RETURN_IF_ERROR(ValidateMergeTokens(args));
  const IndexOpLayout layout = MergeTokensLayout(args);
  RETURN_IF_ERROR(CheckWorkspace(ws, layout.total, "MergeTokens"));
  RETURN_IF_ERROR(ResetStatusAsync(ws, stream));
  const bool bf = args.batch_first;
  const TokenDims d = GetTokenDims(args.x, args.indices, bf);
  const TensorView idx = SnapshotView(args.indices, SectionAt(ws, layout.snapshot));
  auto* bitmap = static_cast<unsigned int*>(SectionAt(ws, layout.bitmap));
  if (d.batch * d.retained > 0) {
    RETURN_IF_ERROR(LaunchSnapshot(args.indices, idx.data, stream));
    // Indices are checked even when C == 0, like the CPU twin.
    RETURN_IF_ERROR(LaunchIndexCheck(idx, d.seq, bitmap, ws, stream));
  }
  if (d.channels == 0 || d.batch * d.seq == 0) return absl::OkStatus();
  const bool in_place = SameView(args.out, args.x);
  if (d.batch * d.retained == 0 && !in_place) {
    // No index ran the check: nothing is retained, every row comes from x.
    CUDA_RETURN_IF_ERROR(ClearBitmap(bitmap, d, stream));
  }
  // Retained rows first, then the others: a membership bug that copied a
  // retained row from x too would overwrite layer's row, which the tests see.
  RETURN_IF_ERROR(CopyRetained<true>(args.out, args.layer, idx, d, bf, ws, stream));
  if (in_place) return absl::OkStatus();
  return CopyOthers(args.out, args.x, bitmap, d, bf, ws, stream);
}

absl::Status MergeTokensFinish(const MergeTokensArgs& args, Workspace ws, Stream stream) {
  MergeTokensArgs host =
      MergeTokensOracleArgs(args, SectionAt(ws, MergeTokensLayout(args).snapshot));
  return FinishWithCpuOracle(ws, stream, "MergeTokens", {&host.indices},
                             {&host.x, &host.layer, &host.out},
                             [&] { return cpu::MergeTokens(host, nullptr); });
}

size_t SplitTokensWorkspaceBytes(const SplitTokensArgs& args) {
  return SplitTokensLayout(args).total;
}

absl::Status SplitTokensAsync(const SplitTokensArgs& args, Workspace ws, Stream stream) {
  RETURN_IF_ERROR(ValidateSplitTokens(args));
  const SplitLayout layout = SplitTokensLayout(args);
  RETURN_IF_ERROR(CheckWorkspace(ws, layout.total, "SplitTokens"));
  RETURN_IF_ERROR(ResetStatusAsync(ws, stream));
  const bool bf = args.batch_first;
  const TokenDims d = GetTokenDims(args.grad, args.indices, bf);
  const TensorView idx = SnapshotView(args.indices, SectionAt(ws, layout.index.snapshot));
  auto* bitmap = static_cast<unsigned int*>(SectionAt(ws, layout.index.bitmap));
  auto* zero = static_cast<char*>(SectionAt(ws, layout.zeros));
  if (d.batch * d.retained > 0) {
    RETURN_IF_ERROR(LaunchSnapshot(args.indices, idx.data, stream));
    RETURN_IF_ERROR(LaunchIndexCheck(idx, d.seq, bitmap, ws, stream));
  }
  if (d.channels == 0 || d.batch * d.seq == 0) return absl::OkStatus();
  const bool in_place = SameView(args.rest_grad, args.grad);
  if (d.batch * d.retained == 0 && !in_place) CUDA_RETURN_IF_ERROR(ClearBitmap(bitmap, d, stream));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(zero, 0, 8, stream));
  // layer_grad first (in place, its rows of grad are zeroed next), then the
  // zeroing, then the other rows: a membership bug that copied a retained
  // row from grad too would overwrite its zeros, which the tests see.
  RETURN_IF_ERROR(CopyRetained<false>(args.grad, args.layer_grad, idx, d, bf, ws, stream));
  RETURN_IF_ERROR(ZeroRetained(args.rest_grad, idx, zero, d, bf, ws, stream));
  if (in_place) return absl::OkStatus();
  return CopyOthers(args.rest_grad, args.grad, bitmap, d, bf, ws, stream);
}

absl::Status SplitTokensFinish(const SplitTokensArgs& args, Workspace ws, Stream stream) {
  SplitTokensArgs host =
      SplitTokensOracleArgs(args, SectionAt(ws, SplitTokensLayout(args).index.snapshot));
  return FinishWithCpuOracle(ws, stream, "SplitTokens", {&host.indices},
                             {&host.grad, &host.layer_grad, &host.rest_grad},
                             [&] { return cpu::SplitTokens(host, nullptr); });
}

}  // namespace tokensel::kernels::cuda
