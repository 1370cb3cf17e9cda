// DriverEntry<Fn>(name): a CUDA driver function looked up through the
// runtime (cudaGetDriverEntryPointByVersion, the ABI of CUDA 10.2, what the
// VMM functions the tests use were introduced with), so that tests and
// their helper processes need not link libcuda. Null when the driver lacks
// it. CUDA builds only (includes cuda_runtime_api.h).
#ifndef TOKENSEL_TESTS_TESTING_CUDA_DRIVER_ENTRY_H_
#define TOKENSEL_TESTS_TESTING_CUDA_DRIVER_ENTRY_H_

#include <cuda_runtime_api.h>

namespace tokensel::testing {

template <typename Fn>
Fn DriverEntry(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &p, 10020, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return reinterpret_cast<Fn>(p);
}

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_TESTING_CUDA_DRIVER_ENTRY_H_
