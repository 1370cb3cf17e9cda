// Executor: one function per op resolves the request's tensors (resolve.h),
// runs the op on the backend (timed: op_duration covers Backend::Run only)
// and reports the bytes it moved (the per-op formulas are in output_shapes.h).
//
// In-place ops on inline data return the written tensor inline: SortTokens
// with inline ids and no `out` returns the sorted ids as "out"; ScatterTokens
// with inline `all` returns "all". Absent optional outputs: GatherTokens /
// GatherBertMask / SliceGptMask `out`, SampleTokens / TopKTokens `ids` and
// every SegmentSeqlens output that applies are returned inline; SortTokens
// `out` absent means in place; the other optional outputs (inverse,
// bert_mask, gpt_mask) are computed only when present.
#include "server/core/executor.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/core/output_shapes.h"
#include "server/core/resolve.h"
#include "server/core/service_metrics.h"

namespace tokensel::core {
namespace {

using kernels::TensorView;

// What every per-op function needs: the resolver and a timed backend call
// whose scratch is reserved first. In measure mode nothing runs.
struct OpContext {
  Resolver& resolver;
  Backend& backend;
  MemoryBudget::Reservation* memory;  // null in measure mode
  const kernels::StopToken* stop;
  absl::string_view op_name;
  double seconds = 0;
  uint64_t bytes = 0;

  template <typename Args>
  absl::Status Run(const Args& args) {
    if (memory == nullptr) return absl::OkStatus();  // measuring
    const uint64_t scratch = backend.ScratchBytes(args);
    RETURN_IF_ERROR(memory->Grow(scratch, absl::StrCat("scratch of ", op_name)));
    kernels::ScopedStopToken scope(stop);
    RETURN_IF_ERROR(kernels::CheckStop());
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = backend.Run(args);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    memory->Shrink(scratch);
    return status;
  }
};

uint64_t OptBytes(const std::optional<TensorView>& v) { return v ? ViewBytes(*v) : 0; }

absl::Status RunOp(OpContext& ctx, const SortTokensRequest& req) {
  Resolver& r = ctx.resolver;
  kernels::SortTokensArgs args;
  // Without `out` the ids are sorted in place; inline ids come back as "out".
  if (req.out.has_value()) {
    ASSIGN_OR_RETURN(args.ids, r.Input(req.ids, "ids"));
    ASSIGN_OR_RETURN(args.out, r.Output(req.out, "out", [&] { return SortOutShape(args.ids); }));
  } else {
    ASSIGN_OR_RETURN(args.ids, r.InOut(req.ids, "ids", "out"));
  }
  args.original_tokens = req.original_tokens;
  if (req.inverse.has_value()) {
    ASSIGN_OR_RETURN(args.inverse, r.Output(req.inverse, "inverse", [&] {
      return SortInverseShape(args.ids, req.original_tokens);
    }));
  }
  RETURN_IF_ERROR(ctx.Run(args));
  ctx.bytes = 2 * ViewBytes(args.ids) + OptBytes(args.inverse);
  return absl::OkStatus();
}

absl::Status RunOp(OpContext& ctx, const GatherTokensRequest& req) {
  Resolver& r = ctx.resolver;
  kernels::GatherTokensArgs args;
  args.batch_first = req.batch_first;
  ASSIGN_OR_RETURN(args.activations, r.Input(req.activations, "activations"));
  ASSIGN_OR_RETURN(args.indices, r.Input(req.indices, "indices"));
  ASSIGN_OR_RETURN(args.out, r.Output(req.out, "out", [&] {
    return GatherOutShape(args.activations, args.indices, req.batch_first);
  }));
  RETURN_IF_ERROR(ctx.Run(args));
  ctx.bytes = ViewBytes(args.indices) + 2 * ViewBytes(args.out);
  return absl::OkStatus();
}

absl::Status RunOp(OpContext& ctx, const ScatterTokensRequest& req) {
  Resolver& r = ctx.resolver;
  kernels::ScatterTokensArgs args;
  args.batch_first = req.batch_first;
  ASSIGN_OR_RETURN(args.all, r.InOut(req.all, "all", "all"));
  ASSIGN_OR_RETURN(args.layer, r.Input(req.layer, "layer"));
  ASSIGN_OR_RETURN(args.indices, r.Input(req.indices, "indices"));
  RETURN_IF_ERROR(ctx.Run(args));
  ctx.bytes = ViewBytes(args.indices) + 2 * ViewBytes(args.layer);
  return absl::OkStatus();
}

absl::Status RunOp(OpContext& ctx, const GatherBertMaskRequest& req) {
  Resolver& r = ctx.resolver;
  kernels::GatherBertMaskArgs args;
  ASSIGN_OR_RETURN(args.mask, r.Input(req.mask, "mask"));
  ASSIGN_OR_RETURN(args.indices, r.Input(req.indices, "indices"));
  ASSIGN_OR_RETURN(args.out, r.Output(req.out, "out",
                                      [&] { return BertMaskOutShape(args.mask, args.indices); }));
  RETURN_IF_ERROR(ctx.Run(args));
  ctx.bytes = ViewBytes(args.indices) + 2 * ViewBytes(args.out);
  return absl::OkStatus();
}

absl::Status RunOp(OpContext& ctx, const SliceGptMaskRequest& req) {
  Resolver& r = ctx.resolver;
  kernels::SliceGptMaskArgs args;
  ASSIGN_OR_RETURN(args.mask, r.Input(req.mask, "mask"));
  ASSIGN_OR_RETURN(args.out, r.Output(req.out, "out", [&] {
    return GptMaskOutShape(args.mask, req.retained_tokens);
  }));
  // With `out` in a buffer R comes from its shape; a retained_tokens given
  // as well must agree.
  if (req.retained_tokens != 0 && args.out.rank == 4 && args.out.shape[3] != req.retained_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("retained_tokens: ", req.retained_tokens,
                     " differs from out dim 3 (R) = ", args.out.shape[3]));
  }
  RETURN_IF_ERROR(ctx.Run(args));
  ctx.bytes = 2 * ViewBytes(args.out);
  return absl::OkStatus();
}

// An output the request may not carry (kv outputs without kv inputs, packed
// outputs without `packed`): a buffer or data there is an error.
absl::Status NotApplicable(const std::optional<TensorSpec>& spec, absl::string_view field,
                           absl::string_view why) {
  if (!spec.has_value() || spec->source == TensorSpec::Source::kNone) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": given, but ", why));
}

struct SegmentSideSpecs {
  const std::optional<TensorSpec>& seqlen;
  const std::optional<TensorSpec>& offset;
  const std::optional<TensorSpec>& packed_seqlens;
  const std::optional<TensorSpec>& packed_offsets;
  const std::optional<TensorSpec>& cu_seqlens;
};

absl::StatusOr<kernels::SegmentSeqlensSide> ResolveSegmentSide(Resolver& r,
                                                               const SegmentSeqlensRequest& req,
                                                               const TensorView& ids_q,
                                                               const SegmentSideSpecs& specs,
                                                               absl::string_view prefix) {
  auto output = [&](const std::optional<TensorSpec>& spec, absl::string_view suffix,
                    SegmentOutput which) {
    return r.Output(spec, absl::StrCat(prefix, suffix),
                    [&] { return SegmentOutShape(which, ids_q, req.max_segments); });
  };
  kernels::SegmentSeqlensSide side;
  ASSIGN_OR_RETURN(side.seqlen, output(specs.seqlen, "_seqlen", SegmentOutput::kSeqlen));
  ASSIGN_OR_RETURN(side.offset, output(specs.offset, "_offset", SegmentOutput::kOffset));
  if (req.packed) {
    kernels::PackedSeqlens packed;
    ASSIGN_OR_RETURN(packed.seqlens, output(specs.packed_seqlens, "_packed_seqlens",
                                            SegmentOutput::kPackedSeqlens));
    ASSIGN_OR_RETURN(packed.offsets, output(specs.packed_offsets, "_packed_offsets",
                                            SegmentOutput::kPackedOffsets));
    ASSIGN_OR_RETURN(packed.cu_seqlens,
                     output(specs.cu_seqlens, "_cu_seqlens", SegmentOutput::kCuSeqlens));
    side.packed = packed;
  } else {
    constexpr absl::string_view kWhy = "packed is false";
    RETURN_IF_ERROR(
        NotApplicable(specs.packed_seqlens, absl::StrCat(prefix, "_packed_seqlens"), kWhy));
    RETURN_IF_ERROR(
        NotApplicable(specs.packed_offsets, absl::StrCat(prefix, "_packed_offsets"), kWhy));
    RETURN_IF_ERROR(NotApplicable(specs.cu_seqlens, absl::StrCat(prefix, "_cu_seqlens"), kWhy));
  }
  return side;
}

uint64_t SideBytes(const kernels::SegmentSeqlensSide& side) {
  uint64_t bytes = ViewBytes(side.seqlen) + ViewBytes(side.offset);
  if (side.packed) {
    bytes += ViewBytes(side.packed->seqlens) + ViewBytes(side.packed->offsets) +
             ViewBytes(side.packed->cu_seqlens);
  }
  return bytes;
}

absl::Status RunOp(OpContext& ctx, const SegmentSeqlensRequest& req) {
  Resolver& r = ctx.resolver;
  kernels::SegmentSeqlensArgs args;
  args.max_segments = req.max_segments;
  args.mask = req.mask;
  ASSIGN_OR_RETURN(args.segment_ids_q, r.Input(req.segment_ids_q, "segment_ids_q"));
  ASSIGN_OR_RETURN(args.segment_pos_q, r.OptionalInput(req.segment_pos_q, "segment_pos_q"));
  ASSIGN_OR_RETURN(args.segment_ids_kv, r.OptionalInput(req.segment_ids_kv, "segment_ids_kv"));
  ASSIGN_OR_RETURN(args.segment_pos_kv, r.OptionalInput(req.segment_pos_kv, "segment_pos_kv"));
  ASSIGN_OR_RETURN(args.q, ResolveSegmentSide(r, req, args.segment_ids_q,
                                              {req.q_seqlen, req.q_offset, req.q_packed_seqlens,
                                               req.q_packed_offsets, req.q_cu_seqlens},
                                              "q"));
  if (args.segment_ids_kv.has_value()) {
    ASSIGN_OR_RETURN(args.kv,
                     ResolveSegmentSide(r, req, args.segment_ids_q,
                                        {req.kv_seqlen, req.kv_offset, req.kv_packed_seqlens,
                                         req.kv_packed_offsets, req.kv_cu_seqlens},
                                        "kv"));
  } else {
    constexpr absl::string_view kWhy = "segment_ids_kv is absent (self-attention)";
    const std::pair<const std::optional<TensorSpec>*, absl::string_view> kv_outputs[] = {
        {&req.kv_seqlen, "kv_seqlen"},
        {&req.kv_offset, "kv_offset"},
        {&req.kv_packed_seqlens, "kv_packed_seqlens"},
        {&req.kv_packed_offsets, "kv_packed_offsets"},
        {&req.kv_cu_seqlens, "kv_cu_seqlens"}};
    for (const auto& [spec, name] : kv_outputs) RETURN_IF_ERROR(NotApplicable(*spec, name, kWhy));
  }
  RETURN_IF_ERROR(ctx.Run(args));
  ctx.bytes = ViewBytes(args.segment_ids_q) + OptBytes(args.segment_pos_q) +
              OptBytes(args.segment_ids_kv) + OptBytes(args.segment_pos_kv) + SideBytes(args.q) +
              (args.kv ? SideBytes(*args.kv) : 0);
  return absl::OkStatus();
}

absl::Status RunOp(OpContext& ctx, const SampleTokensRequest& req) {
  Resolver& r = ctx.resolver;
  kernels::SampleTokensArgs args;
  args.layers = req.layers;
  args.batch = req.batch;
  args.original_tokens = req.original_tokens;
  args.retained_tokens = req.retained_tokens;
  args.seed = req.seed;
  args.step = req.step;
  ASSIGN_OR_RETURN(args.mask, r.OptionalInput(req.mask, "mask"));
  ASSIGN_OR_RETURN(args.ids, r.Output(req.ids, "ids", [&] {
    return SampleIdsShape(req.layers, req.batch, req.retained_tokens);
  }));
  if (req.inverse.has_value()) {
    ASSIGN_OR_RETURN(args.inverse, r.Output(req.inverse, "inverse", [&] {
      return SampleInverseShape(req.layers, req.batch, req.original_tokens);
    }));
  }
  if (req.bert_mask.has_value()) {
    ASSIGN_OR_RETURN(args.bert_mask, r.Output(req.bert_mask, "bert_mask", [&] {
      return SampleBertMaskShape(req.layers, req.batch, req.retained_tokens, args.mask);
    }));
  }
  if (req.gpt_mask.has_value()) {
    ASSIGN_OR_RETURN(args.gpt_mask, r.Output(req.gpt_mask, "gpt_mask", [&] {
      return SampleGptMaskShape(req.batch, req.retained_tokens, args.mask);
    }));
  }
  RETURN_IF_ERROR(ctx.Run(args));
  ctx.bytes = ViewBytes(args.ids) + OptBytes(args.inverse) + 2 * OptBytes(args.bert_mask) +
              2 * OptBytes(args.gpt_mask);
  return absl::OkStatus();
}

absl::Status RunOp(OpContext& ctx, const TopKTokensRequest& req) {
  Resolver& r = ctx.resolver;
  kernels::TopKTokensArgs args;
  ASSIGN_OR_RETURN(args.scores, r.Input(req.scores, "scores"));
  ASSIGN_OR_RETURN(args.ids, r.Output(req.ids, "ids", [&] {
    return TopKIdsShape(args.scores, req.retained_tokens);
  }));
  RETURN_IF_ERROR(ctx.Run(args));
  ctx.bytes = ViewBytes(args.scores) + ViewBytes(args.ids);
  return absl::OkStatus();
}

}  // namespace

Executor::Executor(Backend* backend, BufferRegistry* registry, ServiceMetrics* metrics,
                   ExecutorLimits limits, MemoryBudget* budget)
    : backend_(backend),
      registry_(registry),
      metrics_(metrics),
      limits_(limits),
      budget_(budget) {}

absl::StatusOr<OpResult> Executor::Run(const std::string& session, const OpRequest& op,
                                       const RunOptions& options) {
  if (limits_.max_op_work != 0) {
    if (const uint64_t work = EstimateOpWork(op); work > limits_.max_op_work) {
      return absl::ResourceExhaustedError(absl::StrCat(
          OpName(op), ": about ", work, " elements of work (what it reads and writes), above the ",
          "per-op limit of ", limits_.max_op_work, " (--max_op_elements)"));
    }
  }
  MemoryBudget::Reservation own = budget_ != nullptr ? budget_->Open() : MemoryBudget::Reservation();
  MemoryBudget::Reservation* memory = options.memory != nullptr ? options.memory : &own;
  OpResult result;
  uint64_t staged = 0;
  {
    Resolver resolver(backend_, registry_, session, limits_.max_inline_bytes, memory);
    OpContext ctx{resolver, *backend_, memory, options.stop, OpName(op)};
    absl::Status status = std::visit([&](const auto& req) { return RunOp(ctx, req); }, op);
    // Lost memory outranks whatever the op reported: its inputs were zeros.
    if (absl::Status lost = resolver.CheckLostBuffers(registry_); !lost.ok()) status = lost;
    if (status.ok()) {
      absl::StatusOr<std::vector<InlineOutput>> outputs = resolver.TakeInlineOutputs();
      if (outputs.ok()) {
        result.outputs = *std::move(outputs);
      } else {
        status = outputs.status();
      }
    }
    staged = resolver.staged_bytes();
    result.bytes_moved = ctx.bytes;
    if (status.ok() && metrics_ != nullptr) metrics_->ObserveOp(OpName(op), ctx.seconds, ctx.bytes);
    if (!status.ok()) {
      memory->Shrink(staged);
      return status;
    }
  }
  memory->Shrink(staged);  // the staging died with the resolver
  return result;
}

uint64_t Executor::InlineOutputBytes(const OpRequest& op) const {
  static const std::string kNoSession;
  Resolver resolver(backend_, registry_, kNoSession, limits_.max_inline_bytes, nullptr,
                    /*measure_only=*/true);
  OpContext ctx{resolver, *backend_, nullptr, nullptr, OpName(op)};
  const absl::Status status = std::visit([&](const auto& req) { return RunOp(ctx, req); }, op);
  return status.ok() ? resolver.inline_output_bytes() : 0;
}

absl::StatusOr<std::vector<OpResult>> Executor::RunAll(const std::string& session,
                                                       absl::Span<const OpRequest> ops,
                                                       const RunOptions& options) {
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
  MemoryBudget::Reservation own = budget_ != nullptr ? budget_->Open() : MemoryBudget::Reservation();
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
