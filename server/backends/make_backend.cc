#include "server/backends/make_backend.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "server/backends/cpu_backend.h"
#include "server/backends/cuda_backend.h"
#include "server/backends/cuda_devices.h"

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
    if (reason.empty()) {  // CudaBackend on the first visible device
      absl::StatusOr<std::unique_ptr<core::Backend>> cuda = MakeCudaBackend("");
      if (cuda.ok()) {
        TS_LOG(INFO) << "backend: cuda on " << (*cuda)->devices()[0].name << " "
                     << (*cuda)->devices()[0].uuid;
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
