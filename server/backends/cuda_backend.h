// CudaBackend: runs kernels::cuda on one device over device memory.
//
// Device selection by UUID (as nvidia-smi prints it, "GPU-xxxxxxxx-..."; empty
// = the first device).
//
// Requests run under a StreamLease (BeginRequest; stream_lease.h has the
// order of every device call): one pooled stream from the first staging
// copy to the last copy back; inline inputs go host -> pinned block ->
// async copy on that stream, outputs are zero-filled on it, then the
// kernels (<Op>Async), the async copies back of the inline outputs, and one
// synchronization (<Op>Finish, which also returns the CPU twin's message on
// bad data). RunOp(args) alone is the same lease without staging.
//
// Three BlockPools per device (block_pool.h), so the steady state performs
// no cudaMalloc, cudaHostAlloc or (device-synchronizing) cudaFree:
//  - workspaces: device memory, 1 MiB granule; an op allocates at most what
//    ScratchBytes reports (the executor reserves it in its MemoryBudget
//    first) and reuses a cached block only up to twice that; idle bytes
//    capped at kMaxCachedWorkspaceBytes.
//  - device staging and pinned host staging: 4 KiB granule, each capped at
//    kMaxCachedStagingBytes of idle bytes. A staged tensor of n bytes takes
//    one block of each (RequestLease::StagingCost, both rounded, is what the
//    executor reserves). Pinned memory is page-locked host memory taken from
//    the node: in use it is bounded by the MemoryBudget (it is counted), idle
//    by the cap (beyond it, while the FreeGate is closed, charged to the
//    budget: AttachMemoryBudget).
// Blocks in use and cached thus stay below twice the bytes reserved by the
// requests in flight plus the caps. The direct staging API (AllocateStaging,
// Copy*: tests, tools) is separate: a cudaMalloc per call (its free through
// the device's FreeGate) and copies on a pooled non-blocking stream, then
// synchronized (never the legacy stream: docs/gpu.md, "Calls on request
// threads").
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
// restarts it), and every later BeginRequest / RunOp / AllocateStaging /
// Copy* answers UNAVAILABLE at once, without touching the device.
// UNAVAILABLE, not INTERNAL: those requests did nothing (safe to retry), and
// what clears the condition is the server's restart, as for the UNAVAILABLE
// of a server shutting down; INTERNAL stays the code of the op that actually
// faulted (its outputs may be partly written).
//
// Thread-safe: concurrent requests each take their own stream, workspace and
// staging.
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
#include "server/backends/block_pool.h"
#include "server/backends/completion_queue.h"
#include "server/backends/ipc_event_cache.h"
#include "server/backends/stream_lease.h"
#include "server/backends/stream_pool.h"
#include "server/core/backend.h"

namespace tokensel::backends {

class CudaBackend final : public core::Backend, private StreamDevice {
 public:
  // NOT_FOUND when no device has `device_uuid` (or there is no device at
  // all); INTERNAL on CUDA errors. `streams` (>= 1) streams are created up
  // front; more are created on demand when all are in use, and
  // those returned while kMaxIdleStreams are idle are destroyed
  // (stream_pool.h).
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(absl::string_view device_uuid,
                                                             int streams = 4);
  ~CudaBackend() override;

  absl::string_view name() const override { return "cuda"; }
  core::IpcEventSupport ipc_events() const override { return core::IpcEventSupport::kSupported; }
  bool CanAccess(core::MemoryKind kind) const override {
    return kind == core::MemoryKind::kCudaDevice;
  }
  std::vector<core::DeviceDescription> devices() const override { return {device_}; }
  absl::string_view device_label() const override { return label_; }
  bool OnDevice(absl::string_view device_uuid) const override;
  bool healthy() const override { return !failed_.load(std::memory_order_acquire); }
  int ordinal() const { return device_.ordinal; }

  // The direct staging API (cuda_backend_staging.cc).
  // Device memory (cudaMalloc, zero-filled); RESOURCE_EXHAUSTED when the
  // allocation fails, or when the device's FreeGate is past its room or
  // its max_deferred_bytes (free_gate.h). Copies return once done (on a
  // pooled stream, synchronized); INVALID_ARGUMENT when `bytes`
  // exceeds the staging size.
  absl::StatusOr<std::unique_ptr<Staging>> AllocateStaging(uint64_t bytes) override;
  absl::Status CopyToStaging(const Staging& dst, const void* src, uint64_t bytes) override;
  absl::Status CopyFromStaging(void* dst, const Staging& src, uint64_t bytes) override;

  // The request's lease: a stream, pooled staging, a workspace while the op
  // runs (StreamLease). UNAVAILABLE once the device is out of service.
  absl::StatusOr<std::unique_ptr<core::RequestLease>> BeginRequest() override;
  // A request with CUDA IPC events (StreamChain; its events from the
  // session's IpcEventCache, opened on this device). Async chains complete
  // on this backend's CompletionQueue thread (cuda_backend_events.cc).
  absl::StatusOr<std::unique_ptr<core::RequestChain>> BeginChain(const std::string& session,
                                                                 const core::IpcEvents& events,
                                                                 bool async) override;
  void BeginSession(const std::string& session) override;
  void EndSession(const std::string& session) override;
  // Shuts the completion queue down with a deadline already passed.
  void AbandonPendingWork() override;
  absl::Status RunOp(core::OpArgs args) override;
  // The device workspace RunOp(args) may allocate: the op's WorkspaceBytes
  // rounded up to the allocation granule (saturating; 0 for metadata that
  // fails validation).
  uint64_t OpScratchBytes(core::OpArgs args) const override;

  // Pool statistics (tests, metrics): device allocations made for workspaces
  // so far, and workspaces currently cached; the staging pools.
  int64_t workspace_allocations() const { return workspaces_.allocations(); }
  size_t cached_workspaces() const { return workspaces_.cached_blocks(); }
  const BlockPool& staging_pool() const { return staging_; }
  const BlockPool& pinned_pool() const { return pinned_; }

  // The pools' idle bytes beyond their caps (while frees wait on the
  // FreeGate) are charged to `budget` (block_pool.h); null detaches it.
  void AttachMemoryBudget(core::MemoryBudget* budget) override;
  const StreamPool& stream_pool() const { return streams_; }

  // Idle streams kept for reuse at least (stream_pool.h).
  static constexpr size_t kMaxIdleStreams = 16;
  // Idle workspace bytes the pool keeps for reuse; Release frees beyond it.
  static constexpr size_t kMaxCachedWorkspaceBytes = size_t{256} << 20;
  // Idle bytes each staging pool (device, pinned host) keeps for reuse.
  static constexpr size_t kMaxCachedStagingBytes = size_t{64} << 20;

 private:
  explicit CudaBackend(core::DeviceDescription device);
  absl::Status Init(int streams);

  // StreamDevice (stream_lease.h), with the CUDA runtime.
  absl::StatusOr<kernels::cuda::Stream> AcquireStream() override;
  void ReleaseStream(kernels::cuda::Stream stream) override;
  absl::Status CopyToDevice(void* dst, const void* src, uint64_t bytes,
                            kernels::cuda::Stream stream) override;
  absl::Status CopyToHost(void* dst, const void* src, uint64_t bytes,
                          kernels::cuda::Stream stream) override;
  absl::Status Zero(void* dst, uint64_t bytes, kernels::cuda::Stream stream) override;
  uint64_t WorkspaceBytes(core::OpArgs args) const override;
  absl::Status Launch(core::OpArgs args, kernels::cuda::Workspace ws,
                      kernels::cuda::Stream stream) override;
  absl::Status Finish(core::OpArgs args, kernels::cuda::Workspace ws,
                      kernels::cuda::Stream stream) override;
  absl::Status Drain(kernels::cuda::Stream stream, absl::Status status) override;
  // UNAVAILABLE once failed, else OK: checked before touching the device.
  absl::Status CheckUsable() const override;
  // Events (cuda_backend_events.cc).
  absl::StatusOr<Event> OpenIpcEvent(absl::string_view handle, absl::string_view field) override;
  absl::StatusOr<Event> CreateEvent() override;
  void DestroyEvent(Event event) override;
  absl::Status WaitEvent(kernels::cuda::Stream stream, Event event,
                         absl::string_view field) override;
  absl::Status RecordEvent(Event event, kernels::cuda::Stream stream,
                           absl::string_view field) override;
  absl::StatusOr<bool> EventDone(Event event) override;
  absl::StatusOr<bool> QueryStream(kernels::cuda::Stream stream) override;
  void MarkOutOfService(absl::string_view why) override;
  bool ContextFailed() const override { return sticky_.load(std::memory_order_acquire); }
  // A failed call on a client's event (client_event_error.h): the request's
  // error, the device marked failed only if a probe of it confirms.
  absl::Status ClientEventFailed(int code, const char* call, absl::string_view field);

  // The pools' allocators (RESOURCE_EXHAUSTED when the memory is not there;
  // a sticky error marks the device failed).
  absl::StatusOr<void*> AllocateDevice(size_t bytes, absl::string_view what);
  absl::StatusOr<void*> AllocatePinned(size_t bytes);
  // CheckUsable, then cudaSetDevice (the calling thread's device).
  absl::Status Activate(absl::string_view where);
  // OK, or the CUDA error `err` of `call` (noted, see NoteError).
  absl::Status Checked(int err, const char* call, absl::string_view where);

  // `err` (a cudaError_t) came back from a CUDA call of this backend: if it
  // is sticky, marks the backend failed (once; logged). True if it did now
  // or earlier.
  bool NoteError(int err, absl::string_view where);
  // INTERNAL unless `staging` was allocated by this backend (its device).
  absl::Status CheckOwn(const Staging& staging) const;
  // `status` (an op's INTERNAL) with a note that the device is now out of
  // service, when NoteError marked it failed.
  absl::Status WithFailure(absl::Status status) const;

  core::DeviceDescription device_;
  std::string label_;                // "cuda:<ordinal>"
  std::atomic<bool> failed_{false};  // out of service (sticky error or marked); never reset
  std::atomic<bool> sticky_{false};  // a sticky error was seen (ContextFailed); never reset
  mutable absl::Mutex failure_mu_;
  std::string failure_ ABSL_GUARDED_BY(failure_mu_);  // which error, where
  // Closed while a stream of this device waits on a client's event: the
  // pools then do not free, other frees of the device are deferred
  // (free_gate.h). The device's (ForDevice): it also gates the mappers'
  // teardown of the device's mappings, and outlives everything.
  FreeGate& free_gate_;
  StreamPool streams_;
  // Destroyed before the members above (their free functions read nothing
  // of this object but the ordinal they captured).
  BlockPool workspaces_;
  BlockPool staging_;
  BlockPool pinned_;
  // After the pools (destroyed before them): the async requests still
  // holding blocks and streams; the destructor shuts it down first of all.
  CompletionQueue completions_;
  IpcEventCache events_;  // destroyed first: its events need the device
};

// The CUDA backend when this build has one (server/backends/cuda_backend.cc),
// else FAILED_PRECONDITION (cuda_backend_nocuda.cc).
absl::StatusOr<std::unique_ptr<core::Backend>> MakeCudaBackend(absl::string_view device_uuid);

}  // namespace tokensel::backends

#endif  // TOKENSEL_SERVER_BACKENDS_CUDA_BACKEND_H_
