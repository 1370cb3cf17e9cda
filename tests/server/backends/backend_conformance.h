// The Backend conformance suite: what every core::Backend implementation must
// do, whatever memory it runs on. Each implementation instantiates it once:
//
//   INSTANTIATE_TEST_SUITE_P(Cpu, BackendConformanceTest, ::testing::Values("cpu"));
//
// (backend_conformance_cpu_test.cc, label `server`; backend_conformance_cuda_test.cc,
// label `gpu`, skips without a device). Tensors live in the backend's own staging
// memory, so the same test drives host and device backends; expected values come
// from naive loops in the test.
#ifndef TOKENSEL_TESTS_SERVER_BACKENDS_BACKEND_CONFORMANCE_H_
#define TOKENSEL_TESTS_SERVER_BACKENDS_BACKEND_CONFORMANCE_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/tensor_view.h"
#include "server/core/backend.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {

// "cpu" -> a CpuBackend with 2 threads; "cuda" -> a CudaBackend on the first
// device (FAILED_PRECONDITION without one: the suite skips).
absl::StatusOr<std::unique_ptr<core::Backend>> MakeConformanceBackend(const std::string& kind);

class BackendConformanceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override;
  core::Backend& backend() { return *backend_; }

 private:
  std::unique_ptr<core::Backend> backend_;
};

// A row-major tensor in the backend's staging memory; Upload/Download copy
// through the backend's staging calls, so the same test drives every backend.
class StagedTensor {
 public:
  template <typename T>
  static StagedTensor Upload(core::Backend& backend, const std::vector<T>& host,
                             kernels::DType dtype, std::initializer_list<int64_t> shape) {
    StagedTensor t;
    const uint64_t bytes = host.size() * sizeof(T);
    absl::StatusOr<std::unique_ptr<core::Backend::Staging>> staging =
        backend.AllocateStaging(bytes);
    if (!staging.ok()) {  // e.g. device memory exhausted: fail this test, not the binary
      ADD_FAILURE() << "AllocateStaging(" << bytes << "): " << staging.status();
      return t;  // an empty view: the op under test refuses it
    }
    t.staging_ = *std::move(staging);
    EXPECT_OK(backend.CopyToStaging(*t.staging_, host.data(), bytes));
    t.view_ = kernels::TensorView::Contiguous(t.staging_->data(), dtype, shape);
    return t;
  }

  template <typename T>
  std::vector<T> Download(core::Backend& backend) const {
    if (staging_ == nullptr) return {};  // Upload failed (and said so)
    std::vector<T> host(staging_->size() / sizeof(T));
    EXPECT_OK(backend.CopyFromStaging(host.data(), *staging_, staging_->size()));
    return host;
  }

  const kernels::TensorView& view() const { return view_; }

 private:
  std::unique_ptr<core::Backend::Staging> staging_;
  kernels::TensorView view_;
};

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_SERVER_BACKENDS_BACKEND_CONFORMANCE_H_
