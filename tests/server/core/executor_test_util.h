// Fixture for the Executor suites: a FakeRegionMapper-backed registry with
// random-filled buffers, the CPU backend, and helpers to place tensors in
// buffers or inline and to build the same views over snapshot copies, where
// the oracle (kernels::cpu called directly) runs.
#ifndef TOKENSEL_TESTS_SERVER_CORE_EXECUTOR_TEST_UTIL_H_
#define TOKENSEL_TESTS_SERVER_CORE_EXECUTOR_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/tensor_view.h"
#include "server/backends/cpu_backend.h"
#include "server/core/buffer_registry.h"
#include "server/core/executor.h"
#include "tests/server/core/fake_region_mapper.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {

using Memory = std::map<std::string, std::vector<uint8_t>>;

// A contiguous host tensor (inline inputs, oracle results).
struct HostTensor {
  kernels::DType dtype = kernels::DType::kFloat32;
  std::vector<int64_t> shape;
  std::string bytes;
  kernels::TensorView view() { return kernels::TensorView::Contiguous(bytes.data(), dtype, shape); }
};

// Random ids in [0, limit) in every element; or, with `unique_rows`, each
// row (last dim) a random subset of [0, limit) in random order.
inline void FillIds(const kernels::TensorView& v, int64_t limit, bool unique_rows,
                    std::mt19937_64& rng) {
  const int64_t r = v.shape[v.rank - 1];
  const int64_t rows = v.NumElements() / std::max<int64_t>(r, 1);
  std::vector<int64_t> pool(static_cast<size_t>(limit));
  for (int64_t row = 0; row < rows; ++row) {
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int64_t j = 0; j < r; ++j) {
      const int64_t value = unique_rows ? pool[j] : static_cast<int64_t>(rng() % limit);
      kernels::StoreIndex(v, kernels::RowOffset(v, row) + j * v.strides[v.rank - 1], value);
    }
  }
}

inline HostTensor RandomHost(kernels::DType dtype, std::vector<int64_t> shape,
                             std::mt19937_64& rng) {
  HostTensor t{dtype, std::move(shape), {}};
  int64_t n = kernels::ElementSize(dtype);
  for (int64_t d : t.shape) n *= d;
  t.bytes.resize(static_cast<size_t>(n));
  for (char& c : t.bytes) c = static_cast<char>(rng());
  return t;
}

// A contiguous int32 tensor holding `values`.
inline HostTensor Int32Host(std::vector<int64_t> shape, const std::vector<int32_t>& values) {
  HostTensor t{kernels::DType::kInt32, std::move(shape), {}};
  t.bytes.assign(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  return t;
}

inline std::vector<int32_t> AsInt32(const std::string& bytes) {
  std::vector<int32_t> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

inline const core::InlineOutput* FindOutput(const core::OpResult& result, const std::string& name) {
  for (const core::InlineOutput& out : result.outputs) {
    if (out.name == name) return &out;
  }
  return nullptr;
}

// Expects `result` to carry inline output `name` equal to `expected`.
inline void ExpectInline(const core::OpResult& result, const std::string& name,
                         const HostTensor& expected) {
  const core::InlineOutput* out = FindOutput(result, name);
  ASSERT_NE(out, nullptr) << "no inline output '" << name << "'";
  EXPECT_EQ(out->dtype, expected.dtype) << name;
  EXPECT_EQ(out->shape, expected.shape) << name;
  EXPECT_TRUE(out->data == expected.bytes) << name << ": data differs from the oracle";
}

class ExecutorTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kMaxInline = 1 << 20;

  ExecutorTest()
      : device_mapper_(core::MemoryKind::kCudaDevice),
        registry_(&mapper_, &device_mapper_, RegistryLimits(), nullptr),
        backend_(2),
        executor_(&backend_, &registry_, nullptr, Limits()) {}

  static core::ExecutorLimits Limits(uint64_t max_inline = kMaxInline, uint64_t max_work = 0) {
    core::ExecutorLimits limits;
    limits.max_inline_bytes = max_inline;
    limits.max_response_bytes = max_inline;
    limits.max_op_work = max_work;
    return limits;
  }
  static core::RegistryLimits RegistryLimits() {
    core::RegistryLimits limits;
    limits.max_buffers_per_session = 64;
    return limits;
  }

  // Registers buffer `name` of `size` random bytes in session_.
  void AddBuffer(const std::string& name, uint64_t size) {
    uint8_t* data = mapper_.AddObject(name, size);
    for (uint64_t i = 0; i < size; ++i) data[i] = static_cast<uint8_t>(rng_());
    buffers_[name] = {data, size};
    ASSERT_OK(registry_.Register(session_, name, mapper_.Spec(name, 0, size)));
  }

  // Copies of every buffer's bytes.
  Memory Snapshot() const {
    Memory copy;
    for (const auto& [name, buf] : buffers_) {
      copy[name] = std::vector<uint8_t>(buf.first, buf.first + buf.second);
    }
    return copy;
  }

  static core::TensorSpec Buf(const std::string& name, uint64_t offset, kernels::DType dtype,
                              std::vector<int64_t> shape, std::vector<int64_t> strides = {}) {
    core::TensorSpec spec;
    spec.source = core::TensorSpec::Source::kBuffer;
    spec.buffer = name;
    spec.byte_offset = offset;
    spec.dtype = dtype;
    spec.shape = std::move(shape);
    spec.strides = std::move(strides);
    return spec;
  }

  static core::TensorSpec Inline(const HostTensor& t) {
    core::TensorSpec spec;
    spec.source = core::TensorSpec::Source::kInline;
    spec.dtype = t.dtype;
    spec.shape = t.shape;
    spec.inline_data = t.bytes;
    return spec;
  }

  // The view `spec` names, over `memory` (a Snapshot) or, when null, over
  // the live buffers.
  kernels::TensorView View(const core::TensorSpec& spec, Memory* memory = nullptr) {
    uint8_t* base =
        memory != nullptr ? (*memory)[spec.buffer].data() : buffers_.at(spec.buffer).first;
    void* data = base + spec.byte_offset;
    if (spec.strides.empty()) return kernels::TensorView::Contiguous(data, *spec.dtype, spec.shape);
    return kernels::TensorView::Strided(data, *spec.dtype, spec.shape, spec.strides);
  }

  absl::StatusOr<core::OpResult> Run(const core::OpRequest& op) {
    return executor_.Run(session_, op);
  }

  std::mt19937_64 rng_{20240611};
  std::string session_ = "session-a";
  FakeRegionMapper mapper_;
  FakeRegionMapper device_mapper_;
  core::BufferRegistry registry_;
  backends::CpuBackend backend_;
  core::Executor executor_;
  std::map<std::string, std::pair<uint8_t*, uint64_t>> buffers_;
};

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_SERVER_CORE_EXECUTOR_TEST_UTIL_H_
