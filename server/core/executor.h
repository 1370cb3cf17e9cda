// Executor: resolves a request's tensors to views, runs the op on the
// backend, and collects inline outputs.
//
// Resolution, per tensor, before anything runs:
//  - kBuffer: lease the session's buffer (NOT_FOUND / PERMISSION_DENIED),
//    default row-major strides, then check — overflow-safe — that the view's
//    byte extent [byte_offset, byte_offset + extent) lies inside the buffer
//    (OUT_OF_RANGE naming the field, offset, extent and buffer size), and that
//    the backend can access the buffer's memory (FAILED_PRECONDITION).
//  - kInline: strides must be empty and the byte length must equal
//    product(shape) * element size (INVALID_ARGUMENT); copied to staging.
//  - kNone (outputs): the output is allocated in staging with the shape the
//    op derives and returned inline under the field's name.
// Then the kernels' own validation runs (inside Backend::Run), so bad
// indices etc. come back as INVALID_ARGUMENT with nothing written.
// Leases are held until the op finishes: unregistering a buffer during an op
// is deferred.
//
// Thread-safe: any number of concurrent Run calls.
#ifndef TOKENSEL_SERVER_CORE_EXECUTOR_H_
#define TOKENSEL_SERVER_CORE_EXECUTOR_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/core/backend.h"
#include "server/core/buffer_registry.h"
#include "server/core/request.h"

namespace tokensel::core {

class ServiceMetrics;

class Executor {
 public:
  // `max_inline_bytes` bounds the total inline output bytes of one op
  // (RESOURCE_EXHAUSTED beyond). `max_op_work` bounds EstimateOpWork of one
  // op (RESOURCE_EXHAUSTED before anything is resolved; 0 = no limit).
  // `metrics` may be null.
  Executor(Backend* backend, const BufferRegistry* registry, ServiceMetrics* metrics,
           uint64_t max_inline_bytes, uint64_t max_op_work = 0);

  absl::StatusOr<OpResult> Run(const std::string& session, const OpRequest& op);

  // Runs `ops` in order and stops at the first failure, returned with its
  // position prefixed ("ops[2] (GatherTokens): ..."). Effects of the ops
  // before it remain.
  absl::StatusOr<std::vector<OpResult>> RunAll(const std::string& session,
                                               absl::Span<const OpRequest> ops);

  Backend& backend() const { return *backend_; }

 private:
  Backend* const backend_;
  const BufferRegistry* const registry_;
  ServiceMetrics* const metrics_;
  const uint64_t max_inline_bytes_;
  const uint64_t max_op_work_;
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_EXECUTOR_H_
