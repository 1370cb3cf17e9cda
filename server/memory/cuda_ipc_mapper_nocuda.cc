// CudaIpcMapper's driver in a build without CUDA: every open fails with
// FAILED_PRECONDITION (the mapper's device-free checks, cuda_ipc_mapper.cc,
// run first, so malformed requests get the same precise errors).
#include "server/memory/cuda_ipc_mapper.h"

namespace tokensel::memory {
namespace {

class NoCudaIpcOps final : public IpcHandleOps {
 public:
  absl::StatusOr<Opened> Open(const std::string& /*handle*/, int /*device*/) override {
    return absl::FailedPreconditionError(
        "cuda_ipc: this server was built without CUDA; register host_shm buffers instead");
  }
  void Close(void* /*base*/, int /*device*/) noexcept override {}
};

}  // namespace

IpcHandleOps* RealCudaIpcOps() {
  static NoCudaIpcOps* const ops = new NoCudaIpcOps();
  return ops;
}

}  // namespace tokensel::memory
