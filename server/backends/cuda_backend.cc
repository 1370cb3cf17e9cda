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

namespace tokensel::backends {
namespace {

namespace kc = ::tokensel::kernels::cuda;

constexpr size_t kWorkspaceGranule = size_t{1} << 20;  // round allocations up to 1 MiB

// The device allocation of a workspace of `bytes`: rounded up to the granule,
// SIZE_MAX when that would wrap (no allocation satisfies it).
size_t AllocationBytes(size_t bytes) {
  if (bytes > SIZE_MAX - (kWorkspaceGranule - 1)) return SIZE_MAX;
  return (bytes + kWorkspaceGranule - 1) / kWorkspaceGranule * kWorkspaceGranule;
}

class DeviceStaging final : public core::Backend::Staging {
 public:
  DeviceStaging(int ordinal, void* data, uint64_t size)
      : ordinal_(ordinal), data_(data), size_(size) {}
  ~DeviceStaging() override {
    if (data_ != nullptr) {
      cudaSetDevice(ordinal_);
      cudaFree(data_);
    }
  }
  void* data() const override { return data_; }
  uint64_t size() const override { return size_; }
  int ordinal() const { return ordinal_; }

 private:
  int ordinal_;
  void* data_;
  uint64_t size_;
};

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
    : device_(std::move(device)), label_(absl::StrCat("cuda:", device_.ordinal)) {}

bool CudaBackend::OnDevice(absl::string_view device_uuid) const {
  return absl::EqualsIgnoreCase(device_uuid, device_.uuid);
}

bool CudaBackend::NoteError(int err, absl::string_view where) {
  const auto code = static_cast<cudaError_t>(err);
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
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < streams; ++i) {
    cudaStream_t s = nullptr;
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    all_streams_.push_back(s);
    free_streams_.push_back(s);
  }
  return absl::OkStatus();
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_.ordinal);
  absl::MutexLock lock(&mu_);
  for (kc::Stream s : all_streams_) {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
  for (void* p : all_workspaces_) cudaFree(p);
}

absl::StatusOr<CudaBackend::Lease> CudaBackend::Acquire(size_t workspace_bytes) {
  if (const cudaError_t err = cudaSetDevice(device_.ordinal); err != cudaSuccess) {
    NoteError(err, "cudaSetDevice");
    return WithFailure(kc::CudaError(err, "cudaSetDevice", __FILE__, __LINE__));
  }
  // The runtime's last error is per host thread, not per device: a worker
  // thread that last ran a faulting op on another device still holds that
  // error, and the first launch check of this op would report it as ours.
  // Not ours to classify either: that device's op already did.
  (void)cudaGetLastError();
  Lease lease;
  {
    absl::MutexLock lock(&mu_);
    if (!free_streams_.empty()) {
      lease.stream = free_streams_.back();
      free_streams_.pop_back();
    }
    // The smallest cached workspace that fits, unless it is more than twice
    // the allocation ScratchBytes reserved for this op (a small op must not
    // hold on to a large block while the next large op allocates another).
    auto it = free_workspaces_.lower_bound(workspace_bytes);
    if (it != free_workspaces_.end() && it->first / 2 <= AllocationBytes(workspace_bytes)) {
      lease.ws = {it->second, it->first};
      free_workspace_bytes_ -= it->first;
      free_workspaces_.erase(it);
    }
  }
  if (lease.stream == nullptr) {  // every stream busy: grow the pool
    cudaStream_t s = nullptr;
    const cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
      Release(lease);  // the pooled workspace taken above goes back
      NoteError(err, "cudaStreamCreateWithFlags");
      return WithFailure(kc::CudaError(err, "cudaStreamCreateWithFlags", __FILE__, __LINE__));
    }
    absl::MutexLock lock(&mu_);
    all_streams_.push_back(s);
    lease.stream = s;
  }
  if (lease.ws.data == nullptr) {
    // Rounded up to the granule (ScratchBytes reports the same size); a size
    // that would wrap is refused (the kernels cap theirs at SIZE_MAX / 2).
    const size_t bytes = AllocationBytes(workspace_bytes);
    if (bytes == SIZE_MAX) {
      Release(lease);
      return absl::ResourceExhaustedError(
          absl::StrCat("cuda backend: a workspace of ", workspace_bytes, " bytes"));
    }
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      Release(lease);
      if (NoteError(err, "cudaMalloc of a workspace")) {
        return WithFailure(kc::CudaError(err, "cudaMalloc", __FILE__, __LINE__));
      }
      return absl::ResourceExhaustedError(
          absl::StrCat("cuda backend: workspace of ", bytes, " bytes: ", cudaGetErrorString(err)));
    }
    absl::MutexLock lock(&mu_);
    all_workspaces_.push_back(p);
    ++workspace_allocations_;
    lease.ws = {p, bytes};
  }
  return lease;
}

void CudaBackend::Release(const Lease& lease) {
  std::vector<void*> to_free;
  {
    absl::MutexLock lock(&mu_);
    if (lease.stream != nullptr) free_streams_.push_back(lease.stream);
    if (lease.ws.data != nullptr) {
      free_workspaces_.emplace(lease.ws.bytes, lease.ws.data);
      free_workspace_bytes_ += lease.ws.bytes;
    }
    // Idle memory stays bounded: without this, requests of ever larger
    // workspaces (each within the budget) would each add an allocation the
    // pool then kept for good, until the device (and the training jobs
    // sharing it) ran out of memory. The largest go first.
    while (free_workspace_bytes_ > kMaxCachedWorkspaceBytes) {
      const auto largest = std::prev(free_workspaces_.end());
      free_workspace_bytes_ -= largest->first;
      to_free.push_back(largest->second);
      all_workspaces_.erase(
          std::find(all_workspaces_.begin(), all_workspaces_.end(), largest->second));
      free_workspaces_.erase(largest);
    }
  }
  if (to_free.empty()) return;
  // Outside the lock: cudaFree waits for the device. The workspaces are idle
  // (their op's stream was drained before Release).
  (void)cudaSetDevice(device_.ordinal);
  for (void* p : to_free) (void)cudaFree(p);
}

template <typename Args>
absl::Status CudaBackend::RunTyped(const Args& args) {
  // A failed device is not touched again (no launch on a dead context).
  RETURN_IF_ERROR(CheckUsable());
  // The workspace size is defined for valid metadata only (cuda_ops.h).
  RETURN_IF_ERROR(kernels::Validate(args));
  ASSIGN_OR_RETURN(const Lease lease, Acquire(kc::WorkspaceBytes(args)));
  absl::Status st = kc::Async(args, lease.ws, lease.stream);
  if (st.ok()) st = kc::Finish(args, lease.ws, lease.stream);
  if (!st.ok()) {
    // Kernels may still be queued (a later launch failed, or Finish stopped
    // at a CUDA error before it synchronized): drain before the workspace
    // goes back to the pool, where the next op would share it with them.
    // A kernel fault surfaces here (or in the thread's last error) as a
    // sticky error: then this device is out of service (NoteError). An OK
    // Finish synchronized the stream without error, so no fault happened on
    // it; a fault of a concurrent op is caught by that op.
    // Only the stream's own status is this device's: the thread's last error
    // was consumed by the launch checks (or is stale, see Acquire).
    // The "out of service" suffix goes only on an op whose drain itself
    // failed (after a sticky error every stream of the context reports it,
    // so this says "the device was dead when this op drained"): an op that
    // answered bad data while its own drain succeeded gets its error alone,
    // even if another op broke the device meanwhile.
    const cudaError_t drained = cudaStreamSynchronize(lease.stream);
    (void)cudaGetLastError();
    if (NoteError(drained, "an op's stream") && drained != cudaSuccess) {
      st = WithFailure(std::move(st));
    }
  }
  Release(lease);
  return st;
}

absl::Status CudaBackend::RunOp(core::OpArgs args) {
  return std::visit([this](const auto* a) { return RunTyped(*a); }, args);
}

uint64_t CudaBackend::OpScratchBytes(core::OpArgs args) const {
  return std::visit(
      [](const auto* a) -> uint64_t {
        return kernels::Validate(*a).ok() ? AllocationBytes(kc::WorkspaceBytes(*a)) : 0;
      },
      args);
}

absl::StatusOr<std::unique_ptr<core::Backend::Staging>> CudaBackend::AllocateStaging(
    uint64_t bytes) {
  RETURN_IF_ERROR(CheckUsable());
  if (const cudaError_t err = cudaSetDevice(device_.ordinal); err != cudaSuccess) {
    NoteError(err, "cudaSetDevice");
    return WithFailure(kc::CudaError(err, "cudaSetDevice", __FILE__, __LINE__));
  }
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (NoteError(err, "cudaMalloc of staging")) {
      return WithFailure(kc::CudaError(err, "cudaMalloc", __FILE__, __LINE__));
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda backend: staging of ", bytes, " bytes: ", cudaGetErrorString(err)));
  }
  auto staging = std::make_unique<DeviceStaging>(device_.ordinal, p, bytes);
  // cudaMemset of device memory is asynchronous and runs on the legacy
  // stream, which the ops' non-blocking streams do not wait for: without the
  // synchronization the zero fill could land after the kernel wrote the
  // output (issue 12 item 2; the pinned, stream-ordered staging is still to
  // come).
  cudaError_t set = cudaMemset(p, 0, bytes == 0 ? 1 : bytes);
  if (set == cudaSuccess) set = cudaStreamSynchronize(cudaStreamLegacy);
  if (set != cudaSuccess) {
    NoteError(set, "cudaMemset of staging");
    return WithFailure(kc::CudaError(set, "cudaMemset", __FILE__, __LINE__));
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
    // From pageable memory cudaMemcpy may return once the source is staged
    // by the driver, before the DMA to the device lands; the op's
    // non-blocking stream does not wait for the legacy stream: synchronize.
    err = cudaMemcpy(dst.data(), src, bytes, cudaMemcpyHostToDevice);
    if (err == cudaSuccess) err = cudaStreamSynchronize(cudaStreamLegacy);
  }
  if (err != cudaSuccess) {
    NoteError(err, "a copy to staging");
    return WithFailure(kc::CudaError(err, "cudaMemcpy to staging", __FILE__, __LINE__));
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
    err = cudaMemcpy(dst, src.data(), bytes, cudaMemcpyDeviceToHost);
  }
  if (err != cudaSuccess) {
    NoteError(err, "a copy from staging");
    return WithFailure(kc::CudaError(err, "cudaMemcpy from staging", __FILE__, __LINE__));
  }
  return absl::OkStatus();
}

int64_t CudaBackend::workspace_allocations() const {
  absl::MutexLock lock(&mu_);
  return workspace_allocations_;
}

size_t CudaBackend::cached_workspaces() const {
  absl::MutexLock lock(&mu_);
  return free_workspaces_.size();
}

absl::StatusOr<std::unique_ptr<core::Backend>> MakeCudaBackend(absl::string_view device_uuid) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::Create(device_uuid));
  return std::unique_ptr<core::Backend>(std::move(backend));
}

}  // namespace tokensel::backends
