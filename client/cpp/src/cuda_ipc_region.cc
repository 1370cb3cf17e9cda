// The CUDA-independent half of CudaIpcRegion; FromDevicePointer and
// BuiltWithCuda live in cuda_ipc_region_{cuda,nocuda}.cc.
#include "tokensel/client/cuda_ipc_region.h"

#include <string>
#include <utility>

namespace tokensel::client {

v1::CudaIpc CudaIpcRegion::ToProto() const {
  v1::CudaIpc ipc;
  ipc.set_handle(handle_);
  ipc.set_device_uuid(device_uuid_);
  ipc.set_offset(offset_);
  ipc.set_size(size_);
  return ipc;
}

v1::RegisterBufferRequest CudaIpcRegion::RegisterRequest(std::string buffer_name) const {
  v1::RegisterBufferRequest request;
  request.set_name(std::move(buffer_name));
  *request.mutable_cuda_ipc() = ToProto();
  return request;
}

}  // namespace tokensel::client
