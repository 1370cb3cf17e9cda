// Backend: where operators run. CpuBackend (server/backends) runs
// kernels::cpu on a thread pool over host memory; CudaBackend runs
// kernels::cuda on the memory of one device; MultiDeviceBackend holds one
// CudaBackend per device and routes each request to one of them (Route).
// The executor first routes the request, then resolves every tensor to a
// view the routed backend can access (CanAccess, OnDevice) and runs it there.
#ifndef TOKENSEL_SERVER_CORE_BACKEND_H_
#define TOKENSEL_SERVER_CORE_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/ops.h"
#include "kernels/stop.h"
#include "server/core/region.h"
#include "server/core/request.h"

namespace tokensel::core {

class MemoryBudget;

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
  kNotImplemented,  // a CUDA device, but waiting and recording are not built
  kSupported,       // Backend::BeginChain (RequestChain below)
};

// The events of one Execute: the client's cudaIpcEventHandle_t bytes as
// sent (ExecuteRequest.wait_event / record_event), empty = none.
struct IpcEvents {
  static constexpr size_t kHandleBytes = 64;  // sizeof(cudaIpcEventHandle_t)
  std::string wait;
  std::string record;
  bool empty() const { return wait.empty() && record.empty(); }
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

// An owning copy of an op's arguments (the views, not the memory they point
// at): what a deferred completion keeps to run the op's Finish later.
template <typename Variant>
struct OpArgsValueOf;
template <typename... Requests>
struct OpArgsValueOf<std::variant<Requests...>> {
  using type = std::variant<typename Requests::Op::Args...>;
};
using OpArgsValue = OpArgsValueOf<OpRequest>::type;
inline OpArgsValue CopyArgs(OpArgs args) {
  return std::visit([](const auto* a) { return OpArgsValue(*a); }, args);
}
inline OpArgs ArgsOf(const OpArgsValue& value) {
  return std::visit([](const auto& a) { return OpArgs(&a); }, value);
}

// Where one by-reference tensor of a request lives (Backend::Route).
struct TensorPlacement {
  std::string field;        // the request field, e.g. "activations"
  std::string device_uuid;  // its buffer's MappedRegion::device_uuid(); empty = host memory
};

class Backend;

// One request's hold on the backend that serves it (Backend::BeginRequest,
// on the routed backend): its staging for inline tensors and its op. On
// CUDA it is one lease of a stream (plus, while the op runs, a workspace,
// and its pooled staging memory) from the route to the copies back, and
// every staging copy is ordered on that stream with the op's kernels:
//   StageInput / StageOutput: the host->device copies and zero fills,
//   RunOp: the kernels, then the device->host copies of every read-back
//          tensor, then one stream synchronization,
//   ReadBack: host copies out of the (pinned) host staging into the reply.
// On the CPU (the default implementation, over AllocateStaging and the
// synchronous Copy*) staging is host memory and every call is synchronous.
// Destroying the lease returns everything it holds (after draining any copy
// still in flight). Used by one thread; must not outlive its backend.
class RequestLease {
 public:
  // A staged tensor: `data` is what the op's view points at; `slot` names it
  // in ReadBack.
  struct Staged {
    void* data = nullptr;
    size_t slot = 0;
  };
  virtual ~RequestLease() = default;
  // The bytes StageInput / StageOutput of `bytes` make the server allocate
  // (the caller counts them in its MemoryBudget first): host and device
  // staging, rounded up to the pools' granules, on CUDA.
  virtual uint64_t StagingCost(uint64_t bytes) const = 0;
  // Staging holding src[0, bytes), read before the call returns (the
  // caller's memory may change afterwards). If `read_back`, the op may write
  // it and ReadBack returns its contents after the op.
  virtual absl::StatusOr<Staged> StageInput(const void* src, uint64_t bytes, bool read_back) = 0;
  // Zero-filled staging for an output, read back after the op.
  virtual absl::StatusOr<Staged> StageOutput(uint64_t bytes) = 0;
  // Runs the op on the staged and by-reference views, synchronously (as
  // Backend::RunOp; on return the read-back tensors are on the host).
  virtual absl::Status RunOp(OpArgs args) = 0;
  // After RunOp succeeded: `bytes` (at most the staged size) of the tensor
  // staged as `slot` into `dst`. INVALID_ARGUMENT for a slot that is not
  // read back or a size beyond it.
  virtual absl::Status ReadBack(size_t slot, void* dst, uint64_t bytes) = 0;

  template <typename Args>
  absl::Status Run(const Args& args) {
    return RunOp(OpArgs(&args));
  }
};

// The ops of one Execute that carries CUDA IPC events (Backend::BeginChain,
// on the routed backend), in order on ONE device stream:
//   BeginChain: the stream waits on the client's wait_event (before anything
//               of the request is staged: staging may write outputs);
//   BeginOp:    each op's RequestLease on that stream (as BeginRequest's);
//   Commit:     the client's record_event is recorded after the last op.
// Sync mode: every op's RunOp synchronizes as without events.
// Async mode (a record_event and no inline output): RunOp only launches;
// when an op's lease ends its staging and workspace pass to the chain, and
// Commit hands them, everything Hold() was given (buffer leases, the memory
// reservation, ...) and the stream to the backend's completion thread. That
// thread, once the device work completed (a private event, never a host
// synchronization of the request thread), runs each op's Finish, calls
// `done` with the first error ("ops[k] (Name): ...") or OK, and only then
// returns everything. Commit must be called (on every path once BeginChain
// succeeded, errors included, so that what was launched is waited for and
// the client's event is recorded); a chain destroyed without Commit drains
// its stream first. `done` (may be empty) is called exactly once when the
// chain's stream is released, possibly before Commit returns; with the
// first device error in async mode, else OK. Used by one thread.
class RequestChain {
 public:
  using DoneFn = std::function<void(absl::Status)>;
  // The outcome of an async chain's wait (Commit): true, the wait passed;
  // false, it had not passed by the bound (the request turns stuck).
  using WaitFn = std::function<void(bool passed)>;
  virtual ~RequestChain() = default;
  virtual bool async() const = 0;
  // The lease of the next op; `label` ("ops[2] (GatherTokens)") prefixes
  // its deferred error.
  virtual absl::StatusOr<std::unique_ptr<RequestLease>> BeginOp(std::string label) = 0;
  // Kept alive until the device work completed (async) or the chain ends.
  // The first kHoldsThatCannotThrow calls (before Commit) do not throw: the
  // executor gives the chain what the device work uses on its exception
  // path too.
  static constexpr size_t kHoldsThatCannotThrow = 2;
  virtual void Hold(std::shared_ptr<void> keep) = 0;
  // Sync chains, before the first op: waits on the host, polling, until
  // the client's wait_event completed (OK at once without one), or until
  // `stop` (may be null) fires: then its error, and the chain is
  // abandoned: Commit records nothing and, instead of synchronizing the
  // stream (which would block on a client event that may never complete),
  // hands it to the completion thread. So a sync request blocks its thread
  // at most until its deadline.
  virtual absl::Status AwaitWait(const kernels::StopToken* stop) = 0;
  // Records record_event; async: hands the work to the completion thread.
  // The error of the record, if any (the work is handed over regardless).
  // `on_wait` (may be empty; async chains with a wait_event): called at
  // most once, before `done`: with true as soon as the stream's wait on the
  // client's event is seen passed (the request's wait slot goes back:
  // AsyncRequests::Ticket::WaitPassed), or with false if it has not passed
  // a bound after the chain began (the request then counts as stuck:
  // AsyncRequests::Ticket::Abandon). Not called when the work completes
  // first (`done` then gives everything back).
  virtual absl::Status Commit(DoneFn done, WaitFn on_wait) = 0;
};

// The backend that serves one request (Backend::Route). Every call the
// request makes (staging, scratch size, RunOp, the copies back) goes to
// backend(); while the route lives the request counts as in flight there.
// Move-only; must not outlive the backend that made it.
class BackendRoute {
 public:
  explicit BackendRoute(Backend* backend, std::function<void()> on_done = nullptr)
      : backend_(backend), on_done_(std::move(on_done)) {}
  BackendRoute(BackendRoute&& other) noexcept
      : backend_(other.backend_), on_done_(std::move(other.on_done_)) {
    other.on_done_ = nullptr;
  }
  BackendRoute& operator=(BackendRoute&& other) noexcept {
    if (this != &other) {
      if (on_done_) on_done_();
      backend_ = other.backend_;
      on_done_ = std::move(other.on_done_);
      other.on_done_ = nullptr;
    }
    return *this;
  }
  BackendRoute(const BackendRoute&) = delete;
  ~BackendRoute() {
    if (on_done_) on_done_();
  }
  Backend& backend() const { return *backend_; }

 private:
  Backend* backend_;
  std::function<void()> on_done_;
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
  // The `device` label of the op metrics for ops run here: "cpu" on the
  // CPU, "cuda:<ordinal>" on a CUDA device. device_labels(): every label a
  // routed request can report (one per device for MultiDeviceBackend).
  virtual absl::string_view device_label() const { return name(); }
  virtual std::vector<std::string> device_labels() const { return {std::string(device_label())}; }
  // Whether memory of device `device_uuid` (a non-empty
  // MappedRegion::device_uuid()) may be passed to Run. Default: any (the
  // memory kind, CanAccess, decides); CudaBackend: its own device only, since
  // an IPC mapping exists only in the context of the device it was opened
  // on and a kernel on another device faults on it.
  virtual bool OnDevice(absl::string_view /*device_uuid*/) const { return true; }
  // False once the backend can no longer run ops (CudaBackend: a sticky CUDA
  // error killed its context) and never true again; the server then reports
  // NOT_SERVING (core::HealthWatch). Thread-safe.
  virtual bool healthy() const { return true; }

  // The backend that serves one request, decided once per request before
  // anything is staged. `placements` lists where its by-reference tensors
  // live; it is called only by backends that route (MultiDeviceBackend),
  // others answer themselves. Errors (nothing staged, nothing run):
  // FAILED_PRECONDITION for tensors on different devices or on a device
  // this backend does not serve.
  virtual absl::StatusOr<BackendRoute> Route(
      absl::FunctionRef<std::vector<TensorPlacement>()> /*placements*/) {
    return BackendRoute(this);
  }

  // The lease one request runs under (RequestLease): UNAVAILABLE when the
  // backend is out of service. The default stages through AllocateStaging
  // and the synchronous Copy* below and runs RunOp (the CPU, test fakes);
  // CudaBackend stages on the stream of the lease (cuda_backend.h).
  virtual absl::StatusOr<std::unique_ptr<RequestLease>> BeginRequest();

  // A request with CUDA IPC events (RequestChain), for `session` (whose
  // opened events the backend caches). Only backends with
  // ipc_events() == kSupported; the default is FAILED_PRECONDITION.
  // INVALID_ARGUMENT naming the field for a handle that does not open.
  virtual absl::StatusOr<std::unique_ptr<RequestChain>> BeginChain(const std::string& session,
                                                                   const IpcEvents& events,
                                                                   bool async);
  // A session opened (SessionManager's begin callback, before its id is
  // handed out): the backend may keep things for it (its events) until
  // EndSession. The session ended: drop what the backend keeps for it.
  virtual void BeginSession(const std::string& /*session*/) {}
  virtual void EndSession(const std::string& /*session*/) {}
  // Shutdown after its grace (server/app/server.cc): stop waiting for the
  // device work of requests that have not completed (streams stuck on
  // client events). Each such request's completion runs now (its ticket
  // completes) and what its work may still use is leaked; the backend's
  // completion thread ends, so the process can exit. Nothing is destroyed.
  virtual void AbandonPendingWork() {}
  // The budget that pays for memory the backend keeps beyond its caches'
  // bounds (CUDA: idle pool blocks beyond a cap while frees wait on the
  // FreeGate, free_gate.h); null detaches it (before the budget ends).
  virtual void AttachMemoryBudget(MemoryBudget* /*budget*/) {}

  // Memory for inline tensors, accessible to Run: aligned host memory on the
  // CPU, device memory on CUDA. Copies are synchronous. A direct API (tests,
  // tools): requests stage through BeginRequest.
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
