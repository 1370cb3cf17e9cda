// CudaVmmMapping: see cuda_vmm_mapping.h.
#include "server/memory/cuda_vmm_mapping.h"

#include "absl/strings/string_view.h"
#include "common/log.h"

namespace tokensel::memory {
namespace {

void LogFailure(CudaVmmDriver* driver, absl::string_view what, CudaVmmDriver::Result r) {
  if (r != CudaVmmDriver::kSuccess) {
    TS_LOG(ERROR) << what << " of a cuda_vmm region: " << driver->ErrorName(r);
  }
}

}  // namespace

void VmmMapping::Undo() {
  for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
    if (it->mapped)
      LogFailure(driver, "cuMemUnmap", driver->Unmap(device, va + it->at, it->length));
    it->mapped = false;
  }
  if (reserved) LogFailure(driver, "cuMemAddressFree", driver->Free(device, va, length));
  reserved = false;
  for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
    if (it->imported) LogFailure(driver, "cuMemRelease", driver->Release(device, it->handle));
    it->imported = false;
  }
  if (counted != nullptr) counted->fetch_sub(counted_bytes);
  counted = nullptr;
}

}  // namespace tokensel::memory
