// ForwardingBackend: a core::Backend that forwards everything to a
// CpuBackend; tests override what they need to observe or stage (a hook
// inside Run, a reported scratch size, ...).
#ifndef TOKENSEL_TESTS_SERVER_CORE_FORWARDING_BACKEND_H_
#define TOKENSEL_TESTS_SERVER_CORE_FORWARDING_BACKEND_H_

#include <cstdint>
#include <memory>

#include "server/backends/cpu_backend.h"
#include "server/core/backend.h"

namespace tokensel::testing {

class ForwardingBackend : public core::Backend {
 public:
  explicit ForwardingBackend(int threads = 1) : cpu_(threads) {}

  absl::string_view name() const override { return cpu_.name(); }
  core::IpcEventSupport ipc_events() const override { return cpu_.ipc_events(); }
  bool CanAccess(core::MemoryKind kind) const override { return cpu_.CanAccess(kind); }
  absl::StatusOr<std::unique_ptr<Staging>> AllocateStaging(uint64_t bytes) override {
    return cpu_.AllocateStaging(bytes);
  }
  absl::Status CopyToStaging(const Staging& dst, const void* src, uint64_t bytes) override {
    return cpu_.CopyToStaging(dst, src, bytes);
  }
  absl::Status CopyFromStaging(void* dst, const Staging& src, uint64_t bytes) override {
    return cpu_.CopyFromStaging(dst, src, bytes);
  }
  absl::Status RunOp(core::OpArgs args) override { return cpu_.RunOp(args); }
  uint64_t OpScratchBytes(core::OpArgs args) const override { return cpu_.OpScratchBytes(args); }

 protected:
  backends::CpuBackend cpu_;
};

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_SERVER_CORE_FORWARDING_BACKEND_H_
