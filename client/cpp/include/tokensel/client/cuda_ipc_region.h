// CudaIpcRegion: describes device memory for a cuda_ipc RegisterBuffer.
//
//   ASSIGN_OR_RETURN(CudaIpcRegion region, CudaIpcRegion::FromDevicePointer(ptr, bytes));
//   session->RegisterBuffer(region.RegisterRequest("acts"));
//
// FromDevicePointer finds the base of the allocation holding `ptr` with
// cuMemGetAddressRange (caching allocators such as PyTorch's sub-allocate),
// exports the base with cudaIpcGetMemHandle and records offset = ptr - base
// and the UUID of the device owning it. The handle stays valid while the
// allocation lives; freeing it invalidates the server's mapping, so
// unregister first. A plain value: nothing to release.
//
// Builds without CUDA: FromDevicePointer returns FAILED_PRECONDITION
// "built without CUDA" and BuiltWithCuda() is false.
#ifndef TOKENSEL_CLIENT_CUDA_IPC_REGION_H_
#define TOKENSEL_CLIENT_CUDA_IPC_REGION_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "tokensel/v1/tokensel.pb.h"

namespace tokensel::client {

namespace v1 = ::tokensel::v1;

class CudaIpcRegion {
 public:
  static constexpr int kHandleBytes = 64;

  static bool BuiltWithCuda();
  // `ptr`: device memory from cudaMalloc (or inside such an allocation);
  // `size` bytes from ptr must lie inside the allocation. Errors:
  // INVALID_ARGUMENT (null, not device memory, range past the allocation),
  // FAILED_PRECONDITION (no CUDA build or driver), INTERNAL (a CUDA call,
  // named with its error string).
  static absl::StatusOr<CudaIpcRegion> FromDevicePointer(const void* ptr, uint64_t size);

  const std::string& handle() const { return handle_; }            // kHandleBytes bytes
  const std::string& device_uuid() const { return device_uuid_; }  // "GPU-..."
  uint64_t offset() const { return offset_; }                      // ptr - allocation base
  uint64_t size() const { return size_; }

  v1::CudaIpc ToProto() const;
  v1::RegisterBufferRequest RegisterRequest(std::string buffer_name) const;

 private:
  CudaIpcRegion() = default;

  std::string handle_;
  std::string device_uuid_;
  uint64_t offset_ = 0;
  uint64_t size_ = 0;
};

}  // namespace tokensel::client

#endif  // TOKENSEL_CLIENT_CUDA_IPC_REGION_H_
