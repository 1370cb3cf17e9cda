// The exporting process of CudaVmmDeviceTest (cuda_vmm_device_test.cc), a
// plain program the test starts: allocates two granules of VMM memory on
// device 0 with cuMemCreate (POSIX-fd shareable, as PyTorch's
// expandable_segments does), maps it here, fills it with 0x5A and a 256-byte
// marker 0..255 at offset granularity + 4096, exports it with
// cuMemExportToShareableHandle and sends "<device uuid> <allocation bytes>
// <granularity>\n" with the descriptor (SCM_RIGHTS) on fd 3, a unix socket.
// It then holds the allocation until fd 3 reaches EOF, unmaps, releases and
// exits 0. Any failure: a message on stderr and exit 1. The driver is reached
// through the runtime's entry points (no libcuda link, as the server).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gpu_uuid.h"
#include "tests/testing/cuda_driver_entry.h"
#include "tests/testing/scm_rights.h"

namespace {

constexpr int kSocketFd = 3;

template <typename Fn>
Fn Entry(const char* name) {
  const Fn fn = tokensel::testing::DriverEntry<Fn>(name);
  if (fn == nullptr) std::fprintf(stderr, "cuda_vmm_exporter: no driver entry point %s\n", name);
  return fn;
}

bool Ok(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return true;
  std::fprintf(stderr, "cuda_vmm_exporter: %s: CUresult %d\n", what, static_cast<int>(r));
  return false;
}

bool Ok(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::fprintf(stderr, "cuda_vmm_exporter: %s: %s\n", what, cudaGetErrorString(err));
  return false;
}

}  // namespace

int main() {
  if (!Ok(cudaSetDevice(0), "cudaSetDevice") || !Ok(cudaFree(nullptr), "cudaFree(0)")) return 1;
  const auto create = Entry<PFN_cuMemCreate_v10020>("cuMemCreate");
  const auto granularity_of =
      Entry<PFN_cuMemGetAllocationGranularity_v10020>("cuMemGetAllocationGranularity");
  const auto reserve = Entry<PFN_cuMemAddressReserve_v10020>("cuMemAddressReserve");
  const auto map = Entry<PFN_cuMemMap_v10020>("cuMemMap");
  const auto set_access = Entry<PFN_cuMemSetAccess_v10020>("cuMemSetAccess");
  const auto export_fd =
      Entry<PFN_cuMemExportToShareableHandle_v10020>("cuMemExportToShareableHandle");
  const auto unmap = Entry<PFN_cuMemUnmap_v10020>("cuMemUnmap");
  const auto address_free = Entry<PFN_cuMemAddressFree_v10020>("cuMemAddressFree");
  const auto release = Entry<PFN_cuMemRelease_v10020>("cuMemRelease");
  if (!create || !granularity_of || !reserve || !map || !set_access || !export_fd || !unmap ||
      !address_free || !release) {
    return 1;
  }

  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t granularity = 0;
  if (!Ok(granularity_of(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "granularity")) {
    return 1;
  }
  const size_t bytes = 2 * granularity;
  CUmemGenericAllocationHandle handle = 0;
  if (!Ok(create(&handle, bytes, &prop, 0), "cuMemCreate")) return 1;
  CUdeviceptr va = 0;
  if (!Ok(reserve(&va, bytes, granularity, 0, 0), "cuMemAddressReserve")) return 1;
  if (!Ok(map(va, bytes, 0, handle, 0), "cuMemMap")) return 1;
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (!Ok(set_access(va, bytes, &access, 1), "cuMemSetAccess")) return 1;
  void* p = reinterpret_cast<void*>(va);
  if (!Ok(cudaMemset(p, 0x5A, bytes), "cudaMemset")) return 1;
  std::vector<unsigned char> marker(256);
  for (size_t i = 0; i < marker.size(); ++i) marker[i] = static_cast<unsigned char>(i);
  if (!Ok(cudaMemcpy(static_cast<char*>(p) + granularity + 4096, marker.data(), marker.size(),
                     cudaMemcpyHostToDevice),
          "cudaMemcpy")) {
    return 1;
  }
  // The fill and the marker land before the server reads them through its
  // own context: cudaMemset is asynchronous, and a pageable cudaMemcpy may
  // return once the bytes are staged, before the DMA.
  if (!Ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize")) return 1;
  int fd = -1;
  if (!Ok(export_fd(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          "cuMemExportToShareableHandle")) {
    return 1;
  }
  cudaDeviceProp dev{};
  if (!Ok(cudaGetDeviceProperties(&dev, 0), "cudaGetDeviceProperties")) return 1;
  const std::string line =
      absl::StrCat(tokensel::FormatGpuUuid(dev.uuid.bytes), " ", bytes, " ", granularity, "\n");
  if (!tokensel::testing::SendWithFd(kSocketFd, line, fd)) {
    std::perror("cuda_vmm_exporter: sendmsg");
    return 1;
  }
  close(fd);
  char c;
  while (read(kSocketFd, &c, 1) > 0) {
  }
  const bool ok = Ok(unmap(va, bytes), "cuMemUnmap") & Ok(address_free(va, bytes), "free") &
                  Ok(release(handle), "cuMemRelease");
  return ok ? 0 : 1;
}
