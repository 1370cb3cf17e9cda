// The CUDA row-copy engine of GatherTokens, ScatterTokens, SliceGptMask,
// MergeTokens and SplitTokens
// (the twin of kernels/cpu/copy_rows.h): copy `rows` rows, each of `count`
// elements of `elem` bytes, from src to dst, where an op-specific map gives
// the two row pointers of row `row` (it runs the shared HD index math of
// kernels/gather_math.h). Pure byte copies: the dtype never matters.
//
// Two kernels, chosen on the host by PlanRowCopy:
//   - CopyRowsKernel<kVec>: rows whose elements are contiguous on both sides
//     (channel stride 1, or one element per row). kVec in {16,8,4,2,1} is the
//     widest access such that dst - src and every row stride (bytes) of both
//     sides are multiples of kVec; each row then copies a byte head up to the
//     first kVec-aligned dst byte, whole kVec vectors (128-bit LDG/STG for
//     kVec = 16) and a byte tail. So any base alignment, any C and any row
//     stride work, and equally misaligned views still get 16-byte accesses.
//   - CopyStridedRowsKernel<kUnit>: any channel stride (0 on the source
//     included); each element is copied as elem/kUnit units of kUnit bytes,
//     kUnit the widest size dividing both bases and every stride.
// Work split: blocks of kCopyBlockThreads threads; a group of G (power of
// two, 1..256) consecutive threads per row, G sized from the row length, so
// a block copies 256/G rows at a time; the grid (capped at 8 blocks per SM)
// strides over the rows. 64-bit offsets throughout.
//
// Both kernels return at once when the op's status word is set (the
// validation kernel that ran before them on the stream found bad data).
#ifndef TOKENSEL_KERNELS_CUDA_COPY_KERNELS_CUH_
#define TOKENSEL_KERNELS_CUDA_COPY_KERNELS_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/status.cuh"

namespace tokensel::kernels::cuda {

inline constexpr int kCopyBlockThreads = 256;
// Vectors each thread keeps in flight per iteration of a long row.
inline constexpr int kCopyUnroll = 4;
// Resident blocks per SM the grid is capped at (2048 threads / 256).
inline constexpr int kCopyBlocksPerSm = 8;

// The two row pointers a map returns for one row. A null `dst` skips the
// row (maps that write only some rows: MergeTokens' and SplitTokens' copies
// of the rows not retained); all threads of the row's group see the same
// pointers, and the kernels use no warp-collective operation, so a skip
// diverges only between groups.
struct RowPtrs {
  char* dst;
  const char* src;
};

// A copy of `v` whose rank is the compile-time constant kRank (the validated
// rank): the shared HD math's loops over leading dims (RowOffset) then unroll
// to constant indices, so the copy stays in registers and no 64-bit division
// is emitted for dims that do not exist.
template <int kRank>
__device__ __forceinline__ TensorView WithRank(const TensorView& v) {
  TensorView r = v;
  r.rank = kRank;
  return r;
}

template <int kBytes>
struct VecType;
template <>
struct VecType<16> {
  using Type = uint4;
};
template <>
struct VecType<8> {
  using Type = uint2;
};
template <>
struct VecType<4> {
  using Type = unsigned int;
};
template <>
struct VecType<2> {
  using Type = unsigned short;
};
template <>
struct VecType<1> {
  using Type = unsigned char;
};

// Row geometry of both kernels (bytes unless noted).
struct RowCopyShape {
  int64_t rows = 0;
  int64_t count = 0;       // elements per row
  int64_t row_bytes = 0;   // count * elem (contiguous kernel)
  int64_t dst_stride = 0;  // element stride in bytes (strided kernel)
  int64_t src_stride = 0;
  int units = 1;       // elem / unit (strided kernel)
  int group_log2 = 0;  // threads per row = 1 << group_log2
};

// Copies `bytes` bytes from src to dst with the threads `lane` of a group of
// `group`; dst - src must be a multiple of kVec.
template <int kVec>
__device__ __forceinline__ void CopyRowBytes(char* __restrict__ dst, const char* __restrict__ src,
                                             int64_t bytes, int lane, int group) {
  using Vec = typename VecType<kVec>::Type;
  if constexpr (kVec > 1) {
    const int64_t misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(dst) & (kVec - 1));
    const int64_t head = min(bytes, static_cast<int64_t>((kVec - misaligned) & (kVec - 1)));
    for (int64_t k = lane; k < head; k += group) dst[k] = __ldg(src + k);
    dst += head;
    src += head;
    bytes -= head;
  }
  const int64_t nvec = bytes / kVec;
  Vec* __restrict__ d = reinterpret_cast<Vec*>(dst);
  const Vec* __restrict__ s = reinterpret_cast<const Vec*>(src);
  int64_t v = lane;
  for (; v + (kCopyUnroll - 1) * group < nvec; v += kCopyUnroll * group) {
    Vec r[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) r[u] = __ldg(s + v + u * group);
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) d[v + u * group] = r[u];
  }
  for (; v < nvec; v += group) d[v] = __ldg(s + v);
  if constexpr (kVec > 1) {
    for (int64_t k = nvec * kVec + lane; k < bytes; k += group) dst[k] = __ldg(src + k);
  }
}

// Rows are (row-group) work items: group `g` of the grid handles rows
// g, g + groups_in_grid, ...
template <int kVec, typename Map>
__global__ void __launch_bounds__(kCopyBlockThreads)
    CopyRowsKernel(const __grid_constant__ Map map, RowCopyShape shape, Workspace ws) {
  if (IsInvalid(ws)) return;
  const int group = 1 << shape.group_log2;
  const int lane = static_cast<int>(threadIdx.x) & (group - 1);
  const int64_t groups_per_block = kCopyBlockThreads >> shape.group_log2;
  const int64_t step = static_cast<int64_t>(gridDim.x) * groups_per_block;
  for (int64_t row =
           static_cast<int64_t>(blockIdx.x) * groups_per_block + (threadIdx.x >> shape.group_log2);
       row < shape.rows; row += step) {
    const RowPtrs p = map(row);
    if (p.dst == nullptr) continue;
    CopyRowBytes<kVec>(p.dst, p.src, shape.row_bytes, lane, group);
  }
}

template <int kUnit, typename Map>
__global__ void __launch_bounds__(kCopyBlockThreads)
    CopyStridedRowsKernel(const __grid_constant__ Map map, RowCopyShape shape, Workspace ws) {
  using Unit = typename VecType<kUnit>::Type;
  if (IsInvalid(ws)) return;
  const int group = 1 << shape.group_log2;
  const int lane = static_cast<int>(threadIdx.x) & (group - 1);
  const int64_t groups_per_block = kCopyBlockThreads >> shape.group_log2;
  const int64_t step = static_cast<int64_t>(gridDim.x) * groups_per_block;
  for (int64_t row =
           static_cast<int64_t>(blockIdx.x) * groups_per_block + (threadIdx.x >> shape.group_log2);
       row < shape.rows; row += step) {
    const RowPtrs p = map(row);
    if (p.dst == nullptr) continue;
    for (int64_t c = lane; c < shape.count; c += group) {
      Unit* __restrict__ d = reinterpret_cast<Unit*>(p.dst + c * shape.dst_stride);
      const Unit* __restrict__ s = reinterpret_cast<const Unit*>(p.src + c * shape.src_stride);
      for (int u = 0; u < shape.units; ++u) d[u] = __ldg(s + u);
    }
  }
}

// ---------------------------------------------------------------- host side

// One leading ("row") dimension of a side: its stride in elements and extent
// (dims of extent 1 do not constrain alignment).
struct RowDim {
  int64_t stride = 0;
  int64_t extent = 0;
};

// Largest power of two <= max_bytes dividing `bits` (an OR of addresses,
// address differences and strides in bytes).
inline int WidestDivisor(uint64_t bits, int max_bytes) {
  int w = max_bytes;
  while (w > 1 && (bits & static_cast<uint64_t>(w - 1)) != 0) w >>= 1;
  return w;
}

// The smallest power of two >= n (n >= 1), as log2.
inline int CeilLog2(int64_t n) {
  int log2 = 0;
  while ((int64_t{1} << log2) < n) ++log2;
  return log2;
}

struct RowCopyPlan {
  bool contiguous = true;
  int width = 1;  // kVec (contiguous) or kUnit (strided), bytes
  RowCopyShape shape;
};

// Chooses kernel, access width and group size. `dst_dims` / `src_dims` are
// the leading dims of each side that rows run over; `*_channel_stride` the
// element strides of the row's own dimension.
inline RowCopyPlan PlanRowCopy(int64_t rows, int64_t count, int64_t elem, const void* dst,
                               const void* src, std::initializer_list<RowDim> dst_dims,
                               std::initializer_list<RowDim> src_dims, int64_t dst_channel_stride,
                               int64_t src_channel_stride) {
  RowCopyPlan plan;
  plan.shape.rows = rows;
  plan.shape.count = count;
  uint64_t bits = 0;
  for (const RowDim& d : dst_dims) {
    if (d.extent > 1) bits |= static_cast<uint64_t>(d.stride * elem);
  }
  for (const RowDim& d : src_dims) {
    if (d.extent > 1) bits |= static_cast<uint64_t>(d.stride * elem);
  }
  const auto dst_addr = reinterpret_cast<uint64_t>(dst);
  const auto src_addr = reinterpret_cast<uint64_t>(src);
  plan.contiguous = count <= 1 || (dst_channel_stride == 1 && src_channel_stride == 1);
  if (plan.contiguous) {
    plan.width = WidestDivisor(bits | (dst_addr - src_addr), 16);
    plan.shape.row_bytes = count * elem;
    const int64_t nvec = (plan.shape.row_bytes + plan.width - 1) / plan.width;
    // Short rows: one vector per thread; long rows: kCopyUnroll per thread.
    plan.shape.group_log2 =
        nvec <= 32 ? CeilLog2(nvec)
                   : std::clamp(CeilLog2((nvec + kCopyUnroll - 1) / kCopyUnroll), 5, 8);
  } else {
    bits |= static_cast<uint64_t>(dst_channel_stride * elem) |
            static_cast<uint64_t>(src_channel_stride * elem);
    plan.width = WidestDivisor(bits | dst_addr | src_addr, static_cast<int>(elem));
    plan.shape.units = static_cast<int>(elem / plan.width);
    plan.shape.dst_stride = dst_channel_stride * elem;
    plan.shape.src_stride = src_channel_stride * elem;
    plan.shape.group_log2 = std::min(CeilLog2(count), 8);
  }
  return plan;
}

// Blocks for `work` items at `per_block` items per block, capped at
// kCopyBlocksPerSm resident blocks per SM of the current device.
inline absl::StatusOr<unsigned> GridFor(int64_t work, int64_t per_block) {
  int device = 0;
  int sms = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t{sms} * kCopyBlocksPerSm)));
}

// Enqueues the copy `plan` describes, with `map` giving the row pointers.
template <typename Map>
absl::Status LaunchRowCopy(const RowCopyPlan& plan, const Map& map, Workspace ws, Stream stream) {
  if (plan.shape.rows == 0 || plan.shape.count == 0) return absl::OkStatus();
  const absl::StatusOr<unsigned> grid =
      GridFor(plan.shape.rows, kCopyBlockThreads >> plan.shape.group_log2);
  if (!grid.ok()) return grid.status();
  const RowCopyShape& s = plan.shape;
  if (plan.contiguous) {
    switch (plan.width) {
      case 16:
        CopyRowsKernel<16><<<*grid, kCopyBlockThreads, 0, stream>>>(map, s, ws);
        break;
      case 8:
        CopyRowsKernel<8><<<*grid, kCopyBlockThreads, 0, stream>>>(map, s, ws);
        break;
      case 4:
        CopyRowsKernel<4><<<*grid, kCopyBlockThreads, 0, stream>>>(map, s, ws);
        break;
      case 2:
        CopyRowsKernel<2><<<*grid, kCopyBlockThreads, 0, stream>>>(map, s, ws);
        break;
      default:
        CopyRowsKernel<1><<<*grid, kCopyBlockThreads, 0, stream>>>(map, s, ws);
        break;
    }
    CUDA_RETURN_IF_LAUNCH_ERROR("CopyRowsKernel");
    return absl::OkStatus();
  }
  switch (plan.width) {
    case 8:
      CopyStridedRowsKernel<8><<<*grid, kCopyBlockThreads, 0, stream>>>(map, s, ws);
      break;
    case 4:
      CopyStridedRowsKernel<4><<<*grid, kCopyBlockThreads, 0, stream>>>(map, s, ws);
      break;
    case 2:
      CopyStridedRowsKernel<2><<<*grid, kCopyBlockThreads, 0, stream>>>(map, s, ws);
      break;
    default:
      CopyStridedRowsKernel<1><<<*grid, kCopyBlockThreads, 0, stream>>>(map, s, ws);
      break;
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("CopyStridedRowsKernel");
  return absl::OkStatus();
}

}  // namespace tokensel::kernels::cuda

#endif  // TOKENSEL_KERNELS_CUDA_COPY_KERNELS_CUH_
