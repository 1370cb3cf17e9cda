#include "server/core/request.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <variant>

namespace tokensel::core {
namespace {

struct OpNameVisitor {
  absl::string_view operator()(const SortTokensRequest&) const { return "SortTokens"; }
  absl::string_view operator()(const GatherTokensRequest&) const { return "GatherTokens"; }
  absl::string_view operator()(const ScatterTokensRequest&) const { return "ScatterTokens"; }
  absl::string_view operator()(const GatherBertMaskRequest&) const { return "GatherBertMask"; }
  absl::string_view operator()(const SliceGptMaskRequest&) const { return "SliceGptMask"; }
  absl::string_view operator()(const SegmentSeqlensRequest&) const { return "SegmentSeqlens"; }
  absl::string_view operator()(const SampleTokensRequest&) const { return "SampleTokens"; }
  absl::string_view operator()(const TopKTokensRequest&) const { return "TopKTokens"; }
};

uint64_t SaturatingAdd(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

uint64_t SaturatingMul(uint64_t a, uint64_t b) {
  return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

uint64_t NonNegative(int64_t v) { return v > 0 ? static_cast<uint64_t>(v) : 0; }

// Sums product(shape) over the tensors handed to Add.
class WorkSum {
 public:
  void Add(const TensorSpec& t) {
    uint64_t n = 1;
    for (const int64_t d : t.shape) n = SaturatingMul(n, NonNegative(d));
    total_ = SaturatingAdd(total_, n);
  }
  void Add(const std::optional<TensorSpec>& t) {
    if (t.has_value()) Add(*t);
  }
  template <typename... Ts>
  void AddAll(const Ts&... tensors) {
    (Add(tensors), ...);
  }
  void AddScalar(uint64_t work) { total_ = SaturatingAdd(total_, work); }
  uint64_t total() const { return total_; }

 private:
  uint64_t total_ = 0;
};

uint64_t Elements(const TensorSpec& t) {
  uint64_t n = 1;
  for (const int64_t d : t.shape) n = SaturatingMul(n, NonNegative(d));
  return n;
}

// shape[axis], or 0 when the spec has no such dim (invalid: the op fails).
uint64_t Dim(const TensorSpec& t, size_t axis) {
  return axis < t.shape.size() ? NonNegative(t.shape[axis]) : 0;
}

uint64_t Rows(const TensorSpec& t) {
  uint64_t n = 1;
  for (size_t i = 0; i + 1 < t.shape.size(); ++i) n = SaturatingMul(n, NonNegative(t.shape[i]));
  return n;
}

// A bitmap of S bits per row (the CUDA kernels' duplicate checks).
uint64_t BitmapWork(uint64_t rows, int64_t s) {
  return SaturatingMul(rows, NonNegative(s) / 64 + 1);
}

struct WorkVisitor {
  WorkSum* sum;
  void operator()(const SortTokensRequest& r) const {
    sum->AddAll(r.ids, r.out, r.inverse);
    sum->AddScalar(BitmapWork(Rows(r.ids), r.original_tokens));
  }
  // The copies touch what they write (and as much again to read), not their
  // whole inputs: [B,S,C] activations of which R rows are gathered cost
  // B*R*C, whatever S is.
  void operator()(const GatherTokensRequest& r) const {
    sum->Add(r.indices);
    sum->AddScalar(SaturatingMul(Elements(r.indices), Dim(r.activations, 2)));
  }
  void operator()(const ScatterTokensRequest& r) const {
    sum->AddAll(r.layer, r.indices);
    const size_t seq_axis = r.batch_first ? 1 : 0;
    if (r.all.shape.size() > seq_axis) {
      sum->AddScalar(BitmapWork(Rows(r.indices), r.all.shape[seq_axis]));
    }
  }
  // out [L,B,H,R,R] = indices [L,B,R] x H x R.
  void operator()(const GatherBertMaskRequest& r) const {
    sum->Add(r.indices);
    sum->AddScalar(SaturatingMul(SaturatingMul(Elements(r.indices), Dim(r.mask, 1)),
                                 Dim(r.indices, 2)));
  }
  // out [B,H,R,R]: R from `out` when given, else retained_tokens.
  void operator()(const SliceGptMaskRequest& r) const {
    const uint64_t retained = r.out.has_value() && r.out->shape.size() == 4
                                  ? NonNegative(r.out->shape[3])
                                  : NonNegative(r.retained_tokens);
    sum->AddScalar(SaturatingMul(SaturatingMul(Dim(r.mask, 0), Dim(r.mask, 1)),
                                 SaturatingMul(retained, retained)));
  }
  void operator()(const SegmentSeqlensRequest& r) const {
    sum->AddAll(r.segment_ids_q, r.segment_pos_q, r.segment_ids_kv, r.segment_pos_kv, r.q_seqlen,
                r.q_offset, r.kv_seqlen, r.kv_offset, r.q_packed_seqlens, r.q_packed_offsets,
                r.q_cu_seqlens, r.kv_packed_seqlens, r.kv_packed_offsets, r.kv_cu_seqlens);
    // Outputs and staging are O(NS) per row and side, whether or not the
    // request spells out the outputs' shapes.
    const uint64_t batch = r.segment_ids_q.shape.empty() ? 0 : NonNegative(r.segment_ids_q.shape[0]);
    const uint64_t sides = r.segment_ids_kv.has_value() ? 2 : 1;
    sum->AddScalar(SaturatingMul(SaturatingMul(batch, sides),
                                 SaturatingAdd(NonNegative(r.max_segments), 1)));
  }
  void operator()(const SampleTokensRequest& r) const {
    sum->AddAll(r.ids, r.inverse, r.mask, r.bert_mask, r.gpt_mask);
    sum->AddScalar(SaturatingMul(SaturatingMul(NonNegative(r.layers), NonNegative(r.batch)),
                                 std::max<uint64_t>(NonNegative(r.original_tokens), 1)));
  }
  void operator()(const TopKTokensRequest& r) const { sum->AddAll(r.scores, r.ids); }
};

}  // namespace

absl::string_view OpName(const OpRequest& op) { return std::visit(OpNameVisitor{}, op); }

uint64_t EstimateOpWork(const OpRequest& op) {
  WorkSum sum;
  std::visit(WorkVisitor{&sum}, op);
  return sum.total();
}

}  // namespace tokensel::core
