// CUDA SamplePackedTokens (contract: ops.h op 11; CPU twin:
// kernels/cpu/sample_packed.cc). Bit-identical to the CPU: sequence i of
// layer l is SampleTokens' row (l, b = i) with S = n_i, R = r_i, selected by
// the same block-wide radix select (select.cuh) over the same Philox keys.
//
// Launches, in stream order (workspace: SamplePackedTokensLayout; which
// sequence takes which path: sample_packed_plan.h):
//   1. ResetStatusAsync and a zeroed report; LaunchSnapshot copies
//      cu_seqlens (client memory) once into the workspace. Every later
//      kernel reads only that copy.
//   2. PackedCheckKernel, grid-stride over i in [0, N]: cu[0] == 0, cu
//      non-decreasing, cu[i + 1] <= T, else SetInvalid, and the report gets
//      cu[0] and the first i of each kind of error (Finish formats the
//      message from these few words); stores r_i (PackedKeep, sample_math.h)
//      at kept[i + 1] and the chunk count of a long sequence at
//      chunk_base[i + 1] (0 at [0]).
//   3. LaunchPackedScan (sample_packed_scan.cu): inclusive prefix sums of
//      kept and of chunk_base over many blocks (tile sums, their scan in
//      one block, then the tiles), then compares kept[N] = T' (recorded in
//      the report) with the dims sized by the caller (ids, positions, out):
//      a mismatch is invalid data too.
//   4. PackedSampleKernel<kInverse>, one 256-thread block per short task
//      (l, i), grid-stride over L * N tasks (no launch limit on N): returns
//      at once when the status word is set, skips long sequences;
//      BlockSelectThreshold + BlockEmitSelected write ids, positions and
//      inverse of the sequence, and, for the fused gather, the ids again
//      into the workspace (the gather never reads the client's ids back).
//   5. When T admits a long sequence: the long path (sample_packed_long.cu,
//      one block per (layer, chunk of 4096 tokens), the same select rule
//      spread over the chunks); gated like 4.
//   6. PackedTailKernel, grid-stride: cu_seqlens_kept = kept (int32) and
//      inverse = -1 for tokens at or past cu[N]; gated like 4.
//   7. The fused gather (L = 1): the row-copy engine (copy_kernels.cuh)
//      copies activations row gather_ids[k] to out row k; gated.
// Work balance: no block handles more than 8192 tokens of a sequence, so
// millions of short sequences and a few very long ones both fill the
// device; the serial parts are the scan of the N / 4096 tile sums in step 3
// and of the long path's chunk counts (G / 1024 tiles per layer)
// (docs/gpu.md).
// Every address the write kernels form comes from the workspace: the
// snapshot (validated), kept and chunk_base (computed from it); slots stay
// below r_i (EmitSlot's bound), so a sequence writes only its own slice.
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/cub.cuh>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/copy_kernels.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/sample_keys.cuh"
#include "kernels/cuda/sample_packed_internal.cuh"
#include "kernels/cuda/sample_packed_plan.h"
#include "kernels/cuda/select.cuh"
#include "kernels/cuda/snapshot.cuh"
#include "kernels/cuda/status.cuh"
#include "kernels/cuda/view_access.cuh"
#include "kernels/cuda/workspace_layout.h"
#include "kernels/ops.h"
#include "kernels/philox.h"
#include "kernels/sample_math.h"

namespace tokensel::kernels::cuda {
namespace {

constexpr int kPackedThreads = 256;
constexpr int kPackedItems = 2;  // one Philox draw = one position pair
constexpr int64_t kMaxBlocks = int64_t{1} << 16;

struct KeepRule {
  int64_t num, den, min_tokens;
};

// Records the lowest i of one kind of error in the report (~i, atomicMax).
__device__ __forceinline__ void ReportFirst(long long* report, int word, int64_t i) {
  atomicMax(reinterpret_cast<unsigned long long*>(report + word),
            ~static_cast<unsigned long long>(i));
}

__global__ void __launch_bounds__(kPackedThreads)
    PackedCheckKernel(const int32_t* __restrict__ cu, int64_t n, int64_t total_tokens,
                      KeepRule rule, long long* __restrict__ kept,
                      long long* __restrict__ chunk_base, long long* __restrict__ report,
                      Workspace ws) {
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i <= n; i += step) {
    if (i == 0) {
      kept[0] = 0;
      chunk_base[0] = 0;
      report[kPackedReportCu0] = cu[0];
      if (cu[0] != 0) SetInvalid(ws, 0);
    }
    if (i == n) continue;
    const int64_t len = int64_t{cu[i + 1]} - cu[i];
    if (len < 0) {
      ReportFirst(report, kPackedReportDecreasing, i);
      SetInvalid(ws, i + 1);
    }
    if (cu[i + 1] > total_tokens) {
      ReportFirst(report, kPackedReportPastEnd, i);
      SetInvalid(ws, i + 1);
    }
    // Invalid lengths count 0: the prefix sums of bad data stay in range
    // (the status word is set by then; nothing reads them but the scan).
    const bool ok = len >= 0 && len <= total_tokens;
    kept[i + 1] = ok ? PackedKeep(len, rule.num, rule.den, rule.min_tokens) : 0;
    chunk_base[i + 1] = ok ? PackedChunks(len) : 0;
  }
}

template <bool kInverse>
__global__ void __launch_bounds__(kPackedThreads)
    PackedSampleKernel(const int32_t* __restrict__ cu, const long long* __restrict__ kept,
                       int64_t n, int64_t layers, uint64_t seed, uint64_t step, PackedOutputs o,
                       Workspace ws) {
  __shared__ SelectShared<kPackedThreads> sh;
  if (IsInvalid(ws)) return;  // uniform: the word was set by an earlier launch
  const int64_t tasks = layers * n;
  for (int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    int64_t l;
    const int64_t i = DivMod(task, n, &l);
    const int64_t first = cu[i];
    const int64_t len = int64_t{cu[i + 1]} - first;
    if (PackedIsLong(len)) continue;  // sample_packed_long.cu (uniform)
    const int64_t base = kept[i];
    const int64_t r = kept[i + 1] - base;
    const SampleKeyFn key_of{SampleKey(seed), l, i, step};
    const BlockThreshold<uint64_t> t =
        BlockSelectThreshold<uint64_t, kPackedThreads, kPackedItems>(key_of, len, r, sh);
    const PackedWriter<kInverse> w{o, l, first, base};
    BlockEmitSelected<uint64_t, kPackedThreads, kPackedItems>(
        key_of, len, r, t, sh, [&](int64_t position, int64_t slot) { w.Kept(position, slot); },
        [&](int64_t position) { w.Dropped(position); },
        /*visit_all=*/kInverse);
    __syncthreads();  // shared memory is reused by the next task
  }
}

// cu_seqlens_kept[i] = kept[i] (i <= n), and inverse[l, t] = -1 for t in
// [cu[n], T): elements e < n + 1 are the former, the next layers * (T -
// cu[n]) the latter (none when the pack has no padding). The grid is sized
// on the host for the most elements (cu[n] = 0).
__global__ void __launch_bounds__(kPackedThreads)
    PackedTailKernel(const int32_t* __restrict__ cu, const long long* __restrict__ kept, int64_t n,
                     TensorView cu_kept, bool cu_kept_aligned, TensorView inverse, bool inv_aligned,
                     int64_t layers, int64_t total_tokens, Workspace ws) {
  if (IsInvalid(ws)) return;
  const int64_t end = cu[n];  // valid: 0 <= end <= T
  const int64_t pad = total_tokens - end;
  const int64_t inv_elems = inverse.data == nullptr ? 0 : layers * pad;
  const int64_t count = n + 1 + inv_elems;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < count; e += step) {
    if (e <= n) {
      StoreI32(cu_kept.data, e * cu_kept.strides[0], static_cast<int32_t>(kept[e]),
               cu_kept_aligned);
      continue;
    }
    int64_t l;
    const int64_t t = end + DivMod(e - (n + 1), pad, &l);
    StoreI32(inverse.data, l * inverse.strides[0] + t * inverse.strides[1], -1, inv_aligned);
  }
}

// Row k of out <- row gather_ids[k] of activations.
struct PackedGatherMap {
  TensorView activations;
  TensorView out;
  const int32_t* gather_ids;

  __device__ __forceinline__ RowPtrs operator()(int64_t k) const {
    return {out.At(k * out.strides[0]), activations.At(gather_ids[k] * activations.strides[0])};
  }
};

int64_t DimOrAbsent(const std::optional<TensorView>& v, int axis) {
  return v.has_value() ? v->shape[axis] : -1;
}

}  // namespace

size_t SamplePackedTokensWorkspaceBytes(const SamplePackedTokensArgs& args) {
  return SamplePackedTokensLayout(args).total;
}

absl::Status SamplePackedTokensAsync(const SamplePackedTokensArgs& args, Workspace ws,
                                     Stream stream) {
  RETURN_IF_ERROR(ValidateSamplePackedTokens(args));
  const SamplePackedLayout layout = SamplePackedTokensLayout(args);
  RETURN_IF_ERROR(CheckWorkspace(ws, layout.total, "SamplePackedTokens"));
  RETURN_IF_ERROR(ResetStatusAsync(ws, stream));
  const int64_t n = layout.n_plus_1 - 1, L = args.layers, T = args.total_tokens;
  auto* cu = static_cast<int32_t*>(SectionAt(ws, layout.cu));
  auto* kept = static_cast<long long*>(SectionAt(ws, layout.kept));
  auto* chunk_base = static_cast<long long*>(SectionAt(ws, layout.chunk_base));
  auto* report = static_cast<long long*>(SectionAt(ws, layout.report));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(report, 0, kPackedReportWords * sizeof(long long), stream));
  RETURN_IF_ERROR(LaunchSnapshot(args.cu_seqlens, cu, stream));
  const KeepRule rule{args.keep_num, args.keep_den, args.min_tokens};
  ASSIGN_OR_RETURN(const unsigned check_grid, GridFor(n + 1, kPackedThreads));
  PackedCheckKernel<<<check_grid, kPackedThreads, 0, stream>>>(cu, n, T, rule, kept, chunk_base,
                                                               report, ws);
  CUDA_RETURN_IF_LAUNCH_ERROR("PackedCheckKernel");
  RETURN_IF_ERROR(LaunchPackedScan(
      kept, chunk_base, n, static_cast<long long*>(SectionAt(ws, layout.scan_sums)),
      {args.ids.shape[1], DimOrAbsent(args.positions, 1), DimOrAbsent(args.out, 0)}, report, ws,
      stream));

  PackedOutputs o{args.ids, TensorView{}, TensorView{}, nullptr, ElementsAligned(args.ids),
                  true,     true};
  if (args.positions) {
    o.positions = *args.positions;
    o.pos_aligned = ElementsAligned(*args.positions);
  }
  if (args.inverse) {
    o.inverse = *args.inverse;
    o.inv_aligned = ElementsAligned(*args.inverse);
  }
  if (args.out) o.gather_ids = static_cast<int32_t*>(SectionAt(ws, layout.gather_ids));
  const int64_t tasks = L * n;
  if (tasks > 0) {
    const auto blocks = static_cast<unsigned>(tasks < kMaxBlocks ? tasks : kMaxBlocks);
    if (args.inverse) {
      PackedSampleKernel<true>
          <<<blocks, kPackedThreads, 0, stream>>>(cu, kept, n, L, args.seed, args.step, o, ws);
    } else {
      PackedSampleKernel<false>
          <<<blocks, kPackedThreads, 0, stream>>>(cu, kept, n, L, args.seed, args.step, o, ws);
    }
    CUDA_RETURN_IF_LAUNCH_ERROR("PackedSampleKernel");
  }
  if (layout.max_chunks > 0) {
    const PackedLongArgs long_args{
        cu,
        kept,
        chunk_base,
        n,
        L,
        layout.max_chunks,
        layout.long_slots,
        args.seed,
        args.step,
        static_cast<PackedLongState*>(SectionAt(ws, layout.long_state)),
        static_cast<uint32_t*>(SectionAt(ws, layout.long_hist)),
        static_cast<unsigned long long*>(SectionAt(ws, layout.chunk_counts))};
    RETURN_IF_ERROR(LaunchPackedLong(long_args, o, args.inverse.has_value(), ws, stream));
  }
  const TensorView inverse = args.inverse ? *args.inverse : TensorView{};
  const int64_t tail = n + 1 + (args.inverse ? L * T : 0);
  ASSIGN_OR_RETURN(const unsigned tail_grid, GridFor(tail, kPackedThreads));
  PackedTailKernel<<<tail_grid, kPackedThreads, 0, stream>>>(cu, kept, n, args.cu_seqlens_kept,
                                                             ElementsAligned(args.cu_seqlens_kept),
                                                             inverse, o.inv_aligned, L, T, ws);
  CUDA_RETURN_IF_LAUNCH_ERROR("PackedTailKernel");
  if (!args.out) return absl::OkStatus();
  const TensorView& act = *args.activations;
  const TensorView& out = *args.out;
  const RowCopyPlan plan =
      PlanRowCopy(out.shape[0], out.shape[1], out.elem_size(), out.data, act.data,
                  {{out.strides[0], out.shape[0]}}, {{act.strides[0], act.shape[0]}},
                  out.strides[1], act.strides[1]);
  return LaunchRowCopy(plan, PackedGatherMap{act, out, o.gather_ids}, ws, stream);
}

absl::Status SamplePackedTokensFinish(const SamplePackedTokensArgs& args, Workspace ws,
                                      Stream stream) {
  ASSIGN_OR_RETURN(const HostStatus status, ReadStatus(ws, stream));
  if (!status.invalid) return absl::OkStatus();
  // The message from what the check and scan kernels recorded (the report)
  // and, for a bad pair, its two snapshot values: a fixed few words, the
  // same text as the CPU (the helpers of CheckPackedCuSeqlens).
  const SamplePackedLayout layout = SamplePackedTokensLayout(args);
  long long report[kPackedReportWords];
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(report, SectionAt(ws, layout.report), sizeof(report), cudaMemcpyDeviceToHost));
  if (report[kPackedReportCu0] != 0) return PackedCuStartError(report[kPackedReportCu0]);
  const auto* cu = static_cast<const int32_t*>(SectionAt(ws, layout.cu));
  for (const int word : {kPackedReportDecreasing, kPackedReportPastEnd}) {
    if (report[word] == 0) continue;
    const auto i = static_cast<int64_t>(~static_cast<unsigned long long>(report[word]));
    int32_t pair[2];  // cu[i], cu[i + 1] (i < N)
    CUDA_RETURN_IF_ERROR(cudaMemcpy(pair, cu + i, sizeof(pair), cudaMemcpyDeviceToHost));
    if (word == kPackedReportDecreasing) return PackedCuDecreasingError(i, pair[0], pair[1]);
    return PackedCuPastEndError(i, pair[1], args.total_tokens);
  }
  RETURN_IF_ERROR(CheckPackedKeptDims(args, report[kPackedReportKept]));
  return absl::InternalError(
      "SamplePackedTokens: device flagged invalid data but the CPU oracle accepts it");
}

}  // namespace tokensel::kernels::cuda
