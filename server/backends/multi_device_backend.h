// MultiDeviceBackend: one backend per device (a CudaBackend per visible GPU
// in the server; fake backends in tests), and the decision which of them
// serves each request. It touches no device itself, so the dispatch rules
// are tested without a GPU (tests/server/backends/multi_device_backend_test.cc).
//
// Route (once per request, before anything is staged; the executor then
// stages, sizes scratch, runs and copies back on the routed device only):
//  - the request's by-reference tensors all live on device D: D. A CUDA IPC
//    mapping exists only in the context of the device it was opened on (the
//    device the client named); a kernel on another device would fault with
//    an illegal address, which is sticky and kills that device's context.
//  - they live on several devices: FAILED_PRECONDITION naming every
//    by-reference tensor (request field) and its device; nothing is staged,
//    nothing runs. (Copying across devices inside the server would hide a
//    client bug behind a slow peer copy; the client knows where its data is.)
//  - a device this server does not serve: FAILED_PRECONDITION (cannot happen
//    with the CUDA IPC mapper, which maps only onto visible devices).
//  - no by-reference tensor on a device (inline-only ops, e.g. SampleTokens
//    returning ids inline): the healthy device with the fewest requests in
//    flight, ties to the lowest ordinal; when no device is healthy, the
//    lowest ordinal (which answers UNAVAILABLE). In-flight counts every
//    request routed to a device whose BackendRoute is still alive (by
//    reference or inline), so inline work spreads over the idle devices
//    instead of queueing behind device 0's worker. The choice and the count
//    are one step under the lock, so concurrent inline requests spread.
// Host-memory tensors (no device) take no part: the routed CUDA backend
// rejects them when they are resolved (CanAccess).
//
// Everything else: name, ipc_events, CanAccess are the first device's (all
// devices are the same kind of backend); devices() and device_labels() list
// every device in ordinal order; OnDevice is true for any served device;
// healthy() is true while every device is (one dead device makes the server
// NOT_SERVING: only a restart gives its workers a working context again);
// OpScratchBytes is the largest of the devices' answers (they run the same
// kernels). Used without Route (BeginRequest, RunOp, AllocateStaging, Copy*) it forwards to
// its only device, and with several devices answers INTERNAL (the caller
// must route: the device depends on the request's tensors).
//
// Thread-safe: the devices are fixed at construction; the in-flight counts
// are guarded by a mutex; the devices' own calls are thread-safe. A
// BackendRoute must not outlive this object.
#ifndef TOKENSEL_SERVER_BACKENDS_MULTI_DEVICE_BACKEND_H_
#define TOKENSEL_SERVER_BACKENDS_MULTI_DEVICE_BACKEND_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "server/core/backend.h"

namespace tokensel::backends {

class MultiDeviceBackend final : public core::Backend {
 public:
  // INVALID_ARGUMENT unless `devices` is non-empty, each reports exactly one
  // DeviceDescription with a non-empty UUID, and UUIDs and ordinals are
  // distinct. They are kept in ordinal order.
  static absl::StatusOr<std::unique_ptr<MultiDeviceBackend>> Create(
      std::vector<std::unique_ptr<core::Backend>> devices);

  absl::string_view name() const override { return devices_[0].backend->name(); }
  core::IpcEventSupport ipc_events() const override { return devices_[0].backend->ipc_events(); }
  bool CanAccess(core::MemoryKind kind) const override {
    return devices_[0].backend->CanAccess(kind);
  }
  std::vector<core::DeviceDescription> devices() const override;
  std::vector<std::string> device_labels() const override;
  bool OnDevice(absl::string_view device_uuid) const override;
  bool healthy() const override;

  absl::StatusOr<core::BackendRoute> Route(
      absl::FunctionRef<std::vector<core::TensorPlacement>()> placements) override;

  absl::StatusOr<std::unique_ptr<core::RequestLease>> BeginRequest() override;
  // The only device's (the executor asks the routed device directly).
  absl::StatusOr<std::unique_ptr<core::RequestChain>> BeginChain(const std::string& session,
                                                                 const core::IpcEvents& events,
                                                                 bool async) override;
  // Every device's. If one throws, the devices before it have begun: the
  // caller ends the session (SessionManager::Open runs on_end), and an end
  // of a session a device never began does nothing there.
  void BeginSession(const std::string& session) override;
  void EndSession(const std::string& session) override;          // every device's
  void AbandonPendingWork() override;                            // every device's
  void AttachMemoryBudget(core::MemoryBudget* budget) override;  // every device's
  absl::StatusOr<std::unique_ptr<Staging>> AllocateStaging(uint64_t bytes) override;
  absl::Status CopyToStaging(const Staging& dst, const void* src, uint64_t bytes) override;
  absl::Status CopyFromStaging(void* dst, const Staging& src, uint64_t bytes) override;
  absl::Status RunOp(core::OpArgs args) override;
  uint64_t OpScratchBytes(core::OpArgs args) const override;

  size_t device_count() const { return devices_.size(); }
  // The backend of the i-th device in ordinal order, and the requests routed
  // to it now (tests, diagnostics).
  core::Backend& device(size_t i) const { return *devices_[i].backend; }
  int inflight(size_t i) const;

 private:
  struct Device {
    std::unique_ptr<core::Backend> backend;
    core::DeviceDescription description;
  };
  explicit MultiDeviceBackend(std::vector<Device> devices);

  // Index of the device with `uuid` (ASCII case-insensitive), -1 if none.
  int Find(absl::string_view uuid) const;
  // The only device, or INTERNAL naming `call` when there are several.
  absl::StatusOr<core::Backend*> Only(absl::string_view call) const;

  const std::vector<Device> devices_;
  mutable tokensel::Mutex mu_;
  std::vector<int> inflight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tokensel::backends

#endif  // TOKENSEL_SERVER_BACKENDS_MULTI_DEVICE_BACKEND_H_
