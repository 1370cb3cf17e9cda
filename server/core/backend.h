// Backend: where operators run. CpuBackend (server/backends) runs
// kernels::cpu on a thread pool over host memory; CudaBackend runs
// kernels::cuda on device memory. The executor resolves every tensor to a
// view the backend can access (CanAccess) before calling Run.
#ifndef TOKENSEL_SERVER_CORE_BACKEND_H_
#define TOKENSEL_SERVER_CORE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/ops.h"
#include "server/core/region.h"

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
  virtual absl::Status Run(const kernels::SortTokensArgs& args) = 0;
  virtual absl::Status Run(const kernels::GatherTokensArgs& args) = 0;
  virtual absl::Status Run(const kernels::ScatterTokensArgs& args) = 0;
  virtual absl::Status Run(const kernels::GatherBertMaskArgs& args) = 0;
  virtual absl::Status Run(const kernels::SliceGptMaskArgs& args) = 0;
  virtual absl::Status Run(const kernels::SegmentSeqlensArgs& args) = 0;
  virtual absl::Status Run(const kernels::SampleTokensArgs& args) = 0;
  virtual absl::Status Run(const kernels::TopKTokensArgs& args) = 0;

  // An upper bound of the memory Run(args) allocates (host scratch on the
  // CPU, the device workspace on CUDA), from the views' metadata alone, so
  // the executor can count it (MemoryBudget) before running. Saturating;
  // safe on args that would fail validation.
  virtual uint64_t ScratchBytes(const kernels::SortTokensArgs& args) const = 0;
  virtual uint64_t ScratchBytes(const kernels::GatherTokensArgs& args) const = 0;
  virtual uint64_t ScratchBytes(const kernels::ScatterTokensArgs& args) const = 0;
  virtual uint64_t ScratchBytes(const kernels::GatherBertMaskArgs& args) const = 0;
  virtual uint64_t ScratchBytes(const kernels::SliceGptMaskArgs& args) const = 0;
  virtual uint64_t ScratchBytes(const kernels::SegmentSeqlensArgs& args) const = 0;
  virtual uint64_t ScratchBytes(const kernels::SampleTokensArgs& args) const = 0;
  virtual uint64_t ScratchBytes(const kernels::TopKTokensArgs& args) const = 0;
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_BACKEND_H_
