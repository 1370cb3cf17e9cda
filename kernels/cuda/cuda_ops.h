// CUDA twins of the CPU operators (contracts: kernels/ops.h, docs/ops.md).
// This header includes no CUDA header, so host code built by g++ (the
// server's CudaBackend) can call it; the definitions are in *.cu files.
//
// Every op has the same three-part API:
//
//   size_t <Op>WorkspaceBytes(const <Op>Args& args);
//       Device scratch the op needs for `args`, from metadata only (layouts:
//       workspace_layout.h). Always >= kDeviceStatusBytes: the workspace
//       starts with the op's DeviceStatus word. May be called before
//       validation: for args Validate<Op> rejects it returns
//       kDeviceStatusBytes (Async then reports the error). Sizes that do not
//       fit return kWorkspaceTooLarge (SIZE_MAX / 2), never a wrapped value.
//       Grows with the client's index/ids/segment tensors: their snapshot
//       (one element per logical element, so a broadcast view costs its
//       full element count).
//
//   absl::Status <Op>Async(const <Op>Args& args, Workspace ws, Stream stream);
//       Validates metadata on the host (INVALID_ARGUMENT, nothing enqueued),
//       then enqueues on `stream`: reset the status word, copy every client
//       tensor whose values decide an address (indices, ids, segment ids and
//       the positions a mask reads) once into the workspace, validate that
//       copy on the device (index ranges, duplicates, segment structure), and
//       only if it is valid, write the outputs from it (the write kernels
//       read the status word first and exit when it is set). The client may
//       rewrite its memory at any moment meanwhile: no kernel reads such a
//       value twice (docs/gpu.md, "Trust boundary"). No host
//       synchronization, no allocation; every launch is checked with
//       cudaPeekAtLastError (INTERNAL on a CUDA error). All views must point
//       to device memory accessible from the current device.
//
//   absl::Status <Op>Finish(const <Op>Args& args, Workspace ws, Stream stream);
//       Synchronizes `stream`, reads the status word and returns OK, or on
//       the invalid-data path the exact INVALID_ARGUMENT message the CPU
//       implementation gives for the data the device validated (computed by
//       running the CPU op on host copies of the workspace snapshots, not of
//       the client's tensors; the error path may be slow; SamplePackedTokens
//       instead formats the CPU's text from a few words its kernels recorded,
//       so its host copy does not grow with N), or INTERNAL for a CUDA
//       error. `ws` must be the workspace Async used, untouched since.
//
// On the invalid-data path nothing has been written to any output.
// Thread-safety: concurrent calls are fine on different streams and
// workspaces whose outputs do not overlap.
#ifndef TOKENSEL_KERNELS_CUDA_CUDA_OPS_H_
#define TOKENSEL_KERNELS_CUDA_CUDA_OPS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/ops.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace tokensel::kernels::cuda {

using Stream = CUstream_st*;

// Caller-provided device scratch (CUB-style: query the size, then pass it).
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

// The status word at the start of every workspace (0 = valid) and the bytes
// reserved for it (keeps what follows 256-byte aligned).
struct DeviceStatus {
  uint32_t invalid;
};
inline constexpr size_t kDeviceStatusBytes = 256;

// Per op: the three entry points, and the same under uniform names
// (WorkspaceBytes / Async / Finish overloaded by argument type) for code
// generic over the ops (server/backends/cuda_backend.cc).
#define TOKENSEL_CUDA_OP(Op)                                                              \
  size_t Op##WorkspaceBytes(const Op##Args& args);                                        \
  absl::Status Op##Async(const Op##Args& args, Workspace ws, Stream stream);              \
  absl::Status Op##Finish(const Op##Args& args, Workspace ws, Stream stream);             \
  inline size_t WorkspaceBytes(const Op##Args& args) { return Op##WorkspaceBytes(args); } \
  inline absl::Status Async(const Op##Args& args, Workspace ws, Stream stream) {          \
    return Op##Async(args, ws, stream);                                                   \
  }                                                                                       \
  inline absl::Status Finish(const Op##Args& args, Workspace ws, Stream stream) {         \
    return Op##Finish(args, ws, stream);                                                  \
  }                                                                                       \
  static_assert(true, "")

TOKENSEL_CUDA_OP(SortTokens);
TOKENSEL_CUDA_OP(GatherTokens);
TOKENSEL_CUDA_OP(ScatterTokens);
TOKENSEL_CUDA_OP(GatherBertMask);
TOKENSEL_CUDA_OP(SliceGptMask);
TOKENSEL_CUDA_OP(SegmentSeqlens);
TOKENSEL_CUDA_OP(SampleTokens);
TOKENSEL_CUDA_OP(TopKTokens);
TOKENSEL_CUDA_OP(MergeTokens);
TOKENSEL_CUDA_OP(SplitTokens);
TOKENSEL_CUDA_OP(SamplePackedTokens);

#undef TOKENSEL_CUDA_OP

}  // namespace tokensel::kernels::cuda

#endif  // TOKENSEL_KERNELS_CUDA_CUDA_OPS_H_
