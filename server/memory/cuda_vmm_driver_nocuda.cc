// CudaVmmDriver in a build without CUDA: nothing can be mapped; Available()
// says so, and CudaVmmMapper answers FAILED_PRECONDITION before it looks at
// anything else.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/memory/cuda_vmm_driver.h"

namespace tokensel::memory {
namespace {

class NoCudaDriver final : public CudaVmmDriver {
 public:
  absl::Status Available() override {
    return absl::FailedPreconditionError(
        "cuda_vmm: this server was built without CUDA; register host memory "
        "(FD_KIND_HOST_MEMORY) instead");
  }
  absl::StatusOr<std::vector<VmmDevice>> Devices() override { return Available(); }
  Result Import(int, int, Handle*) override { return kNotSupported; }
  Result Location(int, Handle, VmmLocation*) override { return kNotSupported; }
  Result Granularity(int, Handle, uint64_t*) override { return kNotSupported; }
  Result Reserve(int, uint64_t, uint64_t, uint64_t*) override { return kNotSupported; }
  Result Map(int, uint64_t, uint64_t, Handle) override { return kNotSupported; }
  Result SetAccess(int, uint64_t, uint64_t) override { return kNotSupported; }
  Result Unmap(int, uint64_t, uint64_t) override { return kNotSupported; }
  Result Free(int, uint64_t, uint64_t) override { return kNotSupported; }
  Result Release(int, Handle) override { return kNotSupported; }
  std::string ErrorName(Result result) override { return absl::StrCat("CUresult ", result); }
};

}  // namespace

CudaVmmDriver* RealCudaVmmDriver() {
  static NoCudaDriver* const driver = new NoCudaDriver();
  return driver;
}

}  // namespace tokensel::memory
