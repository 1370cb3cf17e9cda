// The exporting process of CudaIpcDeviceTest (cuda_ipc_device_test.cc), a
// plain program the test starts: allocates 1 MiB on device 0, fills it with
// 0x5A and a 256-byte marker 0..255 at offset 4096, writes
// "<hex handle> <device uuid>\n" to fd 3, then holds the allocation until fd 4
// reaches EOF, frees it and exits 0. Any CUDA failure: a message on stderr
// and exit 1 (the test then fails to read a handle).
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/gpu_uuid.h"

namespace {

constexpr int kReplyFd = 3;  // exporter -> test: "<hex handle> <uuid>\n"
constexpr int kHoldFd = 4;   // test -> exporter: EOF means "free and exit"
constexpr size_t kAllocBytes = size_t{1} << 20;
constexpr size_t kMarkerOffset = 4096;

bool Ok(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::fprintf(stderr, "cuda_ipc_exporter: %s: %s\n", what, cudaGetErrorString(err));
  return false;
}

}  // namespace

int main() {
  void* p = nullptr;
  if (!Ok(cudaMalloc(&p, kAllocBytes), "cudaMalloc")) return 1;
  if (!Ok(cudaMemset(p, 0x5A, kAllocBytes), "cudaMemset")) return 1;
  std::vector<unsigned char> marker(256);
  for (size_t i = 0; i < marker.size(); ++i) marker[i] = static_cast<unsigned char>(i);
  if (!Ok(cudaMemcpy(static_cast<char*>(p) + kMarkerOffset, marker.data(), marker.size(),
                     cudaMemcpyHostToDevice),
          "cudaMemcpy")) {
    return 1;
  }
  cudaIpcMemHandle_t handle;
  if (!Ok(cudaIpcGetMemHandle(&handle, p), "cudaIpcGetMemHandle")) return 1;
  int device = 0;
  if (!Ok(cudaGetDevice(&device), "cudaGetDevice")) return 1;
  cudaDeviceProp prop{};
  if (!Ok(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties")) return 1;
  const std::string line =
      absl::StrCat(absl::BytesToHexString(absl::string_view(handle.reserved, sizeof(handle))), " ",
                   tokensel::FormatGpuUuid(prop.uuid.bytes), "\n");
  if (write(kReplyFd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    std::perror("cuda_ipc_exporter: write");
    return 1;
  }
  close(kReplyFd);
  char c;
  while (read(kHoldFd, &c, 1) > 0) {
  }
  return Ok(cudaFree(p), "cudaFree") ? 0 : 1;
}
