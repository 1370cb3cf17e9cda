// CudaBackend: runs kernels::cuda on one device over device memory.
//
// Device selection by UUID (as nvidia-smi prints it, "GPU-xxxxxxxx-..."; empty
// = the first device). Run(args) is synchronous: WorkspaceBytes -> acquire a
// workspace -> <Op>Async on a pooled stream -> <Op>Finish (which synchronizes
// the stream and returns the CPU twin's message on bad data). Streams and
// workspaces are pooled: a workspace is a cached device allocation reused by
// later calls (the smallest free one that fits; a new one, rounded up to
// 1 MiB, only when none fits), so the steady state performs no cudaMalloc.
// Device memory is bounded whatever sizes clients ask for: an op allocates at
// most what ScratchBytes reports (the executor reserves it in its MemoryBudget
// first) and reuses a cached workspace only up to twice that, and the pool
// keeps at most kMaxCachedWorkspaceBytes of idle workspaces (Release frees the
// largest beyond it). Workspaces in use and cached thus stay below twice the
// scratch reserved by the ops in flight plus that cap.
// Staging is device memory; its copies are synchronous cudaMemcpy.
// Every CUDA call is checked (INTERNAL with the CUDA error text).
//
// One device per backend: MakeBackend builds one per visible device under a
// MultiDeviceBackend (multi_device_backend.h), which routes each request to
// the device of its buffers. OnDevice(uuid) is true for this device only.
// Metric device label: "cuda:<ordinal>".
//
// Sticky errors (kernels/cuda/sticky_error.h: an illegal address, a kernel
// trap, ...) corrupt the device's CUDA context for the rest of the process:
// every later call on it fails. When a CUDA call of this backend returns one
// (the stream sync after a failed op, cudaPeekAtLastError, an allocation or a
// staging copy), the op that hit it answers INTERNAL with the CUDA error and
// the backend marks itself failed: healthy() turns false for good (the
// server's health goes NOT_SERVING, core::HealthWatch, so the orchestrator
// restarts it), and every later RunOp / AllocateStaging / Copy* answers
// UNAVAILABLE at once, without touching the device. UNAVAILABLE, not
// INTERNAL: those requests did nothing (safe to retry), and what clears the
// condition is the server's restart, as for the UNAVAILABLE of a server
// shutting down; INTERNAL stays the code of the op that actually faulted
// (its outputs may be partly written).
//
// Thread-safe: concurrent Run calls each take their own stream and workspace.
// This header includes no CUDA header.
#ifndef TOKENSEL_SERVER_BACKENDS_CUDA_BACKEND_H_
#define TOKENSEL_SERVER_BACKENDS_CUDA_BACKEND_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/cuda_ops.h"
#include "server/core/backend.h"

namespace tokensel::backends {

class CudaBackend final : public core::Backend {
 public:
  // NOT_FOUND when no device has `device_uuid` (or there is no device at
  // all); INTERNAL on CUDA errors. `streams` (>= 1) streams are created up
  // front; more are created on demand when all are in use.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(absl::string_view device_uuid,
                                                             int streams = 4);
  ~CudaBackend() override;

  absl::string_view name() const override { return "cuda"; }
  core::IpcEventSupport ipc_events() const override {
    return core::IpcEventSupport::kNotImplemented;
  }
  bool CanAccess(core::MemoryKind kind) const override {
    return kind == core::MemoryKind::kCudaDevice;
  }
  std::vector<core::DeviceDescription> devices() const override { return {device_}; }
  absl::string_view device_label() const override { return label_; }
  bool OnDevice(absl::string_view device_uuid) const override;
  bool healthy() const override { return !failed_.load(std::memory_order_acquire); }
  int ordinal() const { return device_.ordinal; }

  // Device memory (cudaMalloc, zero-filled); RESOURCE_EXHAUSTED when the
  // allocation fails. Copies are synchronous; INVALID_ARGUMENT when `bytes`
  // exceeds the staging size.
  absl::StatusOr<std::unique_ptr<Staging>> AllocateStaging(uint64_t bytes) override;
  absl::Status CopyToStaging(const Staging& dst, const void* src, uint64_t bytes) override;
  absl::Status CopyFromStaging(void* dst, const Staging& src, uint64_t bytes) override;

  absl::Status RunOp(core::OpArgs args) override;
  // The device workspace RunOp(args) may allocate: the op's WorkspaceBytes
  // rounded up to the allocation granule (saturating; 0 for metadata that
  // fails validation).
  uint64_t OpScratchBytes(core::OpArgs args) const override;

  // Pool statistics (tests, metrics): device allocations made for workspaces
  // so far, and workspaces currently cached.
  int64_t workspace_allocations() const;
  size_t cached_workspaces() const;

  // Idle workspace bytes the pool keeps for reuse; Release frees beyond it.
  static constexpr size_t kMaxCachedWorkspaceBytes = size_t{256} << 20;

 private:
  explicit CudaBackend(core::DeviceDescription device);
  absl::Status Init(int streams);

  // Lease = (stream, workspace) for one op; returned to the pools by Release.
  struct Lease {
    kernels::cuda::Stream stream = nullptr;
    kernels::cuda::Workspace ws;
  };
  absl::StatusOr<Lease> Acquire(size_t workspace_bytes);
  void Release(const Lease& lease);

  // Validate, lease a stream and workspace, Async + Finish, release.
  template <typename Args>
  absl::Status RunTyped(const Args& args);

  // `err` (a cudaError_t) came back from a CUDA call of this backend: if it
  // is sticky, marks the backend failed (once; logged). True if it did now
  // or earlier.
  bool NoteError(int err, absl::string_view where);
  // UNAVAILABLE once failed, else OK: checked before touching the device.
  absl::Status CheckUsable() const;
  // INTERNAL unless `staging` was allocated by this backend (its device).
  absl::Status CheckOwn(const Staging& staging) const;
  // `status` (an op's INTERNAL) with a note that the device is now out of
  // service, when NoteError marked it failed.
  absl::Status WithFailure(absl::Status status) const;

  core::DeviceDescription device_;
  std::string label_;                // "cuda:<ordinal>"
  std::atomic<bool> failed_{false};  // a sticky error was seen; never reset
  mutable absl::Mutex failure_mu_;
  std::string failure_ ABSL_GUARDED_BY(failure_mu_);  // which error, where
  mutable absl::Mutex mu_;
  std::vector<kernels::cuda::Stream> all_streams_ ABSL_GUARDED_BY(mu_);
  std::vector<kernels::cuda::Stream> free_streams_ ABSL_GUARDED_BY(mu_);
  std::multimap<size_t, void*> free_workspaces_ ABSL_GUARDED_BY(mu_);  // bytes -> ptr
  size_t free_workspace_bytes_ ABSL_GUARDED_BY(mu_) = 0;               // held by free_workspaces_
  std::vector<void*> all_workspaces_ ABSL_GUARDED_BY(mu_);
  int64_t workspace_allocations_ ABSL_GUARDED_BY(mu_) = 0;
};

// The CUDA backend when this build has one (server/backends/cuda_backend.cc),
// else FAILED_PRECONDITION (cuda_backend_nocuda.cc).
absl::StatusOr<std::unique_ptr<core::Backend>> MakeCudaBackend(absl::string_view device_uuid);

}  // namespace tokensel::backends

#endif  // TOKENSEL_SERVER_BACKENDS_CUDA_BACKEND_H_
