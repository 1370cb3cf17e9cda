// MakeBackend: picks and constructs the server's Backend.
//
//   "cpu"  -> CpuBackend(threads).
//   "cuda" -> the CUDA backend. This build has none yet (the CUDA operators
//             are a later issue), so FAILED_PRECONDITION, naming the reason:
//             no CUDA device, or CUDA backend not built.
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
