// The device status word at the start of every op workspace, and the host
// helpers each <Op>Async / <Op>Finish uses (contracts: kernels/cuda/cuda_ops.h).
//
// Workspace layout: [0, kDeviceStatusBytes) is the status block, the op's own
// scratch starts at WorkspaceScratch(ws) (256-byte aligned when ws.data is).
// The block holds
//   uint32 invalid   0 = the data is valid, non-zero = a kernel found an error
//   uint64 first     ~(lowest offending position) recorded with atomicMax, 0 =
//                    none (an optional hint; the message comes from the oracle)
// Both are zeroed by ResetStatusAsync (one cudaMemsetAsync).
//
// Protocol of an op:
//   Async:  RETURN_IF_ERROR(Validate<Op>(args));
//           RETURN_IF_ERROR(CheckWorkspace(ws, <Op>WorkspaceBytes(args), "<Op>"));
//           RETURN_IF_ERROR(ResetStatusAsync(ws, stream));   // ALWAYS, even
//               // when there is nothing to do, so Finish never sees a stale word
//           LaunchSnapshot(args.indices, ...)   // client data read once
//           validate kernel(s): SetInvalid(ws[, position]) on bad data
//           write kernel(s):    if (IsInvalid(ws)) return;  ... write ...
//   Finish: <Op>Args host = args;
//           host.indices = SnapshotView(args.indices, <snapshot section>);
//           return FinishWithCpuOracle(ws, stream, "<Op>",
//               {&host.indices},             // read by the CPU op: copied
//               {&host.activations, &host.out},  // only need host memory
//               [&] { return cpu::<Op>(host, nullptr); });
//   (snapshot.cuh, workspace_layout.h: the validated data lives in the
//   workspace, so the message describes it, whatever the client wrote since.)
//
// Device functions are available when compiled by nvcc; the host helpers are
// plain C++ (defined in status.cu).
#ifndef TOKENSEL_KERNELS_CUDA_STATUS_CUH_
#define TOKENSEL_KERNELS_CUDA_STATUS_CUH_

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/hd.h"
#include "kernels/tensor_view.h"

namespace tokensel::kernels::cuda {

// Layout of the status block (the first kDeviceStatusBytes of a workspace).
struct StatusBlock {
  uint32_t invalid;  // == DeviceStatus::invalid
  uint32_t reserved;
  unsigned long long first;  // ~position via atomicMax; 0 = none recorded
};
static_assert(sizeof(StatusBlock) <= kDeviceStatusBytes, "status block too large");

// Rounds `bytes` up to a multiple of 256 (keeps scratch sub-buffers aligned).
TOKENSEL_HD constexpr size_t AlignWorkspace(size_t bytes) { return (bytes + 255) & ~size_t{255}; }

// The op's scratch: the workspace after the status block.
TOKENSEL_HD void* WorkspaceScratch(Workspace ws) {
  return static_cast<char*>(ws.data) + kDeviceStatusBytes;
}

TOKENSEL_HD StatusBlock* GetStatusBlock(Workspace ws) { return static_cast<StatusBlock*>(ws.data); }

#if defined(__CUDACC__)
// Marks the data invalid (any thread, any kernel of the op).
__device__ __forceinline__ void SetInvalid(Workspace ws) {
  atomicOr(&GetStatusBlock(ws)->invalid, 1u);
}
// Marks the data invalid and records `position` (>= 0, e.g. the row-major
// linear index of the offending element); the lowest position wins.
__device__ __forceinline__ void SetInvalid(Workspace ws, int64_t position) {
  StatusBlock* block = GetStatusBlock(ws);
  atomicMax(&block->first, ~static_cast<unsigned long long>(position));
  atomicOr(&block->invalid, 1u);
}
// True once any thread called SetInvalid. A volatile load: usable both in a
// later kernel of the same stream and, after a __syncthreads or a grid-wide
// barrier, inside the kernel that set it.
__device__ __forceinline__ bool IsInvalid(Workspace ws) {
  return *static_cast<volatile const uint32_t*>(&GetStatusBlock(ws)->invalid) != 0;
}
#endif  // __CUDACC__

// INVALID_ARGUMENT unless ws.data is non-null, 256-byte aligned and
// ws.bytes >= required. `op` names the operator in the message.
absl::Status CheckWorkspace(Workspace ws, size_t required, absl::string_view op);

// Enqueues the reset of the status block on `stream`.
absl::Status ResetStatusAsync(Workspace ws, Stream stream);

// The status block as the host sees it after the stream drained.
struct HostStatus {
  bool invalid = false;
  int64_t first_position = -1;  // -1 when no position was recorded
};

// Synchronizes `stream` and reads the status block (INTERNAL on CUDA errors,
// including a kernel fault reported by the synchronization).
absl::StatusOr<HostStatus> ReadStatus(Workspace ws, Stream stream);

// The body of every <Op>Finish. Synchronizes `stream` and reads the status
// word; when it is clear returns OK. Otherwise reproduces the CPU message:
//   - each view in `inputs` (device memory) is copied to a host buffer, byte
//     extent of the view with its strides preserved, and repointed to it;
//   - each view in `scratch` is repointed to zero-filled host memory of its
//     extent (outputs, and inputs the CPU op does not read before reporting a
//     data error, e.g. the activations of a gather);
//   - null entries are skipped (absent optional views);
//   - `run_cpu` runs the CPU op on those (now host) views.
// Returns the CPU op's INVALID_ARGUMENT, or INTERNAL "<op>: device flagged
// invalid data but the CPU oracle accepts it" when it returns OK (any other
// error of the CPU op is returned unchanged). The pointed-to views are
// modified (the caller passes views of a local copy of its args) and are only
// valid during the call. A view listed twice (in place ops) is copied once.
absl::Status FinishWithCpuOracle(Workspace ws, Stream stream, absl::string_view op,
                                 absl::Span<TensorView* const> inputs,
                                 absl::Span<TensorView* const> scratch,
                                 absl::FunctionRef<absl::Status()> run_cpu);

}  // namespace tokensel::kernels::cuda

#endif  // TOKENSEL_KERNELS_CUDA_STATUS_CUH_
