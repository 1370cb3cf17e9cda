// Host helpers of the device status word (contracts: status.cuh).
#include "kernels/cuda/status.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/validate.h"

namespace tokensel::kernels::cuda {

absl::Status CheckWorkspace(Workspace ws, size_t required, absl::string_view op) {
  if (ws.data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": workspace is null (needs ", required, " bytes)"));
  }
  if (reinterpret_cast<uintptr_t>(ws.data) % 256 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": workspace must be 256-byte aligned (cudaMalloc memory is)"));
  }
  if (ws.bytes < required) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": workspace has ", ws.bytes, " bytes, needs ", required));
  }
  return absl::OkStatus();
}

absl::Status ResetStatusAsync(Workspace ws, Stream stream) {
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ws.data, 0, sizeof(StatusBlock), stream));
  return absl::OkStatus();
}

absl::StatusOr<HostStatus> ReadStatus(Workspace ws, Stream stream) {
  StatusBlock block{};
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&block, ws.data, sizeof(block), cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  HostStatus status;
  status.invalid = block.invalid != 0;
  if (block.first != 0) status.first_position = static_cast<int64_t>(~block.first);
  return status;
}

namespace {

// Host memory for one view: the byte extent [0, end) of the view (strides are
// >= 0, so the extent starts at the view's base pointer).
absl::StatusOr<std::unique_ptr<char[]>> HostBuffer(const TensorView& v, int64_t* bytes) {
  auto extent = ComputeExtent(v, "view");
  if (!extent.ok()) return extent.status();
  *bytes = extent->end;
  // 16 spare bytes and value-initialization: never a zero-sized allocation,
  // and scratch outputs start as zeros.
  return std::unique_ptr<char[]>(new char[static_cast<size_t>(extent->end) + 16]());
}

}  // namespace

absl::Status FinishWithCpuOracle(Workspace ws, Stream stream, absl::string_view op,
                                 absl::Span<TensorView* const> inputs,
                                 absl::Span<TensorView* const> scratch,
                                 absl::FunctionRef<absl::Status()> run_cpu) {
  auto status = ReadStatus(ws, stream);
  if (!status.ok()) return status.status();
  if (!status->invalid) return absl::OkStatus();

  std::vector<std::unique_ptr<char[]>> buffers;
  std::vector<const TensorView*> done;
  auto seen = [&](const TensorView* v) {
    return std::find(done.begin(), done.end(), v) != done.end();
  };
  for (TensorView* v : inputs) {
    if (v == nullptr || seen(v)) continue;
    done.push_back(v);
    int64_t bytes = 0;
    auto buf = HostBuffer(*v, &bytes);
    if (!buf.ok()) return buf.status();
    if (bytes > 0) {
      CUDA_RETURN_IF_ERROR(
          cudaMemcpy(buf->get(), v->data, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost));
    }
    v->data = buf->get();
    buffers.push_back(std::move(*buf));
  }
  for (TensorView* v : scratch) {
    if (v == nullptr || seen(v)) continue;
    done.push_back(v);
    int64_t bytes = 0;
    auto buf = HostBuffer(*v, &bytes);
    if (!buf.ok()) return buf.status();
    v->data = buf->get();
    buffers.push_back(std::move(*buf));
  }

  absl::Status cpu = run_cpu();
  if (cpu.ok()) {
    return absl::InternalError(
        absl::StrCat(op, ": device flagged invalid data but the CPU oracle accepts it"));
  }
  return cpu;
}

}  // namespace tokensel::kernels::cuda
