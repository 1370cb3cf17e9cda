// Resolver: turns the TensorSpecs of one op into kernels::TensorViews the
// backend can use, and owns what those views point into (buffer leases and
// staging memory) until it is destroyed.
//
//  - kBuffer: dtype and shape are required; strides default to row-major.
//    The view's byte extent is computed overflow-safely (kernels::
//    ComputeExtent), the buffer is leased (NOT_FOUND / PERMISSION_DENIED),
//    then [byte_offset, byte_offset + extent) is checked against the buffer
//    without overflow (`extent > UINT64_MAX - offset` first), giving
//    OUT_OF_RANGE "activations: byte_offset 4096 + extent 65536 exceeds
//    buffer 'acts' size 32768"; a buffer in memory the backend cannot access
//    is FAILED_PRECONDITION, and so is one on a device the backend does not
//    run on (Backend::OnDevice: the op was routed to another device, and the
//    buffer was re-registered there since). Only then is a pointer formed.
//  - kInline: dtype and shape required, strides must be empty and the length
//    must equal product(shape) * element size (INVALID_ARGUMENT); the bytes
//    are staged through the request's RequestLease (backend.h: on CUDA an
//    async copy on the op's stream from pooled pinned memory).
//  - kNone: for inputs INVALID_ARGUMENT "<field>: missing"; for outputs the
//    result is allocated in staging with the shape the op derives
//    (output_shapes.h) and returned inline. A dtype or shape in the spec must
//    then equal the derived one (or, for ids outputs, pick int32|int64).
// The total size of the inline outputs of one op is bounded by
// `max_inline_bytes` (RESOURCE_EXHAUSTED, checked before allocating), and
// every staging allocation is first reserved in `memory` (MemoryBudget), at
// the lease's StagingCost (host and device staging on CUDA).
// Every message starts with the request field's name.
//
// Measure mode (`measure_only`): the same checks and shape derivations on
// metadata alone, for sizing a response before running anything: no lease,
// no staging, views carry no data; inline_output_bytes() is the result.
//
// Not thread-safe: one Resolver per op execution.
#ifndef TOKENSEL_SERVER_CORE_RESOLVE_H_
#define TOKENSEL_SERVER_CORE_RESOLVE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/tensor_view.h"
#include "server/core/backend.h"
#include "server/core/buffer_registry.h"
#include "server/core/memory_budget.h"
#include "server/core/output_shapes.h"
#include "server/core/tensor_spec.h"

namespace tokensel::core {

class Resolver {
 public:
  using DeriveFn = absl::FunctionRef<absl::StatusOr<OutputShape>()>;

  // `memory` may be null (nothing is counted). `lease` (the request's, on
  // `backend`) stages inline tensors; null only in measure mode. Both must
  // outlive the resolver.
  Resolver(Backend* backend, RequestLease* lease, const BufferRegistry* registry,
           const std::string& session, uint64_t max_inline_bytes, MemoryBudget::Reservation* memory,
           bool measure_only = false);
  ~Resolver();
  Resolver(const Resolver&) = delete;
  Resolver& operator=(const Resolver&) = delete;

  // A required input (kBuffer or kInline).
  absl::StatusOr<kernels::TensorView> Input(const TensorSpec& spec, absl::string_view field);
  // An optional input: nullopt stays nullopt; present means required.
  absl::StatusOr<std::optional<kernels::TensorView>> OptionalInput(
      const std::optional<TensorSpec>& spec, absl::string_view field);

  // An input the op writes in place (SortTokens ids without `out`,
  // ScatterTokens all). Inline data is staged like an input and the result is
  // returned inline under `result_name`.
  absl::StatusOr<kernels::TensorView> InOut(const TensorSpec& spec, absl::string_view field,
                                            absl::string_view result_name);

  // An output: kBuffer writes there; kNone (or an absent spec) returns it
  // inline under `field`, shaped by `derive` (called only in that case);
  // kInline is INVALID_ARGUMENT (an output carries no data).
  absl::StatusOr<kernels::TensorView> Output(const std::optional<TensorSpec>& spec,
                                             absl::string_view field, DeriveFn derive);

  // After the op succeeded: copies the inline outputs out of the lease's
  // read-back staging (RequestLease::ReadBack), in
  // the order they were resolved (their bytes are reserved in `memory` first,
  // and stay reserved).
  absl::StatusOr<std::vector<InlineOutput>> TakeInlineOutputs();

  // After the op ran: FAILED_PRECONDITION naming the first buffer whose
  // memory was lost under the op (MappedRegion::faulted), after
  // unregistering every such buffer from `registry` (if it is still the one
  // registered under its name).
  absl::Status CheckLostBuffers(BufferRegistry* registry) const;

  uint64_t inline_output_bytes() const { return inline_output_bytes_; }
  // How many tensors come back inline (measure mode too), even of 0 bytes.
  size_t inline_outputs() const { return inline_outputs_; }
  // Each lease taken from now on is also copied into `*keep` (owned by the
  // caller, which keeps the buffers mapped until the device work that uses
  // them is done, whatever happens to the resolver).
  void KeepLeasesIn(std::vector<BufferLease>* keep) { keep_ = keep; }
  // Measure mode: (field, buffer name) of every by-reference tensor seen, in
  // resolution order (the executor routes the op by their buffers' devices).
  const std::vector<std::pair<std::string, std::string>>& buffer_refs() const {
    return buffer_refs_;
  }
  // Staging bytes reserved so far (given back by the caller after the op).
  uint64_t staged_bytes() const { return staged_bytes_; }

 private:
  struct Pending {
    std::string name;
    kernels::DType dtype;
    std::vector<int64_t> shape;
    size_t slot;  // RequestLease::Staged::slot
    uint64_t bytes;
  };

  absl::StatusOr<kernels::TensorView> BufferView(const TensorSpec& spec, absl::string_view field);
  // `slot` (not null: the tensor is read back after the op) receives its
  // staging slot.
  absl::StatusOr<kernels::TensorView> InlineView(const TensorSpec& spec, absl::string_view field,
                                                 size_t* slot = nullptr);
  // Counts `bytes` more inline output bytes; RESOURCE_EXHAUSTED beyond
  // max_inline_bytes_.
  absl::Status ReserveInline(absl::string_view field, uint64_t bytes);
  // What Stage stages: an inline input (kInput; kInOut: also read back after
  // the op) copied from `src`, or a zeroed output (kOutput; `src` unused).
  enum class StageKind { kInput, kInOut, kOutput };
  // Reserves the lease's StagingCost(bytes) in `memory`, then stages as
  // `kind` says. Errors are prefixed with `field`.
  absl::StatusOr<RequestLease::Staged> Stage(absl::string_view field, StageKind kind,
                                             const void* src, uint64_t bytes);

  Backend* const backend_;
  RequestLease* const lease_;
  const BufferRegistry* const registry_;
  const std::string& session_;
  const uint64_t max_inline_bytes_;
  MemoryBudget::Reservation* const memory_;
  const bool measure_only_;
  uint64_t inline_output_bytes_ = 0;
  size_t inline_outputs_ = 0;
  uint64_t staged_bytes_ = 0;
  std::vector<std::pair<std::string, BufferLease>> leases_;       // (buffer name, lease)
  std::vector<BufferLease>* keep_ = nullptr;                      // KeepLeasesIn
  std::vector<std::pair<std::string, std::string>> buffer_refs_;  // measure mode
  std::vector<Pending> pending_;
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_RESOLVE_H_
