// TestTensor: an owning host buffer with a strided, optionally padded and
// misaligned TensorView over it, for operator tests.
//
//   TestTensor t(DType::kBFloat16, {B, S, C}, {.pad = {0, 1, 3}, .misalign = 2});
//   t.FillRandom(rng);              // every byte of the buffer, gaps included
//   TensorView v = t.view();        // strides (S+1)*(C+3), C+3, 1; base 2 bytes off
//   std::vector<uint8_t> before = t.Bytes();
//   ... op fails ...  EXPECT_EQ(t.Bytes(), before);   // nothing written
#ifndef TOKENSEL_TESTS_TESTING_TEST_TENSOR_H_
#define TOKENSEL_TESTS_TESTING_TEST_TENSOR_H_

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/tensor_view.h"

namespace tokensel::testing {

struct Layout {
  std::vector<int64_t> pad;  // extra elements per dim (stride padding); empty = none
  int64_t misalign = 0;      // bytes between an aligned address and data
};

class TestTensor {
 public:
  TestTensor() = default;
  TestTensor(kernels::DType dtype, std::vector<int64_t> shape, Layout layout = {})
      : dtype_(dtype), shape_(std::move(shape)), misalign_(layout.misalign) {
    const int rank = static_cast<int>(shape_.size());
    strides_.assign(rank, 1);
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      strides_[d] = stride;
      const int64_t pad = d < static_cast<int>(layout.pad.size()) ? layout.pad[d] : 0;
      stride *= shape_[d] + pad;
    }
    bool empty = false;
    for (int64_t n : shape_) empty |= n == 0;
    const int64_t elems = empty ? 0 : stride;
    storage_.assign(static_cast<size_t>(elems * kernels::ElementSize(dtype_) + misalign_ + 16), 0);
  }

  kernels::TensorView view() {
    return kernels::TensorView::Strided(data(), dtype_, shape_, strides_);
  }
  void* data() {
    // 16-byte aligned base + misalign, computed from the storage address.
    auto base = reinterpret_cast<uintptr_t>(storage_.data());
    base = (base + 15) & ~uintptr_t{15};
    return reinterpret_cast<void*>(base + misalign_);
  }
  kernels::DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t NumElements() const {
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    return n;
  }

  // Element offset (in elements) of a row-major linear index.
  int64_t OffsetOf(int64_t linear) const {
    int64_t off = 0;
    for (int d = static_cast<int>(shape_.size()) - 1; d >= 0; --d) {
      off += (linear % shape_[d]) * strides_[d];
      linear /= shape_[d];
    }
    return off;
  }
  uint8_t* ElementPtr(int64_t linear) {
    return static_cast<uint8_t*>(data()) + OffsetOf(linear) * kernels::ElementSize(dtype_);
  }
  template <typename T>
  T Get(int64_t linear) {
    T v;
    std::memcpy(&v, ElementPtr(linear), sizeof(T));
    return v;
  }
  template <typename T>
  void Set(int64_t linear, T v) {
    std::memcpy(ElementPtr(linear), &v, sizeof(T));
  }
  // Index tensors (int32/int64) as int64.
  int64_t GetIndex(int64_t linear) {
    return dtype_ == kernels::DType::kInt64 ? Get<int64_t>(linear) : Get<int32_t>(linear);
  }
  void SetIndex(int64_t linear, int64_t v) {
    if (dtype_ == kernels::DType::kInt64) {
      Set<int64_t>(linear, v);
    } else {
      Set<int32_t>(linear, static_cast<int32_t>(v));
    }
  }
  // Raw bytes of element `linear` (element size bytes).
  std::vector<uint8_t> ElementBytes(int64_t linear) {
    const uint8_t* p = ElementPtr(linear);
    return std::vector<uint8_t>(p, p + kernels::ElementSize(dtype_));
  }

  void FillRandom(std::mt19937_64& rng) {
    for (auto& b : storage_) b = static_cast<uint8_t>(rng());
  }
  void Fill(uint8_t byte) { std::memset(storage_.data(), byte, storage_.size()); }
  // The whole backing store (elements, gaps and slack): compare before/after
  // to prove an op wrote nothing (or nothing outside its elements).
  std::vector<uint8_t> Bytes() const { return storage_; }

 private:
  kernels::DType dtype_ = kernels::DType::kFloat32;
  std::vector<int64_t> shape_;
  std::vector<int64_t> strides_;
  int64_t misalign_ = 0;
  std::vector<uint8_t> storage_;
};

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_TESTING_TEST_TENSOR_H_
