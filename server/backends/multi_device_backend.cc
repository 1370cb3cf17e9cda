// MultiDeviceBackend (contract and the routing rules: multi_device_backend.h).
#include "server/backends/multi_device_backend.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tokensel::backends {

absl::StatusOr<std::unique_ptr<MultiDeviceBackend>> MultiDeviceBackend::Create(
    std::vector<std::unique_ptr<core::Backend>> backends) {
  if (backends.empty()) {
    return absl::InvalidArgumentError("multi-device backend: no device");
  }
  std::vector<Device> devices;
  std::set<std::string> uuids;
  std::set<int> ordinals;
  for (std::unique_ptr<core::Backend>& backend : backends) {
    if (backend == nullptr) return absl::InvalidArgumentError("multi-device backend: null device");
    std::vector<core::DeviceDescription> described = backend->devices();
    if (described.size() != 1 || described[0].uuid.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("multi-device backend: a device backend must describe exactly one device "
                       "with a UUID, not ",
                       described.size()));
    }
    const core::DeviceDescription& d = described[0];
    if (!uuids.insert(absl::AsciiStrToLower(d.uuid)).second || !ordinals.insert(d.ordinal).second) {
      return absl::InvalidArgumentError(absl::StrCat("multi-device backend: device ", d.ordinal,
                                                     " (", d.uuid, ") is given twice"));
    }
    devices.push_back(Device{std::move(backend), d});
  }
  // Ordinal order: "ties to the lowest ordinal" is then "the lowest index".
  std::sort(devices.begin(), devices.end(), [](const Device& a, const Device& b) {
    return a.description.ordinal < b.description.ordinal;
  });
  return std::unique_ptr<MultiDeviceBackend>(new MultiDeviceBackend(std::move(devices)));
}

MultiDeviceBackend::MultiDeviceBackend(std::vector<Device> devices)
    : devices_(std::move(devices)), inflight_(devices_.size(), 0) {}

std::vector<core::DeviceDescription> MultiDeviceBackend::devices() const {
  std::vector<core::DeviceDescription> out;
  out.reserve(devices_.size());
  for (const Device& d : devices_) out.push_back(d.description);
  return out;
}

std::vector<std::string> MultiDeviceBackend::device_labels() const {
  std::vector<std::string> out;
  out.reserve(devices_.size());
  for (const Device& d : devices_) out.emplace_back(d.backend->device_label());
  return out;
}

int MultiDeviceBackend::Find(absl::string_view uuid) const {
  for (size_t i = 0; i < devices_.size(); ++i) {
    if (absl::EqualsIgnoreCase(devices_[i].description.uuid, uuid)) return static_cast<int>(i);
  }
  return -1;
}

bool MultiDeviceBackend::OnDevice(absl::string_view device_uuid) const {
  return Find(device_uuid) >= 0;
}

bool MultiDeviceBackend::healthy() const {
  return std::all_of(devices_.begin(), devices_.end(),
                     [](const Device& d) { return d.backend->healthy(); });
}

int MultiDeviceBackend::inflight(size_t i) const {
  tokensel::MutexLock lock(&mu_);
  return inflight_[i];
}

absl::StatusOr<core::BackendRoute> MultiDeviceBackend::Route(
    absl::FunctionRef<std::vector<core::TensorPlacement>()> placements) {
  const std::vector<core::TensorPlacement> tensors = placements();
  int chosen = -1;
  bool mixed = false;
  for (const core::TensorPlacement& t : tensors) {
    if (t.device_uuid.empty()) continue;  // host memory: CanAccess rejects it at resolution
    const int i = Find(t.device_uuid);
    if (i < 0) {
      std::string served;
      for (const Device& d : devices_)
        absl::StrAppend(&served, served.empty() ? "" : ", ", d.description.uuid);
      return absl::FailedPreconditionError(
          absl::StrCat(t.field, ": its buffer is on device ", t.device_uuid,
                       ", which this server does not serve (devices: ", served, ")"));
    }
    if (chosen < 0) {
      chosen = i;
    } else if (i != chosen) {
      mixed = true;
    }
  }
  if (mixed) {
    std::string where;
    for (const core::TensorPlacement& t : tensors) {
      if (t.device_uuid.empty()) continue;
      const Device& d = devices_[static_cast<size_t>(Find(t.device_uuid))];
      absl::StrAppend(&where, where.empty() ? "" : ", ", t.field, " on ", d.description.uuid, " (",
                      d.backend->device_label(), ")");
    }
    return absl::FailedPreconditionError(
        absl::StrCat("the op's tensors are on different devices: ", where,
                     "; an op runs on one device: give it buffers of one device (or send the "
                     "others inline)"));
  }
  tokensel::MutexLock lock(&mu_);
  if (chosen < 0) {
    // Inline-only: the healthy device with the fewest requests in flight,
    // ties to the lowest ordinal; with none healthy, the lowest ordinal.
    for (size_t i = 0; i < devices_.size(); ++i) {
      if (!devices_[i].backend->healthy()) continue;
      if (chosen < 0 || inflight_[i] < inflight_[static_cast<size_t>(chosen)]) {
        chosen = static_cast<int>(i);
      }
    }
    if (chosen < 0) chosen = 0;
  }
  ++inflight_[static_cast<size_t>(chosen)];
  return core::BackendRoute(devices_[static_cast<size_t>(chosen)].backend.get(), [this, chosen] {
    tokensel::MutexLock done_lock(&mu_);
    --inflight_[static_cast<size_t>(chosen)];
  });
}

absl::StatusOr<core::Backend*> MultiDeviceBackend::Only(absl::string_view call) const {
  if (devices_.size() == 1) return devices_[0].backend.get();
  return absl::InternalError(absl::StrCat("multi-device backend: ", call,
                                          " without Route (the device depends on the request's "
                                          "tensors; route the request first)"));
}

absl::StatusOr<std::unique_ptr<core::RequestLease>> MultiDeviceBackend::BeginRequest() {
  absl::StatusOr<core::Backend*> only = Only("BeginRequest");
  if (!only.ok()) return only.status();
  return (*only)->BeginRequest();
}

absl::StatusOr<std::unique_ptr<core::RequestChain>> MultiDeviceBackend::BeginChain(
    const std::string& session, const core::IpcEvents& events, bool async) {
  absl::StatusOr<core::Backend*> only = Only("BeginChain");
  if (!only.ok()) return only.status();
  return (*only)->BeginChain(session, events, async);
}

void MultiDeviceBackend::BeginSession(const std::string& session) {
  for (const Device& d : devices_) d.backend->BeginSession(session);
}

void MultiDeviceBackend::EndSession(const std::string& session) {
  for (const Device& d : devices_) d.backend->EndSession(session);
}

void MultiDeviceBackend::AbandonPendingWork() {
  for (const Device& d : devices_) d.backend->AbandonPendingWork();
}

void MultiDeviceBackend::AttachMemoryBudget(core::MemoryBudget* budget) {
  for (const Device& d : devices_) d.backend->AttachMemoryBudget(budget);
}

absl::StatusOr<std::unique_ptr<core::Backend::Staging>> MultiDeviceBackend::AllocateStaging(
    uint64_t bytes) {
  absl::StatusOr<core::Backend*> only = Only("AllocateStaging");
  if (!only.ok()) return only.status();
  return (*only)->AllocateStaging(bytes);
}

absl::Status MultiDeviceBackend::CopyToStaging(const Staging& dst, const void* src,
                                               uint64_t bytes) {
  absl::StatusOr<core::Backend*> only = Only("CopyToStaging");
  if (!only.ok()) return only.status();
  return (*only)->CopyToStaging(dst, src, bytes);
}

absl::Status MultiDeviceBackend::CopyFromStaging(void* dst, const Staging& src, uint64_t bytes) {
  absl::StatusOr<core::Backend*> only = Only("CopyFromStaging");
  if (!only.ok()) return only.status();
  return (*only)->CopyFromStaging(dst, src, bytes);
}

absl::Status MultiDeviceBackend::RunOp(core::OpArgs args) {
  absl::StatusOr<core::Backend*> only = Only("RunOp");
  if (!only.ok()) return only.status();
  return (*only)->RunOp(args);
}

uint64_t MultiDeviceBackend::OpScratchBytes(core::OpArgs args) const {
  uint64_t most = 0;
  for (const Device& d : devices_) most = std::max(most, d.backend->OpScratchBytes(args));
  return most;
}

}  // namespace tokensel::backends
