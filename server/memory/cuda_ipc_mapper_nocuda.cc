// CudaIpcMapper in a build without CUDA: the spec is validated like in the
// CUDA build (so malformed requests get the same precise errors), then
// every Map fails with FAILED_PRECONDITION.
#include <variant>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/memory/cuda_ipc_mapper.h"

namespace tokensel::memory {

struct CudaIpcMapper::State {};

CudaIpcMapper::CudaIpcMapper() : state_(std::make_shared<State>()) {}
CudaIpcMapper::~CudaIpcMapper() = default;

absl::StatusOr<std::unique_ptr<core::MappedRegion>> CudaIpcMapper::Map(
    const core::RegionSpec& spec) {
  const auto* ipc = std::get_if<core::CudaIpcSpec>(&spec);
  if (ipc == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cuda_ipc mapper cannot map a ", core::RegionKindName(spec), " region"));
  }
  RETURN_IF_ERROR(ValidateCudaIpcSpec(*ipc));
  return absl::FailedPreconditionError(
      "cuda_ipc: this server was built without CUDA; register host_shm buffers instead");
}

size_t CudaIpcMapper::open_handle_count() const { return 0; }

std::unique_ptr<core::RegionMapper> MakeCudaIpcMapper() {
  return std::make_unique<CudaIpcMapper>();
}

}  // namespace tokensel::memory
