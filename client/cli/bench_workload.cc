#include "client/cli/bench_workload.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/op_util.h"
#include "common/status_macros.h"
#include "kernels/sample_math.h"
#include "tokensel/client/tensor_ref.h"

namespace tokensel::cli {
namespace {

using kernels::DType;

constexpr absl::string_view kOpNames[kNumBenchOps] = {
    "ping", "gather", "scatter", "sort", "seqlens", "topk", "sample", "merge", "split", "packed"};

// Lays tensors out in a future shm region (by reference) or inlines them.
class TensorBuilder {
 public:
  TensorBuilder(bool by_reference, std::string buffer)
      : by_reference_(by_reference), buffer_(std::move(buffer)) {}

  v1::Tensor Input(DType dtype, std::vector<int64_t> shape, std::string bytes) {
    if (!by_reference_) {
      return client::TensorRef::Inline(std::move(bytes))
          .Dtype(ToProto(dtype))
          .Shape(shape)
          .ToProto();
    }
    const uint64_t offset = Alloc(bytes.size());
    pending_.emplace_back(offset, std::move(bytes));
    return Ref(offset, dtype, std::move(shape));
  }
  v1::Tensor Output(DType dtype, std::vector<int64_t> shape) {
    if (!by_reference_) return client::TensorRef::InlineOutput().ToProto();
    int64_t n = kernels::ElementSize(dtype);
    for (int64_t d : shape) n *= d;
    return Ref(Alloc(static_cast<uint64_t>(n)), dtype, std::move(shape));
  }
  uint64_t size() const { return std::max<uint64_t>(next_, 64); }
  void CopyInto(uint8_t* base) const {
    for (const auto& [offset, bytes] : pending_)
      std::memcpy(base + offset, bytes.data(), bytes.size());
  }

 private:
  uint64_t Alloc(uint64_t bytes) {
    const uint64_t offset = next_;
    next_ = (next_ + bytes + 63) / 64 * 64;
    return offset;
  }
  v1::Tensor Ref(uint64_t offset, DType dtype, std::vector<int64_t> shape) const {
    return client::TensorRef::InBuffer(buffer_, offset)
        .Dtype(ToProto(dtype))
        .Shape(std::move(shape))
        .ToProto();
  }

  bool by_reference_;
  std::string buffer_;
  uint64_t next_ = 0;
  std::vector<std::pair<uint64_t, std::string>> pending_;
};

std::string RandomBytes(int64_t n, std::mt19937_64& rng) {
  std::string s(static_cast<size_t>(n), '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  std::string s(v.size() * sizeof(T), '\0');
  if (!v.empty()) std::memcpy(s.data(), v.data(), s.size());
  return s;
}

// `rows` rows of `r` distinct ids in [0, s); sorted or shuffled.
std::vector<int32_t> DistinctRows(int64_t rows, int64_t r, int64_t s, bool sorted,
                                  std::mt19937_64& rng) {
  std::vector<int32_t> out;
  std::vector<int32_t> perm(static_cast<size_t>(s));
  for (int64_t row = 0; row < rows; ++row) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = 0; i < r; ++i) {
      std::uniform_int_distribution<int64_t> pick(i, s - 1);
      std::swap(perm[i], perm[pick(rng)]);
    }
    if (sorted) std::sort(perm.begin(), perm.begin() + r);
    out.insert(out.end(), perm.begin(), perm.begin() + r);
  }
  return out;
}

}  // namespace

absl::string_view BenchOpName(BenchOp op) { return kOpNames[static_cast<int>(op)]; }

absl::StatusOr<BenchOp> ParseBenchOp(absl::string_view name) {
  for (int i = 0; i < kNumBenchOps; ++i) {
    if (kOpNames[i] == name) return static_cast<BenchOp>(i);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown op '", name,
                   "' (ops: ping gather scatter sort seqlens topk sample merge split packed)"));
}

absl::StatusOr<std::vector<BenchOp>> ParseMix(absl::string_view mix) {
  std::vector<std::pair<BenchOp, int64_t>> weights;
  for (absl::string_view part : absl::StrSplit(mix, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(part, ':');
    ASSIGN_OR_RETURN(BenchOp op, ParseBenchOp(kv.first));
    int64_t w = 1;
    if (!kv.second.empty() && (!absl::SimpleAtoi(kv.second, &w) || w < 1 || w > 1000)) {
      return absl::InvalidArgumentError(absl::StrCat("bad weight in '", part, "' (1..1000)"));
    }
    weights.emplace_back(op, w);
  }
  if (weights.empty()) return absl::InvalidArgumentError("empty op mix");
  // Smooth weighted round-robin: each slot picks the op with the largest
  // accumulated credit.
  int64_t total = 0;
  for (const auto& [op, w] : weights) total += w;
  std::vector<int64_t> credit(weights.size(), 0);
  std::vector<BenchOp> sequence;
  for (int64_t slot = 0; slot < total; ++slot) {
    size_t best = 0;
    for (size_t i = 0; i < weights.size(); ++i) {
      credit[i] += weights[i].second;
      if (credit[i] > credit[best]) best = i;
    }
    credit[best] -= total;
    sequence.push_back(weights[best].first);
  }
  return sequence;
}

absl::StatusOr<std::unique_ptr<Workload>> Workload::Create(const std::vector<BenchOp>& ops,
                                                           const BenchShapes& sh, int worker,
                                                           uint64_t seed, bool by_reference,
                                                           client::Session* session) {
  if (sh.batch < 1 || sh.seq < 1 || sh.retained < 1 || sh.retained > sh.seq || sh.channels < 1 ||
      sh.layers < 1 || sh.segments < 1 || sh.segments > sh.seq) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shapes need B, S, R, C, L, NS >= 1, R <= S and NS <= S (B=", sh.batch, " S=", sh.seq,
        " R=", sh.retained, " C=", sh.channels, " L=", sh.layers, " NS=", sh.segments, ")"));
  }
  std::unique_ptr<Workload> w(new Workload());
  w->by_reference_ = by_reference;
  const std::string buffer = absl::StrCat("bench-w", worker);
  TensorBuilder tb(by_reference, buffer);
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(worker));
  const int64_t B = sh.batch, S = sh.seq, R = sh.retained, C = sh.channels, L = sh.layers;
  const int64_t NS = sh.segments, es = kernels::ElementSize(sh.dtype);
  auto has = [&](BenchOp op) { return std::find(ops.begin(), ops.end(), op) != ops.end(); };

  if (has(BenchOp::kGather)) {
    *w->gather_.mutable_activations() =
        tb.Input(sh.dtype, {B, S, C}, RandomBytes(B * S * C * es, rng));
    *w->gather_.mutable_indices() =
        tb.Input(DType::kInt32, {B, R}, Bytes(DistinctRows(B, R, S, true, rng)));
    *w->gather_.mutable_out() = tb.Output(sh.dtype, {B, R, C});
    w->gather_.set_batch_first(true);
    w->bytes_[static_cast<int>(BenchOp::kGather)] = 2 * B * R * C * es + B * R * 4;
  }
  if (has(BenchOp::kScatter)) {
    *w->scatter_.mutable_all() = tb.Input(sh.dtype, {B, S, C}, RandomBytes(B * S * C * es, rng));
    *w->scatter_.mutable_layer() = tb.Input(sh.dtype, {B, R, C}, RandomBytes(B * R * C * es, rng));
    *w->scatter_.mutable_indices() =
        tb.Input(DType::kInt32, {B, R}, Bytes(DistinctRows(B, R, S, true, rng)));
    w->scatter_.set_batch_first(true);
    w->bytes_[static_cast<int>(BenchOp::kScatter)] = 2 * B * R * C * es + B * R * 4;
  }
  if (has(BenchOp::kMerge)) {  // out of place: every row of out written once
    *w->merge_.mutable_x() = tb.Input(sh.dtype, {B, S, C}, RandomBytes(B * S * C * es, rng));
    *w->merge_.mutable_layer() = tb.Input(sh.dtype, {B, R, C}, RandomBytes(B * R * C * es, rng));
    *w->merge_.mutable_indices() =
        tb.Input(DType::kInt32, {B, R}, Bytes(DistinctRows(B, R, S, true, rng)));
    *w->merge_.mutable_out() = tb.Output(sh.dtype, {B, S, C});
    w->merge_.set_batch_first(true);
    w->bytes_[static_cast<int>(BenchOp::kMerge)] = 2 * B * S * C * es + B * R * 4;
  }
  if (has(BenchOp::kSplit)) {
    *w->split_.mutable_grad() = tb.Input(sh.dtype, {B, S, C}, RandomBytes(B * S * C * es, rng));
    *w->split_.mutable_indices() =
        tb.Input(DType::kInt32, {B, R}, Bytes(DistinctRows(B, R, S, true, rng)));
    *w->split_.mutable_layer_grad() = tb.Output(sh.dtype, {B, R, C});
    *w->split_.mutable_rest_grad() = tb.Output(sh.dtype, {B, S, C});
    w->split_.set_batch_first(true);
    w->bytes_[static_cast<int>(BenchOp::kSplit)] = 2 * B * (S + R) * C * es + B * R * 4;
  }
  if (has(BenchOp::kSort)) {
    *w->sort_.mutable_ids() =
        tb.Input(DType::kInt32, {L, B, R}, Bytes(DistinctRows(L * B, R, S, false, rng)));
    w->sort_.set_original_tokens(S);
    *w->sort_.mutable_out() = tb.Output(DType::kInt32, {L, B, R});
    w->bytes_[static_cast<int>(BenchOp::kSort)] = 2 * L * B * R * 4;
  }
  if (has(BenchOp::kSeqlens)) {
    // NS runs over the first 7/8 of each row (random cut points), then padding.
    std::vector<int32_t> seg(static_cast<size_t>(B * S), 0);
    const int64_t used = std::max<int64_t>(NS, S * 7 / 8);
    for (int64_t b = 0; b < B; ++b) {
      std::vector<int32_t> cuts = DistinctRows(1, NS - 1, used - 1, true, rng);
      int64_t start = 0;
      for (int64_t k = 0; k < NS; ++k) {
        const int64_t end = k + 1 < NS ? cuts[static_cast<size_t>(k)] + 1 : used;
        for (int64_t t = start; t < end; ++t)
          seg[static_cast<size_t>(b * S + t)] = static_cast<int32_t>(k + 1);
        start = end;
      }
    }
    auto& q = w->seqlens_;
    *q.mutable_segment_ids_q() = tb.Input(DType::kInt32, {B, S}, Bytes(seg));
    q.set_max_segments(NS);
    q.set_mask(v1::ATTN_MASK_CAUSAL);
    q.set_packed(true);
    *q.mutable_q_seqlen() = tb.Output(DType::kInt32, {B, NS});
    *q.mutable_q_offset() = tb.Output(DType::kInt32, {B, NS + 1});
    *q.mutable_q_packed_seqlens() = tb.Output(DType::kInt32, {B * NS});
    *q.mutable_q_packed_offsets() = tb.Output(DType::kInt32, {B * (NS + 1)});
    *q.mutable_q_cu_seqlens() = tb.Output(DType::kInt32, {B * NS + 1});
    w->bytes_[static_cast<int>(BenchOp::kSeqlens)] =
        4 * (B * S + 2 * B * NS + 2 * B * (NS + 1) + B * NS + 1);
  }
  if (has(BenchOp::kTopK)) {
    std::vector<float> scores(static_cast<size_t>(B * S));
    std::uniform_real_distribution<float> u(-4.0f, 4.0f);
    for (float& f : scores) f = u(rng);
    *w->topk_.mutable_scores() = tb.Input(DType::kFloat32, {B, S}, Bytes(scores));
    w->topk_.set_retained_tokens(R);
    *w->topk_.mutable_ids() = tb.Output(DType::kInt32, {B, R});
    w->bytes_[static_cast<int>(BenchOp::kTopK)] = B * S * 4 + B * R * 4;
  }
  if (has(BenchOp::kSample)) {
    auto& s = w->sample_;
    s.set_layers(L);
    s.set_batch(B);
    s.set_original_tokens(S);
    s.set_retained_tokens(R);
    s.set_seed(seed);
    s.set_step(static_cast<uint64_t>(worker));
    *s.mutable_ids() = tb.Output(DType::kInt32, {L, B, R});
    w->bytes_[static_cast<int>(BenchOp::kSample)] = L * B * R * 4;
  }
  if (has(BenchOp::kPacked)) {
    // B*NS sequences with random boundaries over T = B*S tokens (no padding).
    const int64_t T = B * S, N = B * NS;
    std::vector<int32_t> cu(static_cast<size_t>(N + 1), 0);
    if (N > 1) {
      const std::vector<int32_t> cuts = DistinctRows(1, N - 1, T - 1, true, rng);
      for (int64_t i = 1; i < N; ++i)
        cu[static_cast<size_t>(i)] = cuts[static_cast<size_t>(i - 1)] + 1;
    }
    cu[static_cast<size_t>(N)] = static_cast<int32_t>(T);
    int64_t kept = 0;
    for (int64_t i = 0; i < N; ++i) {
      kept +=
          kernels::PackedKeep(cu[static_cast<size_t>(i + 1)] - cu[static_cast<size_t>(i)], R, S, 0);
    }
    auto& p = w->packed_;
    *p.mutable_cu_seqlens() = tb.Input(DType::kInt32, {N + 1}, Bytes(cu));
    *p.mutable_activations() = tb.Input(sh.dtype, {T, C}, RandomBytes(T * C * es, rng));
    p.set_total_tokens(T);
    p.set_kept_tokens(kept);
    p.set_keep_num(R);
    p.set_keep_den(S);
    p.set_layers(1);
    p.set_seed(seed);
    p.set_step(static_cast<uint64_t>(worker));
    *p.mutable_cu_seqlens_kept() = tb.Output(DType::kInt32, {N + 1});
    *p.mutable_ids() = tb.Output(DType::kInt32, {1, kept});
    *p.mutable_positions() = tb.Output(DType::kInt32, {1, kept});
    *p.mutable_out() = tb.Output(sh.dtype, {kept, C});
    w->bytes_[static_cast<int>(BenchOp::kPacked)] = 8 * (N + 1) + 8 * kept + 2 * kept * C * es;
  }
  if (by_reference) {
    if (session == nullptr) return absl::InvalidArgumentError("by reference needs a session");
    ASSIGN_OR_RETURN(client::SharedRegion region,
                     client::SharedRegion::CreateSealed(
                         client::SharedRegion::UniqueName("", buffer), tb.size()));
    tb.CopyInto(region.data());
    RETURN_IF_ERROR(session->RegisterBuffer(region.RegisterRequest(buffer)).status());
    w->region_.emplace(std::move(region));
  }
  return w;
}

absl::Status Workload::Run(BenchOp op, const client::Client& client) const {
  absl::StatusOr<v1::OpResponse> resp;
  switch (op) {
    case BenchOp::kPing:
      return client.Ping();
    case BenchOp::kGather:
      resp = client.GatherTokens(gather_);
      break;
    case BenchOp::kScatter:
      resp = client.ScatterTokens(scatter_);
      break;
    case BenchOp::kSort:
      resp = client.SortTokens(sort_);
      break;
    case BenchOp::kSeqlens:
      resp = client.SegmentSeqlens(seqlens_);
      break;
    case BenchOp::kTopK:
      resp = client.TopKTokens(topk_);
      break;
    case BenchOp::kSample:
      resp = client.SampleTokens(sample_);
      break;
    case BenchOp::kMerge:
      resp = client.MergeTokens(merge_);
      break;
    case BenchOp::kSplit:
      resp = client.SplitTokens(split_);
      break;
    case BenchOp::kPacked:
      resp = client.SamplePackedTokens(packed_);
      break;
  }
  if (!resp.ok()) return resp.status();
  if (!by_reference_ && resp->outputs_size() == 0) {
    return absl::InternalError(absl::StrCat(BenchOpName(op), ": no inline output in the response"));
  }
  return absl::OkStatus();
}

}  // namespace tokensel::cli
