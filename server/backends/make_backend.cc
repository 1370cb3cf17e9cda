#include "server/backends/make_backend.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "server/backends/cpu_backend.h"
#include "server/backends/cuda_backend.h"
#include "server/backends/cuda_devices.h"
#include "server/backends/multi_device_backend.h"

namespace tokensel::backends {
namespace {

// Why the CUDA backend cannot be used ("" when it can: CUDA is compiled in
// and a device is visible).
std::string CudaUnavailableReason() {
  if (!CudaCompiledIn()) {
    return "this server was built without CUDA (no CUDA backend)";
  }
  const std::vector<core::DeviceDescription> devices = ListCudaDevices();
  if (devices.empty()) return "no CUDA device is visible to this process";
  return "";
}

// One CudaBackend per visible device (its own streams, workspace pool and
// staging), under a MultiDeviceBackend that sends each request to the device
// of its buffers (multi_device_backend.h). Every device must come up: a
// server that silently left out a broken GPU would answer its worker's
// buffers with "a device this server does not serve" instead of failing
// where the operator looks (start-up).
absl::StatusOr<std::unique_ptr<core::Backend>> MakeCuda() {
  std::vector<std::unique_ptr<core::Backend>> per_device;
  for (const core::DeviceDescription& d : ListCudaDevices()) {
    absl::StatusOr<std::unique_ptr<core::Backend>> device = MakeCudaBackend(d.uuid);
    if (!device.ok()) {
      return absl::Status(device.status().code(), absl::StrCat("device ", d.ordinal, " (", d.uuid,
                                                               "): ", device.status().message()));
    }
    per_device.push_back(*std::move(device));
  }
  absl::StatusOr<std::unique_ptr<MultiDeviceBackend>> all =
      MultiDeviceBackend::Create(std::move(per_device));
  if (!all.ok()) return all.status();
  return std::unique_ptr<core::Backend>(*std::move(all));
}

std::unique_ptr<core::Backend> MakeCpu(int threads) {
  auto backend = std::make_unique<CpuBackend>(threads);
  TS_LOG(INFO) << "backend: cpu with " << backend->threads() << " threads";
  return backend;
}

}  // namespace

absl::StatusOr<std::unique_ptr<core::Backend>> MakeBackend(absl::string_view kind, int threads) {
  if (threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads: ", threads, " is negative (0 = one per hardware thread)"));
  }
  if (kind == "cpu") return MakeCpu(threads);
  if (kind == "cuda" || kind == "auto") {
    std::string reason = CudaUnavailableReason();
    if (reason.empty()) {  // a CudaBackend on every visible device
      absl::StatusOr<std::unique_ptr<core::Backend>> cuda = MakeCuda();
      if (cuda.ok()) {
        for (const core::DeviceDescription& d : (*cuda)->devices()) {
          TS_LOG(INFO) << "backend: cuda:" << d.ordinal << " on " << d.name << " " << d.uuid;
        }
        return cuda;
      }
      reason = cuda.status().ToString();
    }
    if (kind == "cuda") {
      return absl::FailedPreconditionError(
          absl::StrCat("backend: 'cuda' is not available: ", reason));
    }
    TS_LOG(INFO) << "backend auto: using cpu because " << reason;
    return MakeCpu(threads);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("backend: '", kind, "' is not one of auto, cpu, cuda"));
}

}  // namespace tokensel::backends
