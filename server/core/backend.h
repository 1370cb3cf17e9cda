// Backend: where operators run. CpuBackend (server/backends) runs
// kernels::cpu on a thread pool over host memory; CudaBackend runs
// kernels::cuda on device memory. The executor resolves every tensor to a
// view the backend can access (CanAccess) before calling Run.
#ifndef TOKENSEL_SERVER_CORE_BACKEND_H_
#define TOKENSEL_SERVER_CORE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/ops.h"
#include "server/core/region.h"
#include "server/core/request.h"

namespace tokensel::core {

struct DeviceDescription {
  int ordinal = 0;
  std::string uuid;
  std::string name;
  int compute_capability = 0;
  uint64_t total_memory_bytes = 0;
};

// CUDA IPC events (Execute's wait_event / record_event): what a backend can
// do with them.
enum class IpcEventSupport : uint8_t {
  kNoDevice,        // no CUDA device to wait on or record with (the CPU)
  kNotImplemented,  // a CUDA device, but waiting and recording are not built yet
};

// The arguments of any operator (one alternative per OpRequest, by pointer):
// implementations dispatch with std::visit on overloads by argument type
// (kernels::cpu::Run, kernels::cuda::Async, ...), so adding an operator does
// not touch a backend.
template <typename Variant>
struct OpArgsOf;
template <typename... Requests>
struct OpArgsOf<std::variant<Requests...>> {
  using type = std::variant<const typename Requests::Op::Args*...>;
};
using OpArgs = OpArgsOf<OpRequest>::type;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual absl::string_view name() const = 0;  // "cpu" | "cuda" (metric label)
  // Capability: decides how Execute answers a request that carries events.
  virtual IpcEventSupport ipc_events() const { return IpcEventSupport::kNoDevice; }
  // Whether views into memory of this kind can be passed to Run.
  virtual bool CanAccess(MemoryKind kind) const = 0;
  virtual std::vector<DeviceDescription> devices() const { return {}; }

  // Memory for inline tensors, accessible to Run: aligned host memory on the
  // CPU, device memory on CUDA. Copies are synchronous.
  class Staging {
   public:
    virtual ~Staging() = default;
    virtual void* data() const = 0;
    virtual uint64_t size() const = 0;
  };
  virtual absl::StatusOr<std::unique_ptr<Staging>> AllocateStaging(uint64_t bytes) = 0;
  virtual absl::Status CopyToStaging(const Staging& dst, const void* src, uint64_t bytes) = 0;
  virtual absl::Status CopyFromStaging(void* dst, const Staging& src, uint64_t bytes) = 0;

  // Synchronous: the op has completed (or failed, writing nothing) on return.
  // Errors are the kernels' (INVALID_ARGUMENT) or INTERNAL for device faults;
  // CANCELLED / DEADLINE_EXCEEDED when the calling thread's stop token
  // (kernels/stop.h) fired, in which case outputs may be partly written.
  virtual absl::Status RunOp(OpArgs args) = 0;

  // An upper bound of the memory RunOp(args) allocates (host scratch on the
  // CPU, the device workspace on CUDA), from the views' metadata alone, so
  // the executor can count it (MemoryBudget) before running. Saturating;
  // safe on args that would fail validation.
  virtual uint64_t OpScratchBytes(OpArgs args) const = 0;

  // The same, typed: Run(args) with any kernels::<Op>Args.
  template <typename Args>
  absl::Status Run(const Args& args) {
    return RunOp(OpArgs(&args));
  }
  template <typename Args>
  uint64_t ScratchBytes(const Args& args) const {
    return OpScratchBytes(OpArgs(&args));
  }
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_BACKEND_H_
