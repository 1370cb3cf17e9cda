// CUDA SampleTokens (contract: ops.h op 7 and kernels/sample_math.h; CPU twin:
// kernels/cpu/sample_tokens.cc). Bit-identical to the CPU.
//
// One launch, one 256-thread block per row (l, b) (grid-stride over rows):
//   - keys: thread t of a tile owns one position pair (2p, 2p+1) and draws it
//     with the shared Philox4x32_10 / SampleCounter / SampleKeyHalf
//     (kernels/philox.h, sample_math.h); the keys are recomputed on each pass
//     (10 rounds per pair, cheaper than storing S*8 bytes);
//   - the R SMALLEST keys with ties to the lower position = the R largest of
//     ~key with the same tie rule: BlockSelectThreshold<uint64_t> (select.cuh,
//     8-bit radix passes; with i.i.d. keys it stops after ~2 passes);
//   - BlockEmitSelected writes ids[slot] = position in ascending order and,
//     with an inverse, inverse[position] = slot or -1 for every position.
// R == 0 and R == S need no keys (nothing / everything is taken).
//
// Masks: after the ids kernel, GatherBertMaskAsync / SliceGptMaskAsync (c1's
// kernels/cuda/masks.cu) run on the same stream, reading the sampled ids back
// from `ids` (client memory: GatherBertMask snapshots and checks them like
// any client indices, so a client that rewrites them in between gets
// INVALID_ARGUMENT or its own values gathered, never an access outside the
// views). The workspace composes: [own status 256 B][bert_mask op
// workspace][gpt_mask op workspace], each part 256-aligned and sized by that
// op's WorkspaceBytes; SampleTokensFinish reads the own status word and calls
// the mask ops' Finish on their parts. SampleTokens has no data errors
// (ValidateSampleTokens checks everything), so the status words stay clear,
// except the bert part's when a client rewrote `ids` before the mask read
// them (GatherBertMask's INVALID_ARGUMENT on the "indices" it saw).
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/sample_keys.cuh"
#include "kernels/cuda/select.cuh"
#include "kernels/cuda/status.cuh"
#include "kernels/cuda/workspace_layout.h"
#include "kernels/ops.h"
#include "kernels/philox.h"
#include "kernels/sample_math.h"

namespace tokensel::kernels::cuda {
namespace {

constexpr int kSampleThreads = 256;
constexpr int kSampleItems = 2;  // one Philox draw = one position pair
constexpr int64_t kMaxBlocks = int64_t{1} << 16;

template <bool kInverse>
__global__ void __launch_bounds__(kSampleThreads)
    SampleKernel(TensorView ids, TensorView inverse, int64_t batch, int64_t s, int64_t r,
                 uint64_t seed, uint64_t step, bool ids_aligned, bool inv_aligned) {
  __shared__ SelectShared<kSampleThreads> sh;
  const int64_t rows = ids.shape[0] * batch;
  const int64_t id_stride = ids.strides[2];
  const int64_t inv_stride = kInverse ? inverse.strides[2] : 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    int64_t l;
    const int64_t b = DivMod(row, batch, &l);
    const SampleKeyFn key_of{SampleKey(seed), l, b, step};
    const BlockThreshold<uint64_t> t =
        BlockSelectThreshold<uint64_t, kSampleThreads, kSampleItems>(key_of, s, r, sh);
    const int64_t id_row = l * ids.strides[0] + b * ids.strides[1];
    const int64_t inv_row = kInverse ? l * inverse.strides[0] + b * inverse.strides[1] : 0;
    BlockEmitSelected<uint64_t, kSampleThreads, kSampleItems>(
        key_of, s, r, t, sh,
        [&](int64_t position, int64_t slot) {
          StoreId(ids, id_row + slot * id_stride, position, ids_aligned);
          if (kInverse) {
            StoreI32(inverse.data, inv_row + position * inv_stride, static_cast<int32_t>(slot),
                     inv_aligned);
          }
        },
        [&](int64_t position) {
          if (kInverse) StoreI32(inverse.data, inv_row + position * inv_stride, -1, inv_aligned);
        },
        /*visit_all=*/kInverse);
    __syncthreads();  // shared memory is reused by the next row
  }
}

GatherBertMaskArgs BertArgs(const SampleTokensArgs& a) {
  return GatherBertMaskArgs{*a.mask, a.ids, *a.bert_mask};
}
SliceGptMaskArgs GptArgs(const SampleTokensArgs& a) {
  return SliceGptMaskArgs{*a.mask, *a.gpt_mask};
}

// The mask ops' parts of the workspace (empty when not requested).
struct SampleLayout {
  Workspace bert;
  Workspace gpt;
  size_t total = kDeviceStatusBytes;
};

// Empty for args that fail validation (the server sizes the workspace
// before Async validates; BertArgs / GptArgs need a valid `mask`).
SampleLayout Layout(const SampleTokensArgs& args, Workspace ws) {
  SampleLayout l;
  if (!ValidateSampleTokens(args).ok()) return l;
  char* base = static_cast<char*>(ws.data);
  // Appends a part of `op_bytes` (<= kWorkspaceTooLarge, so aligning cannot
  // wrap); the total saturates at kWorkspaceTooLarge like every layout
  // (workspace_layout.h), and CheckWorkspace then refuses it.
  const auto append = [&](size_t op_bytes) {
    const size_t bytes = AlignWorkspace(op_bytes);
    const bool fits = bytes <= kWorkspaceTooLarge - l.total;
    const Workspace part{base == nullptr || !fits ? nullptr : base + l.total, bytes};
    l.total = fits ? l.total + bytes : kWorkspaceTooLarge;
    return part;
  };
  if (args.bert_mask.has_value()) l.bert = append(GatherBertMaskWorkspaceBytes(BertArgs(args)));
  if (args.gpt_mask.has_value()) l.gpt = append(SliceGptMaskWorkspaceBytes(GptArgs(args)));
  return l;
}

}  // namespace

size_t SampleTokensWorkspaceBytes(const SampleTokensArgs& args) {
  return Layout(args, Workspace{}).total;
}

absl::Status SampleTokensAsync(const SampleTokensArgs& args, Workspace ws, Stream stream) {
  RETURN_IF_ERROR(ValidateSampleTokens(args));
  const SampleLayout l = Layout(args, ws);
  RETURN_IF_ERROR(CheckWorkspace(ws, l.total, "SampleTokens"));
  RETURN_IF_ERROR(ResetStatusAsync(ws, stream));
  const int64_t rows = args.layers * args.batch;
  if (rows > 0) {
    const unsigned blocks = static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks);
    const int64_t s = args.original_tokens;
    const int64_t r = args.retained_tokens;
    if (args.inverse.has_value()) {
      SampleKernel<true><<<blocks, kSampleThreads, 0, stream>>>(
          args.ids, *args.inverse, args.batch, s, r, args.seed, args.step,
          ElementsAligned(args.ids), ElementsAligned(*args.inverse));
    } else {
      SampleKernel<false><<<blocks, kSampleThreads, 0, stream>>>(args.ids, TensorView{}, args.batch,
                                                                 s, r, args.seed, args.step,
                                                                 ElementsAligned(args.ids), true);
    }
    CUDA_RETURN_IF_LAUNCH_ERROR("SampleKernel");
  }
  if (args.bert_mask.has_value()) {
    RETURN_IF_ERROR(GatherBertMaskAsync(BertArgs(args), l.bert, stream));
  }
  if (args.gpt_mask.has_value()) {
    RETURN_IF_ERROR(SliceGptMaskAsync(GptArgs(args), l.gpt, stream));
  }
  return absl::OkStatus();
}

absl::Status SampleTokensFinish(const SampleTokensArgs& args, Workspace ws, Stream stream) {
  auto status = ReadStatus(ws, stream);
  if (!status.ok()) return status.status();
  if (status->invalid) {
    return absl::InternalError("SampleTokens: status word set (no data errors)");
  }
  const SampleLayout l = Layout(args, ws);
  if (args.bert_mask.has_value())
    RETURN_IF_ERROR(GatherBertMaskFinish(BertArgs(args), l.bert, stream));
  if (args.gpt_mask.has_value()) RETURN_IF_ERROR(SliceGptMaskFinish(GptArgs(args), l.gpt, stream));
  return absl::OkStatus();
}

}  // namespace tokensel::kernels::cuda
