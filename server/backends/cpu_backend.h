// CpuBackend: the embedded default backend. Runs kernels::cpu on a
// ThreadPool over host memory; staging is 64-byte-aligned heap memory.
//
// Thread-safe: any number of concurrent Run calls share the pool (each call
// parallelizes its rows; results do not depend on the thread count).
#ifndef TOKENSEL_SERVER_BACKENDS_CPU_BACKEND_H_
#define TOKENSEL_SERVER_BACKENDS_CPU_BACKEND_H_

#include <memory>

#include "kernels/cpu/thread_pool.h"
#include "server/core/backend.h"

namespace tokensel::backends {

class CpuBackend final : public core::Backend {
 public:
  // `threads` as for kernels::cpu::ThreadPool: total parallelism including
  // the calling thread, 0 = hardware concurrency.
  explicit CpuBackend(int threads);
  ~CpuBackend() override;

  absl::string_view name() const override { return "cpu"; }
  // Host memory only.
  bool CanAccess(core::MemoryKind kind) const override;
  int threads() const { return pool_.threads(); }

  // RESOURCE_EXHAUSTED when the allocation fails. The memory is zero-filled
  // and 64-byte aligned; zero bytes gives a valid (non-null) allocation.
  absl::StatusOr<std::unique_ptr<Staging>> AllocateStaging(uint64_t bytes) override;
  // INVALID_ARGUMENT when `bytes` exceeds the staging size.
  absl::Status CopyToStaging(const Staging& dst, const void* src, uint64_t bytes) override;
  absl::Status CopyFromStaging(void* dst, const Staging& src, uint64_t bytes) override;

  // kernels::cpu::Run on this pool.
  absl::Status RunOp(core::OpArgs args) override;
  // kernels::cpu::ScratchBytes on this pool's thread count.
  uint64_t OpScratchBytes(core::OpArgs args) const override;

 private:
  kernels::cpu::ThreadPool pool_;
};

}  // namespace tokensel::backends

#endif  // TOKENSEL_SERVER_BACKENDS_CPU_BACKEND_H_
