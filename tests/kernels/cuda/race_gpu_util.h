// Helpers of the racing-client GPU tests (race_*_gpu_test.cc): a client that
// rewrites its buffers while an op runs on them.
//
// In one process the closest model of a CUDA IPC buffer that another
// process keeps writing is host-mapped pinned memory (cudaHostAllocMapped):
// kernels read it over the bus while a host thread (Flipper, Scribbler)
// stores into it without pause, so every launch of the op may see other
// values. Outputs live in device memory between guard bytes (GuardedCopy):
// after each run the guards must be intact, and the outputs must hold either
// the result for the original inputs (status OK) or their old bytes
// (INVALID_ARGUMENT); any other status (INTERNAL after an illegal address:
// the context is then dead) fails the test. Expected results come from the
// CPU op (the oracle) on host copies of the original inputs.
//
// Flipped values differ from the originals only in their top byte, so a load
// that races a store can only see one of the two values.
#ifndef TOKENSEL_TESTS_KERNELS_CUDA_RACE_GPU_UTIL_H_
#define TOKENSEL_TESTS_KERNELS_CUDA_RACE_GPU_UTIL_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/tensor_view.h"
#include "tests/kernels/cuda/gpu_test_util.h"

namespace tokensel::racetest {

using kernels::DType;
using kernels::TensorView;

// A tensor's bytes with explicit strides (rows of the last dim padded by
// `row_pad` elements), the same layout on the host and in every device copy.
struct Tensor {
  DType dtype = DType::kInt32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  std::vector<uint8_t> bytes;  // the extent (+ slack)

  Tensor() = default;
  Tensor(DType d, std::vector<int64_t> s, int64_t row_pad = 0) : dtype(d), shape(std::move(s)) {
    strides.assign(shape.size(), 1);
    int64_t stride = 1;
    for (size_t i = shape.size(); i-- > 0;) {
      strides[i] = stride;
      stride *= shape[i] + (i + 1 == shape.size() ? row_pad : 0);
    }
    bytes.assign(static_cast<size_t>(stride * kernels::ElementSize(dtype)) + 16, 0);
  }
  TensorView At(void* base) const { return TensorView::Strided(base, dtype, shape, strides); }
  TensorView Host() { return At(bytes.data()); }
  int64_t Elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  // Byte offset of row-major element `linear`.
  size_t ByteOffset(int64_t linear) const {
    int64_t off = 0;
    for (size_t i = shape.size(); i-- > 0;) {
      off += (linear % shape[i]) * strides[i];
      linear /= shape[i];
    }
    return static_cast<size_t>(off * kernels::ElementSize(dtype));
  }
  int64_t GetIndex(int64_t linear) const {
    const uint8_t* p = bytes.data() + ByteOffset(linear);
    if (dtype == DType::kInt64) {
      int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  void SetIndex(int64_t linear, int64_t value) {
    uint8_t* p = bytes.data() + ByteOffset(linear);
    if (dtype == DType::kInt64) {
      std::memcpy(p, &value, 8);
    } else {
      const auto v = static_cast<int32_t>(value);
      std::memcpy(p, &v, 4);
    }
  }
};

// `value` with its top byte changed: out of range (positive, >= 2^30) or
// negative, for the index dtype.
inline int64_t Corrupt(int64_t value, DType dtype, bool negative) {
  if (dtype == DType::kInt64) {
    return negative ? static_cast<int64_t>(static_cast<uint64_t>(value) | (uint64_t{1} << 63))
                    : value | (int64_t{1} << 62);
  }
  const uint32_t bits = static_cast<uint32_t>(value) | (negative ? 0x80000000u : 0x40000000u);
  return static_cast<int32_t>(bits);
}

// Pinned host memory mapped into the device address space, holding a copy
// of a tensor: host() is written by the racing thread, view() by the op.
class MappedCopy {
 public:
  explicit MappedCopy(const Tensor& t) : tensor_(t) {
    TOKENSEL_EXPECT_CUDA(cudaHostAlloc(&host_, t.bytes.size(), cudaHostAllocMapped));
    if (host_ == nullptr) return;
    std::memcpy(host_, t.bytes.data(), t.bytes.size());
    TOKENSEL_EXPECT_CUDA(cudaHostGetDevicePointer(&device_, host_, 0));
  }
  ~MappedCopy() {
    if (host_ != nullptr) cudaFreeHost(host_);
  }
  MappedCopy(const MappedCopy&) = delete;
  MappedCopy& operator=(const MappedCopy&) = delete;

  TensorView view() const { return tensor_.At(device_); }
  // Host address of row-major element `linear`.
  void* HostElement(int64_t linear) const {
    return static_cast<char*>(host_) + tensor_.ByteOffset(linear);
  }
  void* host() const { return host_; }
  size_t bytes() const { return tensor_.bytes.size(); }
  void Restore() { std::memcpy(host_, tensor_.bytes.data(), tensor_.bytes.size()); }

 private:
  Tensor tensor_;
  void* host_ = nullptr;
  void* device_ = nullptr;
};

// A device copy of a tensor between two guard regions of a known pattern.
class GuardedCopy {
 public:
  static constexpr size_t kGuard = 1 << 16;
  static constexpr int kPattern = 0xA5;

  explicit GuardedCopy(const Tensor& t) : tensor_(t), buffer_(t.bytes.size() + 2 * kGuard) {
    TOKENSEL_EXPECT_CUDA(cudaMemset(buffer_.data(), kPattern, buffer_.bytes()));
    TOKENSEL_EXPECT_CUDA(
        cudaMemcpy(payload(), t.bytes.data(), t.bytes.size(), cudaMemcpyHostToDevice));
  }
  TensorView view() const { return tensor_.At(payload()); }
  std::vector<uint8_t> Download() const {
    std::vector<uint8_t> out(tensor_.bytes.size());
    TOKENSEL_EXPECT_CUDA(cudaMemcpy(out.data(), payload(), out.size(), cudaMemcpyDeviceToHost));
    return out;
  }
  bool GuardsIntact() const {
    std::vector<uint8_t> all(buffer_.bytes());
    TOKENSEL_EXPECT_CUDA(
        cudaMemcpy(all.data(), buffer_.data(), all.size(), cudaMemcpyDeviceToHost));
    const auto ok = [](uint8_t b) { return b == kPattern; };
    return std::all_of(all.begin(), all.begin() + kGuard, ok) &&
           std::all_of(all.end() - kGuard, all.end(), ok);
  }

 private:
  char* payload() const { return static_cast<char*>(buffer_.data()) + kGuard; }
  Tensor tensor_;
  gputest::DeviceBuffer buffer_;
};

// Toggles one aligned index element (4 or 8 bytes) of mapped memory between
// `a` and `b` until destroyed, then leaves `a`. The constructor returns once
// the thread is flipping, so the op that follows races it from its start.
class Flipper {
 public:
  Flipper(void* addr, DType dtype, int64_t a, int64_t b)
      : addr_(addr), wide_(dtype == DType::kInt64) {
    thread_ = std::thread([this, a, b] {
      while (!stop_.load(std::memory_order_relaxed)) {
        Store(b);
        Pause();
        Store(a);
        Pause();
        cycles_.fetch_add(1, std::memory_order_release);
      }
      Store(a);
    });
    while (cycles_.load(std::memory_order_acquire) < 2) std::this_thread::yield();
  }
  ~Flipper() {
    stop_.store(true);
    thread_.join();
  }
  Flipper(const Flipper&) = delete;
  Flipper& operator=(const Flipper&) = delete;

 private:
  void Store(int64_t v) {
    if (wide_) {
      *static_cast<volatile int64_t*>(addr_) = v;
    } else {
      *static_cast<volatile int32_t*>(addr_) = static_cast<int32_t>(v);
    }
  }
  // Holds each value for a few dozen loads' worth of time.
  static void Pause() {
    std::atomic<int> spin{0};
    while (spin.fetch_add(1, std::memory_order_relaxed) < 32) {
    }
  }
  void* addr_;
  bool wide_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> cycles_{0};
  std::thread thread_;
};

// Copies `a` and `b` alternately over mapped memory until destroyed, then
// leaves `a` (whole-buffer rewrites: TopK scores).
class Scribbler {
 public:
  Scribbler(void* dst, std::vector<uint8_t> a, std::vector<uint8_t> b)
      : dst_(dst), a_(std::move(a)), b_(std::move(b)) {
    thread_ = std::thread([this] {
      while (!stop_.load(std::memory_order_relaxed)) {
        std::memcpy(dst_, b_.data(), b_.size());
        std::atomic_thread_fence(std::memory_order_seq_cst);
        std::memcpy(dst_, a_.data(), a_.size());
        std::atomic_thread_fence(std::memory_order_seq_cst);
        cycles_.fetch_add(1, std::memory_order_release);
      }
    });
    while (cycles_.load(std::memory_order_acquire) < 1) std::this_thread::yield();
  }
  ~Scribbler() {
    stop_.store(true);
    thread_.join();
  }
  Scribbler(const Scribbler&) = delete;
  Scribbler& operator=(const Scribbler&) = delete;

 private:
  void* dst_;
  std::vector<uint8_t> a_;
  std::vector<uint8_t> b_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> cycles_{0};
  std::thread thread_;
};

// Runs a CUDA op (WorkspaceBytes, Async, Finish) on `args` on its own
// stream and workspace.
template <typename Args>
absl::Status RunCuda(const Args& args, size_t (*ws_bytes)(const Args&),
                     absl::Status (*async)(const Args&, kernels::cuda::Workspace,
                                           kernels::cuda::Stream),
                     absl::Status (*finish)(const Args&, kernels::cuda::Workspace,
                                            kernels::cuda::Stream)) {
  gputest::TestStream stream;
  gputest::DeviceBuffer ws(std::max<size_t>(ws_bytes(args), 256));
  absl::Status status = async(args, ws.workspace(), stream.get());
  if (status.ok()) {
    status = finish(args, ws.workspace(), stream.get());
  } else {
    (void)cudaStreamSynchronize(stream.get());
  }
  return status;
}

// One output of a racing run: its device copy, its bytes before the run and
// the bytes the op must leave on success.
struct Output {
  const GuardedCopy* device;
  std::vector<uint8_t> before;
  std::vector<uint8_t> expected;
};

// The outcome rule of every racing run (see the file comment). Counts the
// outcomes in `ok` / `invalid`. Fatal on a dead context.
inline void ExpectOutcome(const absl::Status& status, const std::string& field,
                          const std::vector<Output>& outputs, int* ok, int* invalid) {
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "context lost; op status " << status;
  if (status.ok()) {
    ++*ok;
  } else {
    ++*invalid;
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(field), absl::string_view::npos) << status;
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    EXPECT_TRUE(outputs[i].device->GuardsIntact()) << "output " << i << ": write outside it";
    const std::vector<uint8_t> now = outputs[i].device->Download();
    EXPECT_TRUE(now == (status.ok() ? outputs[i].expected : outputs[i].before))
        << "output " << i
        << (status.ok() ? " differs from the result for the original inputs"
                        : " was written although the op failed");
  }
}

// After a test's runs: the racing writes reached the op, i.e. some run ended
// INVALID_ARGUMENT (its snapshot held a bad value) and, with `expect_ok`,
// some run ended OK (its snapshot held the original values). Without this a
// test whose writer never raced the op (a writer that stalls, a cached or
// stale copy of the input) would pass having checked nothing. The odds of
// a false failure are ~2^-kRuns: each run's snapshot sees either value.
inline void ExpectRaceObserved(int ok, int invalid, bool expect_ok) {
  EXPECT_GT(invalid, 0) << "no run saw a racing value: the writer never reached the op";
  if (expect_ok) {
    EXPECT_GT(ok, 0) << "every run saw a racing value: the race was never lost";
  }
}

}  // namespace tokensel::racetest

#endif  // TOKENSEL_TESTS_KERNELS_CUDA_RACE_GPU_UTIL_H_
