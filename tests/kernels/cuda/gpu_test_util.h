// Helpers for the GPU conformance suite (label `gpu`): device detection
// (TOKENSEL_REQUIRE_GPU(), tests/testing/gpu_device.h: skip without a GPU,
// fail on a broken one or with TOKENSEL_REQUIRE_GPU=1), RAII device buffers,
// and device mirrors of host test tensors.
//
//   class MyGpuTest : public ::testing::Test {
//     void SetUp() override { TOKENSEL_REQUIRE_GPU(); }
//   };
//   DeviceMirror d(host_view);          // same strides, same misalignment mod 256
//   ... run the CUDA op on d.view() ...
//   d.CopyBack();                       // device bytes -> the host view's extent
//
// Compiled by the host compiler against cuda_runtime_api.h (CUDA::cudart).
#ifndef TOKENSEL_TESTS_KERNELS_CUDA_GPU_TEST_UTIL_H_
#define TOKENSEL_TESTS_KERNELS_CUDA_GPU_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/tensor_view.h"
#include "kernels/validate.h"
#include "tests/testing/gpu_device.h"

namespace tokensel::gputest {

// Records a test failure (with the CUDA error text) when `expr` fails.
#define TOKENSEL_EXPECT_CUDA(expr)                                  \
  do {                                                              \
    const cudaError_t tokensel_test_err_ = (expr);                  \
    EXPECT_EQ(tokensel_test_err_, cudaSuccess)                      \
        << #expr << ": " << cudaGetErrorString(tokensel_test_err_); \
  } while (false)

// Owning cudaMalloc buffer (move-only).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) TOKENSEL_EXPECT_CUDA(cudaMalloc(&data_, bytes));
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_) {
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  kernels::cuda::Workspace workspace() const { return {data_, bytes_}; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Host -> device copy of `bytes` bytes.
inline DeviceBuffer ToDevice(const void* host, size_t bytes) {
  DeviceBuffer d(bytes);
  if (bytes > 0) TOKENSEL_EXPECT_CUDA(cudaMemcpy(d.data(), host, bytes, cudaMemcpyHostToDevice));
  return d;
}
template <typename T>
std::vector<T> ToHost(const DeviceBuffer& d, size_t count) {
  std::vector<T> out(count);
  if (count > 0) {
    TOKENSEL_EXPECT_CUDA(
        cudaMemcpy(out.data(), d.data(), count * sizeof(T), cudaMemcpyDeviceToHost));
  }
  return out;
}

// A device copy of a host view's byte extent: same shape, dtype and strides,
// and the same address modulo 256 (so misaligned host views stay misaligned
// on the device). CopyBack() writes the device bytes back over the host
// extent, so host-side checks (values, untouched gaps) apply unchanged.
class DeviceMirror {
 public:
  explicit DeviceMirror(const kernels::TensorView& host) : host_(host), view_(host) {
    auto extent = kernels::ComputeExtent(host, "mirror");
    EXPECT_TRUE(extent.ok()) << extent.status();
    bytes_ = extent.ok() ? static_cast<size_t>(extent->end) : 0;
    shift_ = reinterpret_cast<uintptr_t>(host.data) % 256;
    buffer_ = DeviceBuffer(bytes_ + shift_ + 16);
    view_.data = static_cast<char*>(buffer_.data()) + shift_;
    if (bytes_ > 0) {
      TOKENSEL_EXPECT_CUDA(cudaMemcpy(view_.data, host.data, bytes_, cudaMemcpyHostToDevice));
    }
  }

  const kernels::TensorView& view() const { return view_; }
  void CopyBack() const {
    if (bytes_ > 0) {
      TOKENSEL_EXPECT_CUDA(cudaMemcpy(host_.data, view_.data, bytes_, cudaMemcpyDeviceToHost));
    }
  }

 private:
  kernels::TensorView host_;
  kernels::TensorView view_;
  size_t bytes_ = 0;
  uintptr_t shift_ = 0;
  DeviceBuffer buffer_;
};

// A stream for one test (destroyed at scope exit).
class TestStream {
 public:
  TestStream() { TOKENSEL_EXPECT_CUDA(cudaStreamCreate(&stream_)); }
  ~TestStream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  kernels::cuda::Stream get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace tokensel::gputest

#endif  // TOKENSEL_TESTS_KERNELS_CUDA_GPU_TEST_UTIL_H_
