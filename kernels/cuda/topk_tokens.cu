// CUDA TopKTokens (contract: ops.h; CPU twin: kernels/cpu/topk_tokens.cc).
//
// One launch, one 256-thread block per row (grid-stride over rows):
//   - keys: the score bits mapped by ScoreKeyF32/F16/BF16 (kernels/select.h,
//     the CPU's functions: NaN lowest, -0 == +0), 4 consecutive positions per
//     thread per tile, recomputed from the scores on every pass (the row stays
//     in L1/L2; DRAM reads it once);
//   - BlockSelectThreshold (select.cuh): 8-bit radix select, shared-memory
//     histograms, at most 4 passes (fp32) / 2 (fp16, bf16), early exit when a
//     whole bucket is taken;
//   - BlockEmitSelected: in-order compaction (block scan of the packed
//     (#ties, #greater) pair), ids[slot] = position, stopping after the tile
//     that fills the R-th slot. Every slot is bounded by R (emit_slot.h): the
//     scores are client memory read again on every pass, and a client that
//     rewrites them mid-op gets a wrong but in-bounds selection (some slots
//     unwritten), never a write past its row.
// The result is the unique "R largest keys, ties to the lower position" set in
// ascending position order, so it equals the CPU output exactly.
// TopKTokens has no data errors: the status word is only reset (Finish reads
// it, and reports CUDA errors).
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/select.cuh"
#include "kernels/cuda/status.cuh"
#include "kernels/ops.h"
#include "kernels/select.h"

namespace tokensel::kernels::cuda {
namespace {

constexpr int kTopKThreads = 256;
constexpr int kTopKItems = 4;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;

struct F32Key {
  using Bits = uint32_t;
  __device__ static uint32_t Key(uint32_t b) { return ScoreKeyF32(b); }
};
struct F16Key {
  using Bits = uint16_t;
  __device__ static uint16_t Key(uint16_t b) { return ScoreKeyF16(b); }
};
struct BF16Key {
  using Bits = uint16_t;
  __device__ static uint16_t Key(uint16_t b) { return ScoreKeyBF16(b); }
};

// Keys of one row of scores (element stride `stride`).
template <typename D>
struct ScoreKeyFn {
  using Bits = typename D::Bits;
  const char* row;
  int64_t stride;  // elements
  int64_t n;
  bool aligned;

  __device__ __forceinline__ void operator()(int64_t first, Bits* keys) const {
#pragma unroll
    for (int j = 0; j < kTopKItems; ++j) {
      const int64_t i = first + j;
      Bits bits = 0;
      if (i < n) {
        const char* p = row + i * stride * static_cast<int64_t>(sizeof(Bits));
        if (aligned) {
          bits = *reinterpret_cast<const Bits*>(p);
        } else {
          memcpy(&bits, p, sizeof(Bits));
        }
      }
      keys[j] = D::Key(bits);
    }
  }
};

template <typename D>
__global__ void __launch_bounds__(kTopKThreads)
    TopKKernel(TensorView scores, TensorView ids, int64_t rows, int64_t s, int64_t r,
               bool scores_aligned, bool ids_aligned) {
  using K = typename D::Bits;
  __shared__ SelectShared<kTopKThreads> sh;
  const int64_t score_stride = LastStride(scores);
  const int64_t id_stride = LastStride(ids);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const ScoreKeyFn<D> key_of{scores.At(DeviceRowOffset(scores, row)), score_stride, s,
                               scores_aligned};
    const BlockThreshold<K> t = BlockSelectThreshold<K, kTopKThreads, kTopKItems>(key_of, s, r, sh);
    const int64_t out_row = DeviceRowOffset(ids, row);
    BlockEmitSelected<K, kTopKThreads, kTopKItems>(
        key_of, s, r, t, sh,
        [&](int64_t position, int64_t slot) {
          StoreId(ids, out_row + slot * id_stride, position, ids_aligned);
        },
        [](int64_t) {}, /*visit_all=*/false);
    __syncthreads();  // shared memory is reused by the next row
  }
}

template <typename D>
absl::Status Launch(const TopKTokensArgs& args, int64_t rows, int64_t s, int64_t r, Stream stream) {
  const unsigned blocks = static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks);
  TopKKernel<D><<<blocks, kTopKThreads, 0, stream>>>(
      args.scores, args.ids, rows, s, r, ElementsAligned(args.scores), ElementsAligned(args.ids));
  CUDA_RETURN_IF_LAUNCH_ERROR("TopKKernel");
  return absl::OkStatus();
}

}  // namespace

size_t TopKTokensWorkspaceBytes(const TopKTokensArgs&) { return kDeviceStatusBytes; }

absl::Status TopKTokensAsync(const TopKTokensArgs& args, Workspace ws, Stream stream) {
  RETURN_IF_ERROR(ValidateTopKTokens(args));
  RETURN_IF_ERROR(CheckWorkspace(ws, TopKTokensWorkspaceBytes(args), "TopKTokens"));
  RETURN_IF_ERROR(ResetStatusAsync(ws, stream));
  const int64_t rows = args.scores.NumRows();
  const int64_t s = args.scores.shape[args.scores.rank - 1];
  const int64_t r = args.ids.shape[args.ids.rank - 1];
  if (rows == 0 || r == 0) return absl::OkStatus();
  switch (args.scores.dtype) {
    case DType::kFloat16:
      return Launch<F16Key>(args, rows, s, r, stream);
    case DType::kBFloat16:
      return Launch<BF16Key>(args, rows, s, r, stream);
    default:
      return Launch<F32Key>(args, rows, s, r, stream);
  }
}

absl::Status TopKTokensFinish(const TopKTokensArgs&, Workspace ws, Stream stream) {
  auto status = ReadStatus(ws, stream);
  if (!status.ok()) return status.status();
  if (status->invalid) return absl::InternalError("TopKTokens: status word set (no data errors)");
  return absl::OkStatus();
}

}  // namespace tokensel::kernels::cuda
