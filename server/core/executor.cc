// Executor: each op's home (ops/<op>.h) resolves the request's tensors
// (resolve.h) into kernel arguments; the executor runs them on the backend
// (timed: op_duration covers RequestLease::RunOp only: the kernels, and on
// CUDA the copies back of inline outputs and the stream synchronization) and reports the bytes the
// op says it moved. Which outputs come back inline, and in place, is stated per op in its home.
#include "server/core/executor.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/core/resolve.h"
#include "server/core/service_metrics.h"

namespace tokensel::core {
namespace {

// What every per-op function needs: the resolver and a timed backend call
// whose scratch is reserved first. In measure mode nothing runs.
struct OpContext {
  Resolver& resolver;
  Backend& backend;
  RequestLease* lease;                // null in measure mode
  MemoryBudget::Reservation* memory;  // null in measure mode
  const kernels::StopToken* stop;
  absl::string_view op_name;
  bool keep_scratch = false;  // async: the workspace outlives Run
  double seconds = 0;
  uint64_t bytes = 0;

  template <typename Args>
  absl::Status Run(const Args& args) {
    if (memory == nullptr) return absl::OkStatus();  // measuring
    const uint64_t scratch = backend.ScratchBytes(args);
    // Pooled on a device backend: may reuse a charged idle block, whose
    // charge the request takes over (memory_budget.h).
    RETURN_IF_ERROR(memory->Grow(scratch, absl::StrCat("scratch of ", op_name)));
    kernels::ScopedStopToken scope(stop);
    RETURN_IF_ERROR(kernels::CheckStop());
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = lease->Run(args);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // An async op's workspace is held until its device work completed; the
    // reservation (held with it) keeps counting the scratch until then.
    if (!keep_scratch) memory->Shrink(scratch);
    return status;
  }
};

// Every op, generically: resolve through its home (ops/<op>.h), run, count
// the bytes it moved. In measure mode Run does nothing.
template <typename Request>
absl::Status RunOp(OpContext& ctx, const Request& req) {
  using Op = typename Request::Op;
  ASSIGN_OR_RETURN(const typename Op::Args args, Op::Resolve(ctx.resolver, req));
  RETURN_IF_ERROR(ctx.Run(args));
  ctx.bytes = Op::BytesMoved(args);
  return absl::OkStatus();
}

}  // namespace

Executor::Executor(Backend* backend, BufferRegistry* registry, ServiceMetrics* metrics,
                   ExecutorLimits limits, MemoryBudget* budget)
    : backend_(backend), registry_(registry), metrics_(metrics), limits_(limits), budget_(budget) {}

absl::Status Executor::CheckWork(const OpRequest& op) const {
  if (limits_.max_op_work != 0) {
    if (const uint64_t work = EstimateOpWork(op); work > limits_.max_op_work) {
      return absl::ResourceExhaustedError(absl::StrCat(
          OpName(op), ": about ", work, " elements of work (what it reads and writes), above the ",
          "per-op limit of ", limits_.max_op_work, " (--max_op_elements)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<OpResult> Executor::Run(const std::string& session, const OpRequest& op,
                                       const RunOptions& options) {
  RETURN_IF_ERROR(CheckWork(op));
  MemoryBudget::Reservation own =
      budget_ != nullptr ? budget_->Open() : MemoryBudget::Reservation();
  MemoryBudget::Reservation* memory = options.memory != nullptr ? options.memory : &own;
  // Which backend (device) serves the op is decided once, here, before
  // anything is staged: the staging of inline tensors, the scratch, the
  // kernel and the copies back then all use that one device. `route` lives
  // until the resolver (and its staging) is gone.
  ASSIGN_OR_RETURN(const BackendRoute route, Route(session, absl::MakeConstSpan(&op, 1)));
  Backend& backend = route.backend();
  // One lease of the routed backend from the first staging copy to the last
  // copy back (RequestLease: on CUDA one stream that orders them with the
  // kernels); it outlives the resolver, whose views point into its staging.
  // `keep` before `lease`: the buffers outlive the lease's drain.
  std::vector<BufferLease> keep;
  ASSIGN_OR_RETURN(std::unique_ptr<RequestLease> lease, backend.BeginRequest());
  OpResult result;
  uint64_t staged = 0;
  const absl::Status status = RunLeased(session, op, backend, lease.get(), memory, options, &keep,
                                        /*async=*/false, &result, &staged);
  // The staging belongs to the lease, not the resolver: on CUDA its pinned
  // and device blocks stay taken (and copies may still be queued on its
  // stream after an error) until the lease ends, which drains the stream and
  // returns them to their pools. Only then does the budget stop counting
  // them, on every path, or another request could be admitted against memory
  // this one still holds.
  lease.reset();
  memory->Shrink(staged);
  if (!status.ok()) return status;
  return result;
}

absl::Status Executor::RunLeased(const std::string& session, const OpRequest& op, Backend& backend,
                                 RequestLease* lease, MemoryBudget::Reservation* memory,
                                 const RunOptions& options, std::vector<BufferLease>* keep,
                                 bool async, OpResult* result, uint64_t* staged) {
  Resolver resolver(&backend, lease, registry_, session, limits_.max_inline_bytes, memory);
  resolver.KeepLeasesIn(keep);
  OpContext ctx{resolver, backend, lease, memory, options.stop, OpName(op), async};
  absl::Status status = std::visit([&](const auto& req) { return RunOp(ctx, req); }, op);
  // Lost memory outranks whatever the op reported: its inputs were zeros.
  if (absl::Status lost = resolver.CheckLostBuffers(registry_); !lost.ok()) status = lost;
  if (status.ok()) {
    absl::StatusOr<std::vector<InlineOutput>> outputs = resolver.TakeInlineOutputs();
    if (outputs.ok()) {
      result->outputs = *std::move(outputs);
    } else {
      status = outputs.status();
    }
  }
  *staged = resolver.staged_bytes();
  result->bytes_moved = ctx.bytes;
  if (status.ok() && metrics_ != nullptr) {
    metrics_->ObserveOp(OpName(op), backend.device_label(), ctx.seconds, ctx.bytes);
  }
  // The buffer leases are in `keep` already (KeepLeasesIn): an async chain
  // holds them until its kernels completed.
  return status;
}

absl::StatusOr<BackendRoute> Executor::Route(const std::string& session,
                                             absl::Span<const OpRequest> ops,
                                             size_t* on_device) const {
  return backend_->Route([&]() {
    std::vector<TensorPlacement> placements;
    for (size_t i = 0; i < ops.size(); ++i) {
      const OpRequest& op = ops[i];
      // The op's by-reference tensors, found by resolving it in measure mode
      // (metadata only: no lease, no staging). A failure there, or a buffer
      // that cannot be leased, is left for the real resolution to report
      // with its usual message; the tensors found until then still count.
      Resolver probe(backend_, nullptr, registry_, session, limits_.max_inline_bytes, nullptr,
                     /*measure_only=*/true);
      OpContext ctx{probe, *backend_, nullptr, nullptr, nullptr, OpName(op)};
      (void)std::visit([&](const auto& req) { return RunOp(ctx, req); }, op);
      for (const auto& [field, buffer] : probe.buffer_refs()) {
        absl::StatusOr<BufferLease> lease = registry_->Acquire(session, buffer);
        if (!lease.ok()) continue;
        placements.push_back(
            TensorPlacement{ops.size() == 1 ? field : absl::StrCat("ops[", i, "].", field),
                            (*lease)->region().device_uuid()});
        if (on_device != nullptr && !placements.back().device_uuid.empty()) ++*on_device;
      }
    }
    return placements;
  });
}

void Executor::MeasureInline(const OpRequest& op, uint64_t* bytes, size_t* count) const {
  static const std::string no_session;
  Resolver resolver(backend_, nullptr, registry_, no_session, limits_.max_inline_bytes, nullptr,
                    /*measure_only=*/true);
  OpContext ctx{resolver, *backend_, nullptr, nullptr, nullptr, OpName(op)};
  const absl::Status status = std::visit([&](const auto& req) { return RunOp(ctx, req); }, op);
  *bytes = status.ok() ? resolver.inline_output_bytes() : 0;
  *count = status.ok() ? resolver.inline_outputs() : 0;
}

uint64_t Executor::InlineOutputBytes(const OpRequest& op) const {
  uint64_t bytes = 0;
  size_t count = 0;
  MeasureInline(op, &bytes, &count);
  return bytes;
}

size_t Executor::InlineOutputs(const OpRequest& op) const {
  uint64_t bytes = 0;
  size_t count = 0;
  MeasureInline(op, &bytes, &count);
  return count;
}

absl::Status Executor::CheckResponse(absl::Span<const OpRequest> ops) const {
  // The whole response is sized before anything runs: a short request must
  // not make the server build a huge one (each op alone is within its limit).
  uint64_t response = 0;
  for (const OpRequest& op : ops) {
    response += std::min(InlineOutputBytes(op), limits_.max_inline_bytes);
    if (response > limits_.max_response_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "ops: their inline outputs add up to more than ", limits_.max_response_bytes,
          " bytes, the limit of one response (--max_message_bytes); write outputs to buffers "
          "or split the request"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<OpResult>> Executor::RunAll(const std::string& session,
                                                       absl::Span<const OpRequest> ops,
                                                       const RunOptions& options) {
  if (options.events != nullptr && !options.events->empty()) {
    return RunChain(session, ops, options);
  }
  RETURN_IF_ERROR(CheckResponse(ops));
  MemoryBudget::Reservation own =
      budget_ != nullptr ? budget_->Open() : MemoryBudget::Reservation();
  RunOptions per_op = options;
  if (per_op.memory == nullptr) per_op.memory = &own;
  std::vector<OpResult> results;
  results.reserve(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    absl::StatusOr<OpResult> result = Run(session, ops[i], per_op);
    if (!result.ok()) {
      return absl::Status(result.status().code(), absl::StrCat("ops[", i, "] (", OpName(ops[i]),
                                                               "): ", result.status().message()));
    }
    results.push_back(*std::move(result));
  }
  return results;
}

}  // namespace tokensel::core
