#include "server/core/resolve.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "kernels/validate.h"

namespace tokensel::core {
namespace {

// What a view points at in measure mode: non-null (shape checks insist on
// data for non-empty views), never dereferenced (nothing runs).
char measure_sentinel;

using kernels::DType;
using kernels::TensorView;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

absl::string_view MemoryKindName(MemoryKind kind) {
  return kind == MemoryKind::kHost ? "host" : "CUDA device";
}

// Turns a spec's metadata into a view (data = null) with explicit or default
// row-major strides and checks it with kernels::CheckView, the one view
// validation (dims, strides, element count and byte extent within int64).
// What only a spec can get wrong (no dtype, a rank the view cannot hold, a
// stride count that does not match the shape) is checked here first.
absl::StatusOr<TensorView> MetadataView(const TensorSpec& spec, absl::string_view field) {
  if (!spec.dtype.has_value())
    return absl::InvalidArgumentError(absl::StrCat(field, ": dtype is required"));
  const size_t rank = spec.shape.size();
  if (rank == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": shape is required (rank 0)"));
  }
  if (rank > static_cast<size_t>(kernels::kMaxRank)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": rank ", rank, " (shape ",
                                                   ShapeString(spec.shape), ") exceeds ",
                                                   kernels::kMaxRank));
  }
  if (!spec.strides.empty() && spec.strides.size() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", spec.strides.size(),
                                                   " strides given for the rank ", rank, " shape ",
                                                   ShapeString(spec.shape)));
  }
  TensorView v;
  v.dtype = *spec.dtype;
  v.rank = static_cast<int>(rank);
  bool negative = false;
  for (size_t d = 0; d < rank; ++d) {
    v.shape[d] = spec.shape[d];
    negative |= spec.shape[d] < 0;
  }
  if (!spec.strides.empty()) {
    for (size_t d = 0; d < rank; ++d) v.strides[d] = spec.strides[d];
  } else if (!negative) {  // a negative dim is CheckView's to report, not a stride's
    // On overflow the remaining strides stay 0: such a shape is either empty
    // (nothing is addressed) or has more than 2^63 elements (CheckView says so).
    int64_t stride = 1;
    for (int d = v.rank - 1; d >= 0; --d) {
      v.strides[d] = stride;
      if (__builtin_mul_overflow(stride, v.shape[d], &stride)) break;
    }
  }
  // CheckView insists on data for a non-empty view; the pointer is formed
  // later, so it checks a placeholder that is never dereferenced.
  v.data = &measure_sentinel;
  RETURN_IF_ERROR(kernels::CheckView(v, field));
  v.data = nullptr;
  return v;
}

// Row-major byte size of `shape` x `dtype`, overflow-checked.
absl::StatusOr<uint64_t> RowMajorBytes(DType dtype, const std::vector<int64_t>& shape,
                                       absl::string_view field) {
  for (int64_t n : shape) {
    if (n == 0) return uint64_t{0};
  }
  uint64_t bytes = static_cast<uint64_t>(kernels::ElementSize(dtype));
  for (int64_t n : shape) {
    if (n < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(n), &bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": shape ", ShapeString(shape), " is too large"));
    }
  }
  return bytes;
}

}  // namespace

Resolver::Resolver(Backend* backend, RequestLease* lease, const BufferRegistry* registry,
                   const std::string& session, uint64_t max_inline_bytes,
                   MemoryBudget::Reservation* memory, bool measure_only)
    : backend_(backend),
      lease_(lease),
      registry_(registry),
      session_(session),
      max_inline_bytes_(max_inline_bytes),
      memory_(memory),
      measure_only_(measure_only) {}

Resolver::~Resolver() = default;

absl::StatusOr<TensorView> Resolver::Input(const TensorSpec& spec, absl::string_view field) {
  switch (spec.source) {
    case TensorSpec::Source::kBuffer:
      return BufferView(spec, field);
    case TensorSpec::Source::kInline:
      return InlineView(spec, field);
    case TensorSpec::Source::kNone:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": missing (give a buffer reference or inline data)"));
}

absl::StatusOr<std::optional<TensorView>> Resolver::OptionalInput(
    const std::optional<TensorSpec>& spec, absl::string_view field) {
  if (!spec.has_value()) return std::optional<TensorView>();
  ASSIGN_OR_RETURN(TensorView v, Input(*spec, field));
  return std::optional<TensorView>(v);
}

absl::StatusOr<TensorView> Resolver::InOut(const TensorSpec& spec, absl::string_view field,
                                           absl::string_view result_name) {
  if (spec.source != TensorSpec::Source::kInline) return Input(spec, field);
  const uint64_t bytes = spec.inline_data.size();
  RETURN_IF_ERROR(ReserveInline(result_name, bytes));
  size_t slot = 0;
  ASSIGN_OR_RETURN(TensorView v, InlineView(spec, field, &slot));
  if (measure_only_) return v;
  pending_.push_back(Pending{std::string(result_name), v.dtype, spec.shape, slot, bytes});
  return v;
}

absl::StatusOr<TensorView> Resolver::Output(const std::optional<TensorSpec>& spec,
                                            absl::string_view field, DeriveFn derive) {
  if (spec.has_value()) {
    if (spec->source == TensorSpec::Source::kBuffer) return BufferView(*spec, field);
    if (spec->source == TensorSpec::Source::kInline) {
      return absl::InvalidArgumentError(
          absl::StrCat(field,
                       ": an output cannot carry inline data (give a buffer, or no data to have it "
                       "returned inline)"));
    }
    if (!spec->strides.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": strides given for an inline output (inline is row-major)"));
    }
  }
  ASSIGN_OR_RETURN(OutputShape derived, derive());
  if (spec.has_value() && spec->dtype.has_value() && *spec->dtype != derived.dtype) {
    const bool allowed = derived.index_dtype_choice && kernels::IsIndexDType(*spec->dtype);
    if (!allowed) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": dtype ", kernels::DTypeName(*spec->dtype), " differs from ",
          derived.index_dtype_choice ? "int32|int64" : kernels::DTypeName(derived.dtype),
          " (the dtype this op produces)"));
    }
    derived.dtype = *spec->dtype;
  }
  if (spec.has_value() && !spec->shape.empty() && spec->shape != derived.shape) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": shape ", ShapeString(spec->shape),
                                                   " differs from the shape this op produces, ",
                                                   ShapeString(derived.shape)));
  }
  if (derived.shape.size() > static_cast<size_t>(kernels::kMaxRank)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": rank ", derived.shape.size(), " exceeds ", kernels::kMaxRank));
  }
  ASSIGN_OR_RETURN(uint64_t bytes, RowMajorBytes(derived.dtype, derived.shape, field));
  RETURN_IF_ERROR(ReserveInline(field, bytes));
  if (measure_only_) {
    return TensorView::Contiguous(&measure_sentinel, derived.dtype, derived.shape);
  }
  ASSIGN_OR_RETURN(const RequestLease::Staged staged,
                   Stage(field, StageKind::kOutput, nullptr, bytes));
  pending_.push_back(Pending{std::string(field), derived.dtype, derived.shape, staged.slot, bytes});
  return TensorView::Contiguous(staged.data, derived.dtype, derived.shape);
}

absl::StatusOr<std::vector<InlineOutput>> Resolver::TakeInlineOutputs() {
  if (memory_ != nullptr) RETURN_IF_ERROR(memory_->Grow(inline_output_bytes_, "inline results"));
  std::vector<InlineOutput> outputs;
  outputs.reserve(pending_.size());
  for (Pending& p : pending_) {
    InlineOutput out;
    out.name = std::move(p.name);
    out.dtype = p.dtype;
    out.shape = std::move(p.shape);
    out.data.resize(static_cast<size_t>(p.bytes));
    RETURN_IF_ERROR(lease_->ReadBack(p.slot, out.data.data(), p.bytes));
    outputs.push_back(std::move(out));
  }
  pending_.clear();
  return outputs;
}

absl::Status Resolver::CheckLostBuffers(BufferRegistry* registry) const {
  absl::Status first;
  for (const auto& [name, lease] : leases_) {
    if (!lease->region().faulted()) continue;
    registry->UnregisterIfCurrent(session_, name, lease);
    if (first.ok()) {
      first = absl::FailedPreconditionError(absl::StrCat(
          "buffer '", name,
          "': its memory was lost while the op ran (the owner truncated the "
          "object below the registered size); the op's results are undefined and the buffer "
          "has been unregistered"));
    }
  }
  return first;
}

absl::StatusOr<TensorView> Resolver::BufferView(const TensorSpec& spec, absl::string_view field) {
  ASSIGN_OR_RETURN(TensorView v, MetadataView(spec, field));
  if (measure_only_) {
    buffer_refs_.emplace_back(std::string(field), spec.buffer);
    v.data = &measure_sentinel;
    return v;
  }
  ASSIGN_OR_RETURN(kernels::ByteExtent extent, kernels::ComputeExtent(v, field));
  absl::StatusOr<BufferLease> lease = registry_->Acquire(session_, spec.buffer);
  if (!lease.ok()) {
    return absl::Status(lease.status().code(), absl::StrCat(field, ": ", lease.status().message()));
  }
  const Buffer& buffer = **lease;
  const MappedRegion& region = buffer.region();
  const uint64_t offset = spec.byte_offset;
  const auto size = static_cast<uint64_t>(extent.end);  // >= 0
  if (size > std::numeric_limits<uint64_t>::max() - offset || offset + size > region.size()) {
    return absl::OutOfRangeError(absl::StrCat(field, ": byte_offset ", offset, " + extent ", size,
                                              " exceeds buffer '", spec.buffer, "' size ",
                                              region.size()));
  }
  if (!backend_->CanAccess(region.memory_kind())) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": buffer '", spec.buffer, "' is in ", MemoryKindName(region.memory_kind()),
        " memory, which the ", backend_->name(), " backend cannot access"));
  }
  // The executor routed the op to the device of its buffers (Backend::Route),
  // but the name may have been re-registered on another device since: a
  // kernel must never see memory of a device it does not run on.
  if (const std::string device = region.device_uuid();
      !device.empty() && !backend_->OnDevice(device)) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": buffer '", spec.buffer, "' is on device ", device, ", not on ",
                     backend_->device_label(), ", where this op runs (with its other tensors)"));
  }
  // In the caller's keep first (it outlives the request's lease and the
  // device work): if that cannot allocate, nothing uses the view yet.
  if (keep_ != nullptr) keep_->push_back(*lease);
  v.data = static_cast<char*>(region.data()) + offset;
  leases_.emplace_back(spec.buffer, *std::move(lease));
  return v;
}

absl::StatusOr<TensorView> Resolver::InlineView(const TensorSpec& spec, absl::string_view field,
                                                size_t* slot) {
  if (!spec.strides.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": inline data is row-major; strides must be empty"));
  }
  ASSIGN_OR_RETURN(TensorView v, MetadataView(spec, field));
  ASSIGN_OR_RETURN(uint64_t bytes, RowMajorBytes(v.dtype, spec.shape, field));
  if (spec.inline_data.size() != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": inline data is ", spec.inline_data.size(), " bytes, expected ", bytes, " (shape ",
        ShapeString(spec.shape), " x ", kernels::ElementSize(v.dtype), " bytes of ",
        kernels::DTypeName(v.dtype), ")"));
  }
  if (measure_only_) {
    v.data = &measure_sentinel;
    return v;
  }
  ASSIGN_OR_RETURN(const RequestLease::Staged staged,
                   Stage(field, slot != nullptr ? StageKind::kInOut : StageKind::kInput,
                         spec.inline_data.data(), bytes));
  if (slot != nullptr) *slot = staged.slot;
  v.data = staged.data;
  return v;
}

absl::Status Resolver::ReserveInline(absl::string_view field, uint64_t bytes) {
  // inline_output_bytes_ <= max_inline_bytes_ always: no overflow.
  if (bytes > max_inline_bytes_ - inline_output_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(field, ": returning ", bytes, " bytes inline (", inline_output_bytes_,
                     " bytes already) would exceed max_inline_bytes = ", max_inline_bytes_,
                     "; write the output to a buffer instead"));
  }
  inline_output_bytes_ += bytes;
  ++inline_outputs_;
  return absl::OkStatus();
}

absl::StatusOr<RequestLease::Staged> Resolver::Stage(absl::string_view field, StageKind kind,
                                                     const void* src, uint64_t bytes) {
  if (lease_ == nullptr) {
    return absl::InternalError(absl::StrCat(field, ": staging without a request lease"));
  }
  if (memory_ != nullptr) {
    const uint64_t cost = lease_->StagingCost(bytes);
    // Pooled on a device backend: may reuse a charged idle block, whose
    // charge the request takes over (memory_budget.h).
    RETURN_IF_ERROR(memory_->Grow(cost, absl::StrCat("staging for ", field)));
    staged_bytes_ += cost;
  }
  // The kind is explicit: an empty inline input (a default string_view) has
  // a null data(), and must still be staged as the input it is.
  absl::StatusOr<RequestLease::Staged> staged =
      kind == StageKind::kOutput
          ? lease_->StageOutput(bytes)
          : lease_->StageInput(src, bytes, /*read_back=*/kind == StageKind::kInOut);
  if (!staged.ok()) {
    return absl::Status(staged.status().code(),
                        absl::StrCat(field, ": ", staged.status().message()));
  }
  return *staged;
}

}  // namespace tokensel::core
