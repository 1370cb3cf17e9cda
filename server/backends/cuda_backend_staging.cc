// CudaBackend's direct staging API (contract: cuda_backend.h): AllocateStaging,
// CopyToStaging, CopyFromStaging (tests, tools; the request path stages
// through StreamLease). Compiled by the host compiler against
// cuda_runtime_api.h.
#include <cuda_runtime_api.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.cuh"
#include "server/backends/cuda_backend.h"
#include "server/backends/cuda_device_switch.h"

namespace tokensel::backends {
namespace {

namespace kc = ::tokensel::kernels::cuda;

// A FreeGate::Deferred function (the direct staging API's cudaFree): the
// argument is the device's ordinal. Always gone afterwards (its room back).
bool CudaFreeOn(void* p, intptr_t ordinal) {
  FreeOnDevice(static_cast<int>(ordinal), "cudaFree", [p] { return cudaFree(p); });
  return true;
}

// The direct staging API's fills and copies (AllocateStaging, Copy*): on a
// pooled non-blocking stream, then that stream synchronized, never on the
// legacy stream. The Programming Guide lists "a device memory set" (and
// any command to the NULL stream) among the operations that order the
// device's work around them, so a legacy cudaMemset followed by a legacy
// synchronization might wait behind a stream waiting on a client's event;
// a stream-ordered copy on our own non-blocking stream waits for nothing
// but its own stream (docs/gpu.md, "Calls on request threads"). Returns
// op's error, else the synchronization's; the stream goes back idle.
template <typename F>
absl::StatusOr<cudaError_t> OnPooledStream(StreamPool& streams, F op) {
  ASSIGN_OR_RETURN(void* const s, streams.Acquire());
  const auto stream = static_cast<cudaStream_t>(s);
  cudaError_t err = op(stream);
  const cudaError_t synced = cudaStreamSynchronize(stream);  // even after a failed op
  if (err == cudaSuccess) err = synced;
  streams.Release(s);
  return err;
}

class DeviceStaging final : public core::Backend::Staging {
 public:
  // Made before anything is allocated (AllocateStaging): if making it
  // throws, nothing is held; Allocate then takes the gate's room and the
  // memory, and from then on only the destructor gives them back.
  DeviceStaging(int ordinal, uint64_t size, FreeGate* gate)
      : ordinal_(ordinal), size_(size), gate_(gate) {}
  // cudaFree may synchronize the device: through the device's gate
  // (queued for its drainer, run while no stream of the device waits on a
  // client's event, free_gate.h). Nothing if Allocate failed.
  ~DeviceStaging() override {
    if (data_ != nullptr) gate_->FreeOrDefer({&CudaFreeOn, data_, ordinal_, size_});
  }
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;
  // Room for the deferred free, then the memory (the device current); on a
  // failure neither is held. Returns cudaMalloc's error.
  absl::Status Reserve() { return gate_->Reserve("cuda backend: staging"); }
  cudaError_t Allocate() {
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, size_ == 0 ? 1 : size_);
    if (err != cudaSuccess) {
      gate_->Unreserve();
      return err;
    }
    data_ = p;
    return cudaSuccess;
  }
  void* data() const override { return data_; }
  uint64_t size() const override { return size_; }
  int ordinal() const { return ordinal_; }

 private:
  const int ordinal_;
  void* data_ = nullptr;
  const uint64_t size_;
  FreeGate* const gate_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<core::Backend::Staging>> CudaBackend::AllocateStaging(
    uint64_t bytes) {
  RETURN_IF_ERROR(CheckUsable());
  if (const cudaError_t err = cudaSetDevice(device_.ordinal); err != cudaSuccess) {
    NoteError(err, "cudaSetDevice");
    return WithFailure(kc::CudaError(err, "cudaSetDevice", __FILE__, __LINE__));
  }
  // The owner first (may throw, holding nothing), then room for its free to
  // be deferred (free_gate.h), then the memory: no path holds the room or
  // the memory without the owner that gives them back.
  auto staging = std::make_unique<DeviceStaging>(device_.ordinal, bytes, &free_gate_);
  RETURN_IF_ERROR(staging->Reserve());
  if (const cudaError_t err = staging->Allocate(); err != cudaSuccess) {
    (void)cudaGetLastError();
    if (NoteError(err, "cudaMalloc of staging")) {
      return WithFailure(kc::CudaError(err, "cudaMalloc", __FILE__, __LINE__));
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda backend: staging of ", bytes, " bytes: ", cudaGetErrorString(err)));
  }
  void* const p = staging->data();
  // Zero-filled and synchronized before it is handed out: the ops' streams
  // do not wait for this one (issue 12 item 2). On a pooled stream, not
  // the legacy one (OnPooledStream).
  const auto fill = [&](cudaStream_t s) {
    return cudaMemsetAsync(p, 0, bytes == 0 ? 1 : bytes, s);
  };
  ASSIGN_OR_RETURN(const cudaError_t set, OnPooledStream(streams_, fill));
  if (set != cudaSuccess) {
    (void)cudaGetLastError();
    NoteError(set, "cudaMemsetAsync of staging");
    return WithFailure(kc::CudaError(set, "cudaMemsetAsync", __FILE__, __LINE__));
  }
  return staging;
}

absl::Status CudaBackend::CheckOwn(const Staging& staging) const {
  const auto* own = dynamic_cast<const DeviceStaging*>(&staging);
  if (own == nullptr || own->ordinal() != device_.ordinal) {
    return absl::InternalError(
        absl::StrCat("cuda backend: staging of another device used on ", device_label()));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyToStaging(const Staging& dst, const void* src, uint64_t bytes) {
  if (bytes > dst.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: copy of ", bytes, " bytes into staging of ", dst.size()));
  }
  RETURN_IF_ERROR(CheckOwn(dst));
  RETURN_IF_ERROR(CheckUsable());
  cudaError_t err = cudaSetDevice(device_.ordinal);
  if (err == cudaSuccess && bytes > 0) {
    // On a pooled stream, synchronized (OnPooledStream): from pageable
    // memory the copy may return once the driver staged the source, before
    // the DMA lands, and the op's stream does not wait for this one.
    const auto copy = [&](cudaStream_t s) {
      return cudaMemcpyAsync(dst.data(), src, bytes, cudaMemcpyHostToDevice, s);
    };
    ASSIGN_OR_RETURN(err, OnPooledStream(streams_, copy));
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    NoteError(err, "a copy to staging");
    return WithFailure(kc::CudaError(err, "cudaMemcpyAsync to staging", __FILE__, __LINE__));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyFromStaging(void* dst, const Staging& src, uint64_t bytes) {
  if (bytes > src.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: copy of ", bytes, " bytes from staging of ", src.size()));
  }
  RETURN_IF_ERROR(CheckOwn(src));
  RETURN_IF_ERROR(CheckUsable());
  cudaError_t err = cudaSetDevice(device_.ordinal);
  if (err == cudaSuccess && bytes > 0) {
    const auto copy = [&](cudaStream_t s) {
      return cudaMemcpyAsync(dst, src.data(), bytes, cudaMemcpyDeviceToHost, s);
    };
    ASSIGN_OR_RETURN(err, OnPooledStream(streams_, copy));
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    NoteError(err, "a copy from staging");
    return WithFailure(kc::CudaError(err, "cudaMemcpyAsync from staging", __FILE__, __LINE__));
  }
  return absl::OkStatus();
}

}  // namespace tokensel::backends
