// MakeBackend: picks and constructs the server's Backend.
//
//   "cpu"  -> CpuBackend(threads).
//   "cuda" -> a MultiDeviceBackend over one CudaBackend per visible device
//             (each op runs on the device of its buffers; see
//             multi_device_backend.h). FAILED_PRECONDITION, naming the
//             reason, when there is no CUDA device, the CUDA backend is not
//             built, or a device cannot be set up.
//   "auto" -> CUDA when a device exists and a CUDA backend is built, else the
//             CPU backend; the choice and its reason are logged.
//   anything else -> INVALID_ARGUMENT.
// `threads` is the CPU backend's parallelism (0 = hardware concurrency).
#ifndef TOKENSEL_SERVER_BACKENDS_MAKE_BACKEND_H_
#define TOKENSEL_SERVER_BACKENDS_MAKE_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/core/backend.h"

namespace tokensel::backends {

absl::StatusOr<std::unique_ptr<core::Backend>> MakeBackend(absl::string_view kind, int threads);

}  // namespace tokensel::backends

#endif  // TOKENSEL_SERVER_BACKENDS_MAKE_BACKEND_H_
