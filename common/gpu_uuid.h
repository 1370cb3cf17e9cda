// FormatGpuUuid: a GPU's 16-byte UUID as nvidia-smi prints it,
// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (lower-case hex). The one
// spelling shared by the CUDA device list (kernels/cuda/device.cu), the
// client's CudaIpcRegion and the tests, so UUIDs compare as strings.
//
// Takes the raw bytes (cudaUUID_t::bytes), so no CUDA header is needed here.
// Header-only: the installed client library uses it without linking common.
#ifndef TOKENSEL_COMMON_GPU_UUID_H_
#define TOKENSEL_COMMON_GPU_UUID_H_

#include <string>

namespace tokensel {

inline std::string FormatGpuUuid(const char (&bytes)[16]) {
  constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    const auto b = static_cast<unsigned char>(bytes[i]);
    out += kHex[b >> 4];
    out += kHex[b & 0xf];
  }
  return out;
}

}  // namespace tokensel

#endif  // TOKENSEL_COMMON_GPU_UUID_H_
