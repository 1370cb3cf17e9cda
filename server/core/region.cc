#include "server/core/region.h"

#include <variant>

namespace tokensel::core {

absl::string_view RegionKindName(const RegionSpec& spec) {
  if (std::holds_alternative<CudaIpcSpec>(spec)) return "cuda_ipc";
  return std::get<FdRegionSpec>(spec).kind == FdKind::kHostMemory ? "host_shm" : "cuda_vmm";
}

absl::StatusOr<FdInfo> RegionMapper::Inspect(int) const {
  return absl::UnimplementedError("this kind of memory is not registered by file descriptor");
}

}  // namespace tokensel::core
