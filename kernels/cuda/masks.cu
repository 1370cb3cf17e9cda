// GatherBertMask and SliceGptMask on the GPU (contracts: kernels/cuda/cuda_ops.h,
// kernels/ops.h). Both are byte copies dispatched on the element size only.
//
// SliceGptMask: the top-left R x R corner, B*H*R rows of R elements through
// the row-copy engine (copy_kernels.cuh): coalesced, vectorized when the
// views allow. No data to validate.
//
// GatherBertMask: out[l,b,h,i,j] = mask[b,h,Sq==1 ? 0 : idx[l,b,i], idx[l,b,j]].
// Work item = (index row l*B+b, chunk of kBertRowsPerItem output rows (h,i)),
// grid y over index rows and x over chunks (grid-stride both); a block stages the R key columns of
// its index row in shared memory as byte offsets (kBertKeyTile at a time), then each warp copies
// whole output rows: lane j writes out[..., j] (coalesced) from the gathered column idx[j] of the
// source row (scattered reads within one mask row). Indices are first
// snapshotted into the workspace (snapshot.cuh: the only read of the client's
// index tensor), the snapshot is range-checked (CheckIndicesKernel), and the
// write kernel reads the same snapshot; it exits if the status is set.
// Workspace: workspace_layout.h (GatherBertMaskLayout). SampleTokens runs
// this op on the ids it just wrote to client memory: the snapshot makes that
// read-back safe too.
#include <cuda_runtime.h>

#include <algorithm>

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

inline constexpr int kBertThreads = 256;
inline constexpr int kBertWarps = kBertThreads / 32;
inline constexpr int64_t kBertRowsPerItem = 32;
inline constexpr int kBertKeyTile = 2048;

struct BertMaskParams {
  TensorView mask;
  TensorView idx;  // the snapshot of the indices (workspace memory)
  TensorView out;
  int64_t chunks;  // per index row: ceil(H*R / kBertRowsPerItem)
  int units;       // elem / kUnit
};

// Moves (m.h, m.i) forward by `n` rows of R.
__device__ __forceinline__ void Advance(BertMaskRow& m, int64_t n, int64_t retained) {
  m.i += n;
  while (m.i >= retained) {
    m.i -= retained;
    ++m.h;
  }
}

template <int kUnit>
__global__ void __launch_bounds__(kBertThreads)
    GatherBertMaskKernel(const __grid_constant__ BertMaskParams p, Workspace ws) {
  using Unit = typename VecType<kUnit>::Type;
  __shared__ int64_t key_offsets[kBertKeyTile];
  if (IsInvalid(ws)) return;
  const TensorView& out = p.out;
  const TensorView idx = WithRank<3>(p.idx);  // validated [L,B,R]
  const int64_t retained = out.shape[4];
  const int64_t rows_per_index_row = out.shape[2] * retained;  // H*R
  const int64_t index_rows = out.shape[0] * out.shape[1];      // L*B
  const int64_t elem = p.units * kUnit;
  const int64_t key_stride = p.mask.strides[3] * elem;  // bytes
  const int64_t out_stride = out.strides[4] * elem;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  // blockIdx.y strides over index rows (l,b), blockIdx.x over row chunks.
  for (int64_t index_row = blockIdx.y; index_row < index_rows; index_row += gridDim.y) {
    // Index row l*B + b (BertMaskIndexRow's numbering); h and i set per row.
    BertMaskRow m;
    m.l = index_row / out.shape[1];
    m.b = index_row - m.l * out.shape[1];
    // IndexOffset(idx, index_row, j) == index_base + j * index_stride.
    const int64_t index_base = IndexOffset(idx, index_row, 0);
    const int64_t index_stride = idx.strides[2];
    for (int64_t chunk = blockIdx.x; chunk < p.chunks; chunk += gridDim.x) {
      const int64_t first = chunk * kBertRowsPerItem;
      const int64_t last = min(first + kBertRowsPerItem, rows_per_index_row);
      for (int64_t j0 = 0; j0 < retained; j0 += kBertKeyTile) {
        const int64_t tile = min(static_cast<int64_t>(kBertKeyTile), retained - j0);
        __syncthreads();  // the previous tile's readers are done
        for (int64_t j = threadIdx.x; j < tile; j += kBertThreads) {
          key_offsets[j] = LoadIndex(idx, index_base + (j0 + j) * index_stride) * key_stride;
        }
        __syncthreads();
        // (h, i) of row `hr`, stepped without division: hr = h*R + i.
        m.h = first / retained;
        m.i = first - m.h * retained;
        Advance(m, warp, retained);
        for (int64_t hr = first + warp; hr < last;
             hr += kBertWarps, Advance(m, kBertWarps, retained)) {
          const int64_t query = LoadIndex(idx, index_base + m.i * index_stride);
          const char* src = p.mask.At(BertMaskSourceRowOffset(p.mask, m.b, m.h, query));
          char* dst = out.At(BertMaskOutOffset(out, m)) + j0 * out_stride;
          for (int64_t j = lane; j < tile; j += 32) {
            const Unit* s = reinterpret_cast<const Unit*>(src + key_offsets[j]);
            Unit* d = reinterpret_cast<Unit*>(dst + j * out_stride);
            for (int u = 0; u < p.units; ++u) d[u] = __ldg(s + u);
          }
        }
      }
    }
  }
}

// Widest unit (<= elem) dividing both bases and every stride in bytes.
int BertUnit(const GatherBertMaskArgs& args) {
  const int64_t elem = args.mask.elem_size();
  uint64_t bits =
      reinterpret_cast<uint64_t>(args.mask.data) | reinterpret_cast<uint64_t>(args.out.data);
  for (int d = 0; d < 4; ++d) bits |= static_cast<uint64_t>(args.mask.strides[d] * elem);
  for (int d = 0; d < 5; ++d) bits |= static_cast<uint64_t>(args.out.strides[d] * elem);
  return WidestDivisor(bits, static_cast<int>(elem));
}

// Output row `row` of [B,H,R] -> mask row (b,h,i), both from column 0.
struct GptRowMap {
  TensorView mask;
  TensorView out;

  __device__ __forceinline__ RowPtrs operator()(int64_t row) const {
    const GptMaskRowOffsets o = GptMaskRowOffsetsOf(mask, out, row);
    return {out.At(o.out), mask.At(o.mask)};
  }
};

}  // namespace

size_t GatherBertMaskWorkspaceBytes(const GatherBertMaskArgs& args) {
  return GatherBertMaskLayout(args).total;
}

absl::Status GatherBertMaskAsync(const GatherBertMaskArgs& args, Workspace ws, Stream stream) {
  RETURN_IF_ERROR(ValidateGatherBertMask(args));
  const IndexOpLayout layout = GatherBertMaskLayout(args);
  RETURN_IF_ERROR(CheckWorkspace(ws, layout.total, "GatherBertMask"));
  RETURN_IF_ERROR(ResetStatusAsync(ws, stream));
  const TensorView idx = SnapshotView(args.indices, SectionAt(ws, layout.snapshot));
  RETURN_IF_ERROR(LaunchSnapshot(args.indices, idx.data, stream));
  RETURN_IF_ERROR(LaunchIndexCheck(idx, args.mask.shape[3], nullptr, ws, stream));
  const TensorView& out = args.out;
  const int64_t index_rows = out.shape[0] * out.shape[1];
  const int64_t rows_per_index_row = out.shape[2] * out.shape[3];
  if (index_rows == 0 || rows_per_index_row == 0 || out.shape[4] == 0) return absl::OkStatus();
  BertMaskParams p{args.mask, idx, out, 0, 1};
  p.chunks = (rows_per_index_row + kBertRowsPerItem - 1) / kBertRowsPerItem;
  const int unit = BertUnit(args);
  p.units = static_cast<int>(args.mask.elem_size() / unit);
  const absl::StatusOr<unsigned> blocks = GridFor(index_rows * p.chunks, 1);
  if (!blocks.ok()) return blocks.status();
  // y: index rows (<= 65535), x: the chunks of one index row; the product
  // stays within the resident-block cap.
  const int64_t grid_y = std::min<int64_t>({index_rows, 65535, *blocks});
  const int64_t grid_x = std::max<int64_t>(1, std::min<int64_t>(p.chunks, *blocks / grid_y));
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y));
  switch (unit) {
    case 8:
      GatherBertMaskKernel<8><<<grid, kBertThreads, 0, stream>>>(p, ws);
      break;
    case 4:
      GatherBertMaskKernel<4><<<grid, kBertThreads, 0, stream>>>(p, ws);
      break;
    case 2:
      GatherBertMaskKernel<2><<<grid, kBertThreads, 0, stream>>>(p, ws);
      break;
    default:
      GatherBertMaskKernel<1><<<grid, kBertThreads, 0, stream>>>(p, ws);
      break;
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("GatherBertMaskKernel");
  return absl::OkStatus();
}

absl::Status GatherBertMaskFinish(const GatherBertMaskArgs& args, Workspace ws, Stream stream) {
  // The message is computed from the snapshot the device validated, with the
  // payload shrunk (oracle_args.h: a one-element mask, out of one head).
  GatherBertMaskArgs host =
      GatherBertMaskOracleArgs(args, SectionAt(ws, GatherBertMaskLayout(args).snapshot));
  return FinishWithCpuOracle(ws, stream, "GatherBertMask", {&host.indices}, {&host.mask, &host.out},
                             [&] { return cpu::GatherBertMask(host, nullptr); });
}

size_t SliceGptMaskWorkspaceBytes(const SliceGptMaskArgs&) { return kDeviceStatusBytes; }

absl::Status SliceGptMaskAsync(const SliceGptMaskArgs& args, Workspace ws, Stream stream) {
  RETURN_IF_ERROR(ValidateSliceGptMask(args));
  RETURN_IF_ERROR(CheckWorkspace(ws, SliceGptMaskWorkspaceBytes(args), "SliceGptMask"));
  RETURN_IF_ERROR(ResetStatusAsync(ws, stream));
  const TensorView& mask = args.mask;
  const TensorView& out = args.out;
  const int64_t retained = out.shape[3];
  const int64_t rows = out.shape[0] * out.shape[1] * out.shape[2];
  const RowCopyPlan plan = PlanRowCopy(
      rows, retained, mask.elem_size(), out.data, mask.data,
      {{out.strides[0], out.shape[0]}, {out.strides[1], out.shape[1]}, {out.strides[2], retained}},
      {{mask.strides[0], out.shape[0]},
       {mask.strides[1], out.shape[1]},
       {mask.strides[2], retained}},
      out.strides[3], mask.strides[3]);
  return LaunchRowCopy(plan, GptRowMap{mask, out}, ws, stream);
}

absl::Status SliceGptMaskFinish(const SliceGptMaskArgs& args, Workspace ws, Stream stream) {
  SliceGptMaskArgs host = args;
  return FinishWithCpuOracle(ws, stream, "SliceGptMask", {}, {&host.mask, &host.out},
                             [&] { return cpu::SliceGptMask(host, nullptr); });
}

}  // namespace tokensel::kernels::cuda
