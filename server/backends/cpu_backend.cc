#include "server/backends/cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <variant>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_ops.h"

namespace tokensel::backends {
namespace {

constexpr uint64_t kAlignment = 64;

class HostStaging final : public core::Backend::Staging {
 public:
  HostStaging(void* data, uint64_t size) : data_(data), size_(size) {}
  ~HostStaging() override { std::free(data_); }
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;
  void* data() const override { return data_; }
  uint64_t size() const override { return size_; }

 private:
  void* const data_;
  const uint64_t size_;
};

absl::Status CheckCopy(const core::Backend::Staging& staging, uint64_t bytes) {
  if (bytes > staging.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staging copy of ", bytes, " bytes exceeds the staging size ", staging.size()));
  }
  return absl::OkStatus();
}

}  // namespace

CpuBackend::CpuBackend(int threads) : pool_(threads) {}
CpuBackend::~CpuBackend() = default;

bool CpuBackend::CanAccess(core::MemoryKind kind) const { return kind == core::MemoryKind::kHost; }

absl::StatusOr<std::unique_ptr<core::Backend::Staging>> CpuBackend::AllocateStaging(
    uint64_t bytes) {
  // aligned_alloc needs a size that is a multiple of the alignment (and > 0).
  if (bytes > std::numeric_limits<size_t>::max() - kAlignment) {
    return absl::ResourceExhaustedError(absl::StrCat("staging: cannot allocate ", bytes, " bytes"));
  }
  const uint64_t rounded = (bytes + kAlignment) / kAlignment * kAlignment;
  void* data = std::aligned_alloc(kAlignment, static_cast<size_t>(rounded));
  if (data == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("staging: cannot allocate ", bytes, " bytes"));
  }
  // Zero-filled: an inline output never carries stale heap bytes, whatever
  // an op writes.
  std::memset(data, 0, static_cast<size_t>(rounded));
  return std::make_unique<HostStaging>(data, bytes);
}

absl::Status CpuBackend::CopyToStaging(const Staging& dst, const void* src, uint64_t bytes) {
  if (absl::Status s = CheckCopy(dst, bytes); !s.ok()) return s;
  if (bytes != 0) std::memcpy(dst.data(), src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyFromStaging(void* dst, const Staging& src, uint64_t bytes) {
  if (absl::Status s = CheckCopy(src, bytes); !s.ok()) return s;
  if (bytes != 0) std::memcpy(dst, src.data(), static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::Status CpuBackend::RunOp(core::OpArgs args) {
  return std::visit([this](const auto* a) { return kernels::cpu::Run(*a, &pool_); }, args);
}

uint64_t CpuBackend::OpScratchBytes(core::OpArgs args) const {
  return std::visit(
      [this](const auto* a) { return kernels::cpu::ScratchBytes(*a, pool_.threads()); }, args);
}

}  // namespace tokensel::backends
