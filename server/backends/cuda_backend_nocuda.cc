// MakeCudaBackend in builds without CUDA (contract: cuda_backend.h).
#include "absl/status/statusor.h"
#include "server/backends/cuda_backend.h"

namespace tokensel::backends {

absl::StatusOr<std::unique_ptr<core::Backend>> MakeCudaBackend(absl::string_view) {
  return absl::FailedPreconditionError("this server was built without CUDA (no CUDA backend)");
}

}  // namespace tokensel::backends
