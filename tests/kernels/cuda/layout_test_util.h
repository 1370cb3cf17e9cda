// Helpers of the host tests of the CUDA workspace layouts
// (workspace_layout_test.cc, sparse_rows_test.cc): views with fake addresses
// (metadata only, never dereferenced) and the invariants every layout keeps.
#ifndef TOKENSEL_TESTS_KERNELS_CUDA_LAYOUT_TEST_UTIL_H_
#define TOKENSEL_TESTS_KERNELS_CUDA_LAYOUT_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/workspace_layout.h"
#include "kernels/tensor_view.h"

namespace tokensel::kernels::cuda::layout_test {

// Distinct, far apart fake base addresses (validation compares extents).
inline void* Fake(int slot) {
  return reinterpret_cast<void*>((static_cast<uintptr_t>(slot) + 1) << 40);
}

inline TensorView View(int slot, DType dtype, std::vector<int64_t> shape) {
  return TensorView::Contiguous(Fake(slot), dtype, shape);
}
inline TensorView Strided(int slot, DType dtype, std::vector<int64_t> shape,
                          std::vector<int64_t> strides) {
  return TensorView::Strided(Fake(slot), dtype, shape, strides);
}

struct Section {
  std::string name;
  size_t offset;
  uint64_t bytes;  // what the kernels touch
};

// The invariants of workspace_layout.h for one layout.
inline void ExpectSections(const std::vector<Section>& sections, size_t total) {
  EXPECT_EQ(total % 256, 0u);
  EXPECT_GE(total, kDeviceStatusBytes);
  EXPECT_LT(total, kWorkspaceTooLarge);
  for (size_t i = 0; i < sections.size(); ++i) {
    const Section& a = sections[i];
    SCOPED_TRACE(a.name);
    EXPECT_EQ(a.offset % 256, 0u);
    EXPECT_GE(a.offset, kDeviceStatusBytes);  // never over the status block
    EXPECT_LE(a.bytes, total - a.offset);     // inside the workspace
    for (size_t j = 0; j < i; ++j) {
      const Section& b = sections[j];
      if (a.bytes == 0 || b.bytes == 0) continue;
      EXPECT_TRUE(a.offset + a.bytes <= b.offset || b.offset + b.bytes <= a.offset)
          << a.name << " [" << a.offset << ", +" << a.bytes << ") overlaps " << b.name << " ["
          << b.offset << ", +" << b.bytes << ")";
    }
  }
}

inline uint64_t Bytes(const TensorView& v) {
  return static_cast<uint64_t>(v.NumElements()) * static_cast<uint64_t>(v.elem_size());
}

}  // namespace tokensel::kernels::cuda::layout_test

#endif  // TOKENSEL_TESTS_KERNELS_CUDA_LAYOUT_TEST_UTIL_H_
