// CudaBackend (contract: cuda_backend.h). Compiled by the host compiler
// against cuda_runtime_api.h.
#include "server/backends/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <iterator>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/sticky_error.h"
#include "server/backends/cuda_device_switch.h"
#include "server/backends/stream_lease.h"

namespace tokensel::backends {
namespace {

namespace kc = ::tokensel::kernels::cuda;

constexpr size_t kWorkspaceGranule = size_t{1} << 20;  // round allocations up to 1 MiB

constexpr size_t kStagingGranule = size_t{4} << 10;  // staging blocks: 4 KiB (a page)

// The BlockPool free function of device memory on `ordinal`. Pools free
// idle blocks only (their request's stream was synchronized); cudaFree may
// synchronize the device, which is why it happens only beyond a pool's cap.
BlockPool::FreeFn FreeDevice(int ordinal) {
  return [ordinal](void* p) { FreeOnDevice(ordinal, "cudaFree", [p] { return cudaFree(p); }); };
}

// Pinned staging: allocated and freed with the device current. With unified
// addressing the memory is portable all the same (mapped into every
// context) and cudaFreeHost may synchronize any context: so the pinned pool
// passes the HOST gate (FreeGate::ForHost), open only while every device's
// gate is (free_gate.h), not this device's alone.
BlockPool::FreeFn FreePinned(int ordinal) {
  return [ordinal](void* p) {
    FreeOnDevice(ordinal, "cudaFreeHost", [p] { return cudaFreeHost(p); });
  };
}

// The StreamPool's destroy function. Not deferred: cudaStreamDestroy returns
// at once with work pending (stream_pool.h).
void DestroyStreamOn(void* s, intptr_t ordinal) {
  FreeOnDevice(static_cast<int>(ordinal), "cudaStreamDestroy",
               [s] { return cudaStreamDestroy(static_cast<cudaStream_t>(s)); });
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(absl::string_view device_uuid,
                                                                 int streams) {
  ASSIGN_OR_RETURN(std::vector<kc::DeviceInfo> devices, kc::ListDevices());
  if (devices.empty()) return absl::NotFoundError("cuda backend: no CUDA device is visible");
  const kc::DeviceInfo* chosen = device_uuid.empty() ? &devices[0] : nullptr;
  for (const kc::DeviceInfo& d : devices) {
    if (d.uuid == device_uuid) chosen = &d;
  }
  if (chosen == nullptr) {
    std::string known;
    for (const kc::DeviceInfo& d : devices)
      absl::StrAppend(&known, known.empty() ? "" : ", ", d.uuid);
    return absl::NotFoundError(absl::StrCat("cuda backend: no device with UUID '", device_uuid,
                                            "' (visible: ", known, ")"));
  }
  core::DeviceDescription desc{chosen->ordinal, chosen->uuid, chosen->name,
                               chosen->compute_capability, chosen->total_memory_bytes};
  std::unique_ptr<CudaBackend> backend(new CudaBackend(std::move(desc)));
  RETURN_IF_ERROR(backend->Init(streams < 1 ? 1 : streams));
  return backend;
}

CudaBackend::CudaBackend(core::DeviceDescription device)
    : device_(std::move(device)),
      label_(absl::StrCat("cuda:", device_.ordinal)),
      free_gate_(*PoolWiringOf(PoolKind::kDevice, device_.ordinal).gate),
      streams_(
          kMaxIdleStreams,
          [this]() -> absl::StatusOr<void*> {
            cudaStream_t s = nullptr;
            RETURN_IF_ERROR(Checked(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                                    "cudaStreamCreateWithFlags", "cudaStreamCreateWithFlags"));
            return static_cast<void*>(s);
          },
          &DestroyStreamOn, device_.ordinal),
      workspaces_(
          "cuda backend: a workspace", kWorkspaceGranule, kMaxCachedWorkspaceBytes,
          [this](size_t bytes) { return AllocateDevice(bytes, "workspace"); },
          FreeDevice(device_.ordinal), &free_gate_),
      staging_(
          "cuda backend: device staging", kStagingGranule, kMaxCachedStagingBytes,
          [this](size_t bytes) { return AllocateDevice(bytes, "staging"); },
          FreeDevice(device_.ordinal), &free_gate_),
      // The host gate: pinned memory is not per device (FreePinned).
      pinned_(
          "cuda backend: pinned host staging", kStagingGranule, kMaxCachedStagingBytes,
          [this](size_t bytes) { return AllocatePinned(bytes); }, FreePinned(device_.ordinal),
          PoolWiringOf(PoolKind::kPinnedHost, device_.ordinal).gate),
      completions_(this, StreamPools{&pinned_, &staging_, &workspaces_, &free_gate_}),
      events_(this) {}

absl::StatusOr<void*> CudaBackend::AllocateDevice(size_t bytes, absl::string_view what) {
  RETURN_IF_ERROR(Activate(what));
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (NoteError(err, absl::StrCat("cudaMalloc of ", what))) {
      return WithFailure(kc::CudaError(err, "cudaMalloc", __FILE__, __LINE__));
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda backend: ", what, " of ", bytes, " bytes: ", cudaGetErrorString(err)));
  }
  return p;
}

absl::StatusOr<void*> CudaBackend::AllocatePinned(size_t bytes) {
  RETURN_IF_ERROR(Activate("pinned staging"));
  void* p = nullptr;
  // Page-locked, so the stream's copies are asynchronous DMA in the stream's
  // order, overlapping the host and other streams (from pageable memory
  // cudaMemcpyAsync stages the bytes through a driver buffer before it
  // returns, synchronizing as needed: no overlap).
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (NoteError(err, "cudaHostAlloc of staging")) {
      return WithFailure(kc::CudaError(err, "cudaHostAlloc", __FILE__, __LINE__));
    }
    return absl::ResourceExhaustedError(absl::StrCat("cuda backend: pinned host staging of ", bytes,
                                                     " bytes: ", cudaGetErrorString(err)));
  }
  return p;
}

bool CudaBackend::OnDevice(absl::string_view device_uuid) const {
  return absl::EqualsIgnoreCase(device_uuid, device_.uuid);
}

bool CudaBackend::NoteError(int err, absl::string_view where) {
  const auto code = static_cast<cudaError_t>(err);
  // Apart from failed_ (which MarkOutOfService sets too): the completion
  // queue releases an item's resources only after a sticky error.
  if (kc::IsStickyError(code)) sticky_.store(true, std::memory_order_release);
  if (kc::IsStickyError(code) && !failed_.load(std::memory_order_acquire)) {
    absl::MutexLock lock(&failure_mu_);
    if (failure_.empty()) {
      failure_ = absl::StrCat(cudaGetErrorName(code), " in ", where);
      TS_LOG(ERROR) << "cuda backend: device " << label_ << " (" << device_.uuid
                    << ") is out of service: sticky CUDA error " << failure_
                    << "; its context is unusable until the server restarts (health: NOT_SERVING)";
    }
    failed_.store(true, std::memory_order_release);
  }
  return failed_.load(std::memory_order_acquire);
}

absl::Status CudaBackend::CheckUsable() const {
  if (!failed_.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::MutexLock lock(&failure_mu_);
  return absl::UnavailableError(absl::StrCat(
      "cuda backend: device ", label_, " (", device_.uuid, ") is out of service after ", failure_,
      " (a sticky CUDA error: the device's context is unusable until the server restarts); "
      "nothing ran"));
}

absl::Status CudaBackend::WithFailure(absl::Status status) const {
  if (status.ok() || !failed_.load(std::memory_order_acquire)) return status;
  return absl::Status(status.code(), absl::StrCat(status.message(), "; device ", label_,
                                                  " is now out of service until the server "
                                                  "restarts"));
}

absl::Status CudaBackend::Init(int streams) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_.ordinal));
  return streams_.Init(streams);
}

void CudaBackend::AttachMemoryBudget(core::MemoryBudget* budget) {
  // Every device pool of this device charges the device's own account: a
  // stuck client here refuses no other device's blocks; the pinned pool
  // charges the host account, which no device pool checks (memory_budget.h,
  // PoolWiringOf: the seventh review's item 1).
  const int device_account = PoolWiringOf(PoolKind::kDevice, device_.ordinal).account;
  workspaces_.AttachBudget(budget, device_account);
  staging_.AttachBudget(budget, device_account);
  pinned_.AttachBudget(budget, PoolWiringOf(PoolKind::kPinnedHost, device_.ordinal).account);
}

CudaBackend::~CudaBackend() {
  // Async requests still in flight hold streams and pool blocks: they
  // complete (the queue waits for their events, at most kShutdownWait)
  // before any is destroyed. What the queue abandoned may wait on a client
  // event for ever: those streams are destroyed without a synchronization
  // (cudaStreamDestroy returns at once; the driver releases the stream when
  // its work completes) and their blocks stay leaked (completion_queue.h).
  completions_.Shutdown();
  const std::vector<kc::Stream> stuck = completions_.abandoned_streams();
  // Every stream but the abandoned ones is back and idle (a released stream
  // has no work left).
  streams_.DestroyIdle();
  for (kc::Stream s : stuck) DestroyStreamOn(s, device_.ordinal);  // no synchronization
  // The frees deferred while streams waited on client events: this
  // device's gate is open now unless an abandoned stream still waits on a
  // client event.
  (void)free_gate_.DrainIfOpen();
  // The pools free their idle blocks as they are destroyed (no lease is
  // alive: a lease must not outlive its backend).
}

absl::Status CudaBackend::Activate(absl::string_view where) {
  RETURN_IF_ERROR(CheckUsable());
  if (const cudaError_t err = cudaSetDevice(device_.ordinal); err != cudaSuccess) {
    NoteError(err, "cudaSetDevice");
    return WithFailure(
        kc::CudaError(err, absl::StrCat("cudaSetDevice for ", where), __FILE__, __LINE__));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Checked(int err, const char* call, absl::string_view where) {
  const auto code = static_cast<cudaError_t>(err);
  if (code == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  NoteError(code, where);
  return WithFailure(kc::CudaError(code, call, __FILE__, __LINE__));
}

absl::StatusOr<kc::Stream> CudaBackend::AcquireStream() {
  RETURN_IF_ERROR(Activate("a request"));
  ASSIGN_OR_RETURN(void* const s, streams_.Acquire());
  return static_cast<kc::Stream>(s);
}

void CudaBackend::ReleaseStream(kc::Stream stream) { streams_.Release(stream); }

absl::Status CudaBackend::CopyToDevice(void* dst, const void* src, uint64_t bytes,
                                       kc::Stream stream) {
  RETURN_IF_ERROR(Activate("a copy to staging"));
  return Checked(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream),
                 "cudaMemcpyAsync to staging", "a copy to staging");
}

absl::Status CudaBackend::CopyToHost(void* dst, const void* src, uint64_t bytes,
                                     kc::Stream stream) {
  RETURN_IF_ERROR(Activate("a copy from staging"));
  return Checked(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream),
                 "cudaMemcpyAsync from staging", "a copy from staging");
}

absl::Status CudaBackend::Zero(void* dst, uint64_t bytes, kc::Stream stream) {
  RETURN_IF_ERROR(Activate("a zero fill of staging"));
  return Checked(cudaMemsetAsync(dst, 0, bytes, stream), "cudaMemsetAsync of staging",
                 "a zero fill of staging");
}

uint64_t CudaBackend::WorkspaceBytes(core::OpArgs args) const {
  return std::visit([](const auto* a) -> uint64_t { return kc::WorkspaceBytes(*a); }, args);
}

absl::Status CudaBackend::Launch(core::OpArgs args, kc::Workspace ws, kc::Stream stream) {
  RETURN_IF_ERROR(Activate("an op"));
  // The runtime's last error is per host thread, not per device: a worker
  // thread that last ran a faulting op on another device still holds that
  // error, and the first launch check of this op would report it as ours.
  // Not ours to classify either: that device's op already did.
  (void)cudaGetLastError();
  return std::visit([&](const auto* a) { return kc::Async(*a, ws, stream); }, args);
}

absl::Status CudaBackend::Finish(core::OpArgs args, kc::Workspace ws, kc::Stream stream) {
  // The device first, as on every other path: the worker thread may have
  // served another device since Launch, and the paths of kc::Finish that
  // copy through the legacy API (the CPU oracle's cudaMemcpy) use the
  // thread's current device. No usability check here: the op's own
  // synchronization decides its outcome (see Drain), even if a concurrent
  // op broke the device meanwhile.
  if (const cudaError_t err = cudaSetDevice(device_.ordinal); err != cudaSuccess) {
    NoteError(err, "cudaSetDevice");
    return WithFailure(
        kc::CudaError(err, "cudaSetDevice for an op's completion", __FILE__, __LINE__));
  }
  return std::visit([&](const auto* a) { return kc::Finish(*a, ws, stream); }, args);
}

absl::Status CudaBackend::Drain(kc::Stream stream, absl::Status status) {
  // A kernel fault surfaces here (or in the thread's last error) as a
  // sticky error: then this device is out of service (NoteError). An OK
  // Finish synchronized the stream without error, so no fault happened on
  // it; a fault of a concurrent op is caught by that op.
  // Only the stream's own status is this device's: the thread's last error
  // was consumed by the launch checks (or is stale, see Launch).
  // The "out of service" suffix goes only on an op whose drain itself
  // failed (after a sticky error every stream of the context reports it,
  // so this says "the device was dead when this op drained"): an op that
  // answered bad data while its own drain succeeded gets its error alone,
  // even if another op broke the device meanwhile.
  // The switch is checked (the sixth review: a failed cudaSetDevice was
  // ignored): the stream is synchronized all the same (SynchronizeOnDevice:
  // its blocks go back to the pools after this), the failure is logged and
  // the request fails with INTERNAL (the server's trouble, never the
  // client's), as a failed switch does on every other path.
  RuntimeDeviceSwitch ops;
  const DeviceCall call =
      SynchronizeOnDevice(ops, device_.ordinal, [stream] { return cudaStreamSynchronize(stream); });
  const auto drained = static_cast<cudaError_t>(call.result);
  (void)cudaGetLastError();
  if (!call.switched) {
    TS_LOG(ERROR) << "cuda backend: cudaSetDevice(" << device_.ordinal
                  << ") failed before an op's drain; the stream was synchronized without it ("
                  << cudaGetErrorString(drained) << ")";
    if (status.ok()) {
      status = absl::InternalError(absl::StrCat("cuda backend: cudaSetDevice(", device_.ordinal,
                                                ") failed for an op's drain"));
    }
  }
  if (NoteError(drained, "an op's stream") && drained != cudaSuccess) {
    return WithFailure(std::move(status));
  }
  return status;
}

absl::StatusOr<std::unique_ptr<core::RequestLease>> CudaBackend::BeginRequest() {
  ASSIGN_OR_RETURN(
      std::unique_ptr<StreamLease> lease,
      StreamLease::Begin(this, StreamPools{&pinned_, &staging_, &workspaces_, &free_gate_}));
  return std::unique_ptr<core::RequestLease>(std::move(lease));
}

absl::Status CudaBackend::RunOp(core::OpArgs args) {
  // The by-reference path (tests, tools): a lease with no staging.
  ASSIGN_OR_RETURN(std::unique_ptr<core::RequestLease> lease, BeginRequest());
  return lease->RunOp(args);
}

uint64_t CudaBackend::OpScratchBytes(core::OpArgs args) const {
  return std::visit(
      [this](const auto* a) -> uint64_t {
        return kernels::Validate(*a).ok() ? workspaces_.AllocationBytes(kc::WorkspaceBytes(*a)) : 0;
      },
      args);
}

absl::StatusOr<std::unique_ptr<core::Backend>> MakeCudaBackend(absl::string_view device_uuid) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::Create(device_uuid));
  return std::unique_ptr<core::Backend>(std::move(backend));
}

}  // namespace tokensel::backends
