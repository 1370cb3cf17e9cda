#include "tests/load/op_generators.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/kernels/gather_reference.h"

namespace tokensel::load {
namespace {

namespace cpu = ::tokensel::kernels::cpu;

int64_t U(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}
bool Coin(std::mt19937_64& rng) { return rng() % 2 == 0; }

DType DataDType(std::mt19937_64& rng) {
  // Every dtype but bool (whose bytes other than 0/1 no worker would send).
  static constexpr DType kTypes[] = {DType::kInt8,       DType::kUInt8,   DType::kFloat8E4M3,
                                     DType::kFloat8E5M2, DType::kFloat16, DType::kBFloat16,
                                     DType::kInt16,      DType::kFloat32, DType::kInt32,
                                     DType::kFloat64,    DType::kInt64};
  return kTypes[rng() % std::size(kTypes)];
}
DType IndexDType(std::mt19937_64& rng) { return Coin(rng) ? DType::kInt32 : DType::kInt64; }
DType ScoreDType(std::mt19937_64& rng) {
  static constexpr DType kTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  return kTypes[rng() % std::size(kTypes)];
}

int64_t Bytes(DType dtype, std::initializer_list<int64_t> dims) {
  int64_t n = kernels::ElementSize(dtype);
  for (int64_t d : dims) n *= d;
  return n;
}
bool Fits(DType dtype, std::initializer_list<int64_t> dims) {
  return Bytes(dtype, dims) <= kMaxTensorBytes;
}

std::vector<int64_t> Concat(std::vector<int64_t> a, int64_t last) {
  a.push_back(last);
  return a;
}
int64_t Product(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}
// 1 or 2 leading ("row") dims, at most 9 rows.
std::vector<int64_t> LeadingDims(std::mt19937_64& rng) {
  if (Coin(rng)) return {U(rng, 1, 4)};
  return {U(rng, 1, 3), U(rng, 1, 3)};
}

void MustOk(const absl::Status& status, absl::string_view op) {
  if (status.ok()) return;
  std::fprintf(stderr, "load worker: the oracle rejected a generated %.*s (generator bug): %s\n",
               static_cast<int>(op.size()), op.data(), status.ToString().c_str());
  std::abort();
}

// Builds ops on one CaseBuilder; `shm_only` forces every tensor by reference.
class Gen {
 public:
  Gen(CaseBuilder& b, bool shm_only) : b_(b), rng_(b.rng()), shm_only_(shm_only) {}

  Home Where() { return shm_only_ ? Home::kShm : b_.RandomHome(); }

  // Outputs whose absence means "inline": a reference, an explicit inline
  // request, or (local, half the time) no field at all.
  template <typename MutableField>
  void DefaultInline(const Slot& slot, const std::string& name, MutableField field) {
    if (slot.home == Home::kLocal && Coin(rng_)) {
      b_.ExpectInline(slot, name);
      return;
    }
    *field() = b_.Output(slot, name);
  }

  v1::Op Sort() {
    const std::vector<int64_t> lead = LeadingDims(rng_);
    const int64_t s = U(rng_, 1, 512), r = U(rng_, 1, std::min<int64_t>(s, 256));
    const DType dtype = IndexDType(rng_);
    const Slot ids = b_.Place(Where(), dtype, Concat(lead, r));
    b_.FillIndices(ids, s, /*unique=*/true);
    v1::Op op;
    auto* req = op.mutable_sort_tokens();
    *req->mutable_ids() = b_.Input(ids);  // packed before the oracle sorts it in place
    req->set_original_tokens(s);
    kernels::SortTokensArgs args{b_.View(ids), s, std::nullopt, std::nullopt};
    if (Coin(rng_)) {
      const Slot out = b_.Place(Where(), dtype, Concat(lead, r));
      *req->mutable_out() = b_.Output(out, "out");
      args.out = b_.View(out);
    } else if (ids.home == Home::kLocal) {
      b_.ExpectInline(ids, "out");  // inline ids sorted in place come back as "out"
    }
    if (Coin(rng_)) {
      const Slot inv = b_.Place(Where(), DType::kInt32, Concat(lead, s));
      *req->mutable_inverse() = b_.Output(inv, "inverse");
      args.inverse = b_.View(inv);
    }
    MustOk(cpu::SortTokens(args, nullptr), "SortTokens");
    return op;
  }

  v1::Op Gather() {
    const DType dtype = DataDType(rng_);
    const bool bf = Coin(rng_);
    const int64_t b = U(rng_, 1, 4), s = U(rng_, 1, 256), r = U(rng_, 1, 64);
    const int64_t c = ChannelDim(dtype, b * std::max(s, r));
    const Slot act = b_.Place(Where(), dtype,
                              bf ? std::vector<int64_t>{b, s, c} : std::vector<int64_t>{s, b, c});
    b_.FillBytes(act);
    const Slot idx = b_.Place(Where(), IndexDType(rng_), {b, r});
    b_.FillIndices(idx, s, /*unique=*/false);
    const Slot out = b_.Place(Where(), dtype,
                              bf ? std::vector<int64_t>{b, r, c} : std::vector<int64_t>{r, b, c});
    v1::Op op;
    auto* req = op.mutable_gather_tokens();
    *req->mutable_activations() = b_.Input(act);
    *req->mutable_indices() = b_.Input(idx);
    if (!bf || Coin(rng_)) req->set_batch_first(bf);  // absent = batch-first
    DefaultInline(out, "out", [&] { return req->mutable_out(); });
    // The naive reference, not kernels::cpu: a kernel bug cannot agree with it.
    testing::RefGather(b_.View(act), b_.View(idx), b_.View(out), bf);
    return op;
  }

  v1::Op Scatter() {
    const DType dtype = DataDType(rng_);
    const bool bf = Coin(rng_);
    const int64_t b = U(rng_, 1, 4), s = U(rng_, 1, 256), r = U(rng_, 1, s);
    const int64_t c = ChannelDim(dtype, b * s);
    const Slot all = b_.Place(Where(), dtype,
                              bf ? std::vector<int64_t>{b, s, c} : std::vector<int64_t>{s, b, c});
    b_.FillBytes(all);
    const Slot layer = b_.Place(Where(), dtype,
                                bf ? std::vector<int64_t>{b, r, c} : std::vector<int64_t>{r, b, c});
    b_.FillBytes(layer);
    const Slot idx = b_.Place(Where(), IndexDType(rng_), {b, r});
    b_.FillIndices(idx, s, /*unique=*/true);
    v1::Op op;
    auto* req = op.mutable_scatter_tokens();
    *req->mutable_all() = b_.Input(all);  // packed before the oracle writes it
    if (all.home == Home::kLocal) b_.ExpectInline(all, "all");
    *req->mutable_layer() = b_.Input(layer);
    *req->mutable_indices() = b_.Input(idx);
    req->set_batch_first(bf);
    MustOk(cpu::ScatterTokens({b_.View(all), b_.View(layer), b_.View(idx), bf}, nullptr),
           "ScatterTokens");
    return op;
  }

  // MergeTokens, out of place or (x by reference, half the time) in place.
  v1::Op Merge() {
    const DType dtype = DataDType(rng_);
    const bool bf = Coin(rng_);
    const int64_t b = U(rng_, 1, 4), s = U(rng_, 1, 256), r = U(rng_, 1, s);
    const int64_t c = ChannelDim(dtype, b * s);
    auto dims = [&](int64_t n) {
      return bf ? std::vector<int64_t>{b, n, c} : std::vector<int64_t>{n, b, c};
    };
    const Slot x = b_.Place(Where(), dtype, dims(s));
    b_.FillBytes(x);
    const Slot layer = b_.Place(Where(), dtype, dims(r));
    b_.FillBytes(layer);
    const Slot idx = b_.Place(Where(), IndexDType(rng_), {b, r});
    b_.FillIndices(idx, s, /*unique=*/true);
    v1::Op op;
    auto* req = op.mutable_merge_tokens();
    *req->mutable_x() = b_.Input(x);  // packed before the oracle writes it (in place)
    *req->mutable_layer() = b_.Input(layer);
    *req->mutable_indices() = b_.Input(idx);
    if (!bf || Coin(rng_)) req->set_batch_first(bf);  // absent = batch-first
    kernels::TensorView out_view;
    if (x.home == Home::kShm && Coin(rng_)) {
      *req->mutable_out() = b_.Input(x);  // the same bytes: in place
      out_view = b_.View(x);
    } else {
      const Slot out = b_.Place(Where(), dtype, dims(s));
      DefaultInline(out, "out", [&] { return req->mutable_out(); });
      out_view = b_.View(out);
    }
    MustOk(cpu::MergeTokens({b_.View(x), b_.View(layer), b_.View(idx), out_view, bf}, nullptr),
           "MergeTokens");
    return op;
  }

  // SplitTokens, rest_grad out of place or (grad by reference) in place.
  v1::Op Split() {
    const DType dtype = DataDType(rng_);
    const bool bf = Coin(rng_);
    const int64_t b = U(rng_, 1, 4), s = U(rng_, 1, 256), r = U(rng_, 1, s);
    const int64_t c = ChannelDim(dtype, b * s);
    auto dims = [&](int64_t n) {
      return bf ? std::vector<int64_t>{b, n, c} : std::vector<int64_t>{n, b, c};
    };
    const Slot grad = b_.Place(Where(), dtype, dims(s));
    b_.FillBytes(grad);
    const Slot idx = b_.Place(Where(), IndexDType(rng_), {b, r});
    b_.FillIndices(idx, s, /*unique=*/true);
    const Slot layer_grad = b_.Place(Where(), dtype, dims(r));
    v1::Op op;
    auto* req = op.mutable_split_tokens();
    *req->mutable_grad() = b_.Input(grad);
    *req->mutable_indices() = b_.Input(idx);
    req->set_batch_first(bf);
    DefaultInline(layer_grad, "layer_grad", [&] { return req->mutable_layer_grad(); });
    kernels::TensorView rest_view;
    if (grad.home == Home::kShm && Coin(rng_)) {
      *req->mutable_rest_grad() = b_.Input(grad);  // zeroed in place
      rest_view = b_.View(grad);
    } else {
      const Slot rest = b_.Place(Where(), dtype, dims(s));
      DefaultInline(rest, "rest_grad", [&] { return req->mutable_rest_grad(); });
      rest_view = b_.View(rest);
    }
    MustOk(cpu::SplitTokens({b_.View(grad), b_.View(idx), b_.View(layer_grad), rest_view, bf},
                            nullptr),
           "SplitTokens");
    return op;
  }

  // SamplePackedTokens: a random pack (empty and one-token sequences, padding
  // past cu[N]), a random keep rule, optional positions / inverse, and for
  // one layer sometimes the fused gather. T' is sent as kept_tokens when
  // cu_seqlens is by reference (and half the time otherwise).
  v1::Op Packed() {
    const int64_t n = U(rng_, 0, 20);
    std::vector<int32_t> cu = {0};
    for (int64_t i = 0; i < n; ++i) cu.push_back(cu.back() + static_cast<int32_t>(U(rng_, 0, 40)));
    const int64_t t = cu.back() + U(rng_, 0, 3);
    const int64_t l = U(rng_, 1, 3);
    kernels::SamplePackedTokensArgs args;
    args.keep_den = U(rng_, 1, 9);
    args.keep_num = U(rng_, 0, args.keep_den);
    args.min_tokens = U(rng_, 0, 2);
    args.layers = l;
    args.total_tokens = t;
    args.seed = rng_();
    args.step = rng_() & 0xffffffffu;
    const int64_t kept = kernels::PackedKeptTokens(cu.data(), n + 1, args);
    v1::Op op;
    auto* req = op.mutable_sample_packed_tokens();
    req->set_keep_num(args.keep_num);
    req->set_keep_den(args.keep_den);
    req->set_min_tokens(args.min_tokens);
    req->set_layers(l);
    req->set_seed(args.seed);
    req->set_step(args.step);
    const Slot cu_slot = b_.Place(Where(), DType::kInt32, {n + 1});
    args.cu_seqlens = b_.View(cu_slot);
    for (int64_t i = 0; i <= n; ++i) kernels::StoreIndex(args.cu_seqlens, i, cu[i]);
    b_.Commit(cu_slot);  // the mirror's values to the region
    *req->mutable_cu_seqlens() = b_.Input(cu_slot);
    if (cu_slot.home == Home::kShm || Coin(rng_)) req->set_kept_tokens(kept);
    const DType dtype = DataDType(rng_);
    const int64_t c = ChannelDim(dtype, std::max<int64_t>(t, 1));
    const bool gather = l == 1 && Coin(rng_);
    if (gather) {
      const Slot act = b_.Place(Where(), dtype, {t, c});
      b_.FillBytes(act);
      *req->mutable_activations() = b_.Input(act);
      args.activations = b_.View(act);
    }
    if (!gather || Coin(rng_)) req->set_total_tokens(t);
    const Slot cu_kept = b_.Place(Where(), DType::kInt32, {n + 1});
    DefaultInline(cu_kept, "cu_seqlens_kept", [&] { return req->mutable_cu_seqlens_kept(); });
    args.cu_seqlens_kept = b_.View(cu_kept);
    const Slot ids = b_.Place(Where(), DType::kInt32, {l, kept});
    DefaultInline(ids, "ids", [&] { return req->mutable_ids(); });
    args.ids = b_.View(ids);
    if (Coin(rng_)) {
      const Slot pos = b_.Place(Where(), DType::kInt32, {l, kept});
      *req->mutable_positions() = b_.Output(pos, "positions");
      args.positions = b_.View(pos);
    }
    if (Coin(rng_)) {
      const Slot inv = b_.Place(Where(), DType::kInt32, {l, t});
      *req->mutable_inverse() = b_.Output(inv, "inverse");
      args.inverse = b_.View(inv);
    }
    if (gather) {
      const Slot out = b_.Place(Where(), dtype, {kept, c});
      *req->mutable_out() = b_.Output(out, "out");
      args.out = b_.View(out);
    }
    MustOk(cpu::SamplePackedTokens(args, nullptr), "SamplePackedTokens");
    return op;
  }

  v1::Op BertMask() {
    const DType dtype = DataDType(rng_);
    int64_t b, h, s, sq, l, r;
    do {
      b = U(rng_, 1, 3), h = U(rng_, 1, 3), s = U(rng_, 1, 48), sq = Coin(rng_) ? 1 : s;
      l = U(rng_, 1, 3), r = U(rng_, 1, std::min<int64_t>(s, 16));
    } while (!Fits(dtype, {b, h, sq, s}) || !Fits(dtype, {l, b, h, r, r}));
    const Slot mask = b_.Place(Where(), dtype, {b, h, sq, s});
    b_.FillBytes(mask);
    const Slot idx = b_.Place(Where(), IndexDType(rng_), {l, b, r});
    b_.FillIndices(idx, s, /*unique=*/Coin(rng_));
    const Slot out = b_.Place(Where(), dtype, {l, b, h, r, r});
    v1::Op op;
    auto* req = op.mutable_gather_bert_mask();
    *req->mutable_mask() = b_.Input(mask);
    *req->mutable_indices() = b_.Input(idx);
    DefaultInline(out, "out", [&] { return req->mutable_out(); });
    MustOk(cpu::GatherBertMask({b_.View(mask), b_.View(idx), b_.View(out)}, nullptr),
           "GatherBertMask");
    return op;
  }

  v1::Op GptMask() {
    const DType dtype = DataDType(rng_);
    int64_t b, h, s;
    do {
      b = U(rng_, 1, 3), h = U(rng_, 1, 3), s = U(rng_, 1, 48);
    } while (!Fits(dtype, {b, h, s, s}));
    const int64_t r = U(rng_, 1, s);
    const Slot mask = b_.Place(Where(), dtype, {b, h, s, s});
    b_.FillBytes(mask);
    const Slot out = b_.Place(Where(), dtype, {b, h, r, r});
    v1::Op op;
    auto* req = op.mutable_slice_gpt_mask();
    *req->mutable_mask() = b_.Input(mask);
    if (out.home == Home::kShm) {
      req->set_retained_tokens(Coin(rng_) ? r : 0);  // R comes from `out`
      *req->mutable_out() = b_.Output(out, "out");
    } else {
      req->set_retained_tokens(r);
      DefaultInline(out, "out", [&] { return req->mutable_out(); });
    }
    MustOk(cpu::SliceGptMask({b_.View(mask), b_.View(out)}, nullptr), "SliceGptMask");
    return op;
  }

  v1::Op Segments(bool cross) {
    const int64_t b = U(rng_, 1, 4), t = U(rng_, 1, 256), ns = U(rng_, 1, 8);
    const Slot q = b_.Place(Where(), IndexDType(rng_), {b, t});
    b_.FillSegments(q, ns);
    v1::Op op;
    auto* req = op.mutable_segment_seqlens();
    *req->mutable_segment_ids_q() = b_.Input(q);
    req->set_max_segments(ns);
    const bool packed = Coin(rng_);
    req->set_packed(packed);
    kernels::SegmentSeqlensArgs args;
    args.segment_ids_q = b_.View(q);
    args.max_segments = ns;
    if (cross) {  // padding mask: the causal ones would need segment positions
      const Slot kv = b_.Place(Where(), IndexDType(rng_), {b, U(rng_, 1, 256)});
      b_.FillSegments(kv, ns);
      *req->mutable_segment_ids_kv() = b_.Input(kv);
      args.segment_ids_kv = b_.View(kv);
      req->set_mask(v1::ATTN_MASK_PADDING);
      args.mask = kernels::AttnMaskType::kPadding;
    } else {
      const int64_t mask = U(rng_, 0, 2);
      req->set_mask(static_cast<v1::AttnMaskType>(mask));
      args.mask = static_cast<kernels::AttnMaskType>(mask);
    }
    using R = v1::SegmentSeqlensRequest;
    args.q = Side(req, b, ns, packed, "q",
                  {&R::mutable_q_seqlen, &R::mutable_q_offset, &R::mutable_q_packed_seqlens,
                   &R::mutable_q_packed_offsets, &R::mutable_q_cu_seqlens});
    if (cross) {
      args.kv = Side(req, b, ns, packed, "kv",
                     {&R::mutable_kv_seqlen, &R::mutable_kv_offset, &R::mutable_kv_packed_seqlens,
                      &R::mutable_kv_packed_offsets, &R::mutable_kv_cu_seqlens});
    }
    MustOk(cpu::SegmentSeqlens(args, nullptr), "SegmentSeqlens");
    return op;
  }

  v1::Op TopK() {
    const DType dtype = ScoreDType(rng_);
    std::vector<int64_t> lead;
    int64_t s;
    do {
      lead = LeadingDims(rng_);
      s = U(rng_, 1, 1024);
    } while (Product(lead) * s * kernels::ElementSize(dtype) > kMaxTensorBytes);
    const int64_t r = U(rng_, 1, s);
    const Slot scores = b_.Place(Where(), dtype, Concat(lead, s));
    b_.FillBytes(scores);  // any bits: NaNs rank lowest, -0 == +0
    const Home ids_home = Where();
    const Slot ids = b_.Place(ids_home, ids_home == Home::kShm ? IndexDType(rng_) : DType::kInt32,
                              Concat(lead, r));
    v1::Op op;
    auto* req = op.mutable_top_k_tokens();
    *req->mutable_scores() = b_.Input(scores);
    req->set_retained_tokens(r);
    DefaultInline(ids, "ids", [&] { return req->mutable_ids(); });
    MustOk(cpu::TopKTokens({b_.View(scores), b_.View(ids)}, nullptr), "TopKTokens");
    return op;
  }

  v1::Op Sample() {
    const int mask_kind = static_cast<int>(U(rng_, 0, 3));  // 0, 1: none; 2: bert; 3: gpt
    const DType mask_dtype = DataDType(rng_);
    int64_t l, b, s, r, h, sq;
    auto fits = [&] {
      if (!Fits(DType::kInt64, {l, b, r}) || !Fits(DType::kInt32, {l, b, s})) return false;
      if (mask_kind == 2) {
        return Fits(mask_dtype, {b, h, sq, s}) && Fits(mask_dtype, {l, b, h, r, r});
      }
      return mask_kind != 3 || Fits(mask_dtype, {b, h, s, s});
    };
    do {
      l = U(rng_, 1, 3), b = U(rng_, 1, 4), s = U(rng_, 1, mask_kind >= 2 ? 32 : 256);
      r = U(rng_, 1, mask_kind >= 2 ? std::min<int64_t>(s, 12) : s);
      h = U(rng_, 1, 2), sq = Coin(rng_) ? 1 : s;
    } while (!fits());
    v1::Op op;
    auto* req = op.mutable_sample_tokens();
    req->set_layers(l);
    req->set_batch(b);
    req->set_original_tokens(s);
    req->set_retained_tokens(r);
    kernels::SampleTokensArgs args;
    args.layers = l, args.batch = b, args.original_tokens = s, args.retained_tokens = r;
    args.seed = rng_();
    args.step = rng_() & 0xffffffffu;
    req->set_seed(args.seed);
    req->set_step(args.step);
    const Home ids_home = Where();
    const Slot ids =
        b_.Place(ids_home, ids_home == Home::kShm ? IndexDType(rng_) : DType::kInt32, {l, b, r});
    DefaultInline(ids, "ids", [&] { return req->mutable_ids(); });
    args.ids = b_.View(ids);
    if (Coin(rng_)) {
      const Slot inv = b_.Place(Where(), DType::kInt32, {l, b, s});
      *req->mutable_inverse() = b_.Output(inv, "inverse");
      args.inverse = b_.View(inv);
    }
    if (mask_kind >= 2) {
      const Slot mask = b_.Place(
          Where(), mask_dtype,
          mask_kind == 2 ? std::vector<int64_t>{b, h, sq, s} : std::vector<int64_t>{b, h, s, s});
      b_.FillBytes(mask);
      *req->mutable_mask() = b_.Input(mask);
      args.mask = b_.View(mask);
      if (mask_kind == 2) {
        const Slot out = b_.Place(Where(), mask_dtype, {l, b, h, r, r});
        *req->mutable_bert_mask() = b_.Output(out, "bert_mask");
        args.bert_mask = b_.View(out);
      } else {
        const Slot out = b_.Place(Where(), mask_dtype, {b, h, r, r});
        *req->mutable_gpt_mask() = b_.Output(out, "gpt_mask");
        args.gpt_mask = b_.View(out);
      }
    }
    MustOk(cpu::SampleTokens(args, nullptr), "SampleTokens");
    return op;
  }

 private:
  // C in [1, 64] with rows * C elements of `dtype` within kMaxTensorBytes.
  int64_t ChannelDim(DType dtype, int64_t rows) {
    const int64_t cap = kMaxTensorBytes / (kernels::ElementSize(dtype) * rows);
    return U(rng_, 1, std::clamp<int64_t>(cap, 1, 64));
  }

  using SegmentField = v1::Tensor* (v1::SegmentSeqlensRequest::*)();
  // One side's outputs (seqlen, offset and, when packed, the packed three).
  kernels::SegmentSeqlensSide Side(v1::SegmentSeqlensRequest* req, int64_t b, int64_t ns,
                                   bool packed, absl::string_view prefix,
                                   const std::vector<SegmentField>& fields) {
    static constexpr const char* kSuffix[] = {"_seqlen", "_offset", "_packed_seqlens",
                                              "_packed_offsets", "_cu_seqlens"};
    const std::vector<int64_t> shapes[] = {
        {b, ns}, {b, ns + 1}, {b * ns}, {b * (ns + 1)}, {b * ns + 1}};
    std::vector<kernels::TensorView> views;
    for (size_t i = 0; i < (packed ? 5u : 2u); ++i) {
      const Slot slot = b_.Place(Where(), DType::kInt32, shapes[i]);
      DefaultInline(slot, absl::StrCat(prefix, kSuffix[i]), [&] { return (req->*fields[i])(); });
      views.push_back(b_.View(slot));
    }
    kernels::SegmentSeqlensSide side{views[0], views[1], std::nullopt};
    if (packed) side.packed = kernels::PackedSeqlens{views[2], views[3], views[4]};
    return side;
  }

  CaseBuilder& b_;
  std::mt19937_64& rng_;
  const bool shm_only_;
};

}  // namespace

absl::string_view OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kSortTokens:
      return "SortTokens";
    case OpKind::kGatherTokens:
      return "GatherTokens";
    case OpKind::kScatterTokens:
      return "ScatterTokens";
    case OpKind::kGatherBertMask:
      return "GatherBertMask";
    case OpKind::kSliceGptMask:
      return "SliceGptMask";
    case OpKind::kSegmentSeqlensSelf:
      return "SegmentSeqlensSelf";
    case OpKind::kSegmentSeqlensCross:
      return "SegmentSeqlensCross";
    case OpKind::kTopKTokens:
      return "TopKTokens";
    case OpKind::kSampleTokens:
      return "SampleTokens";
    case OpKind::kMergeTokens:
      return "MergeTokens";
    case OpKind::kSplitTokens:
      return "SplitTokens";
    case OpKind::kSamplePackedTokens:
      return "SamplePackedTokens";
  }
  return "?";
}

absl::string_view OpMethod(OpKind kind) {
  if (kind == OpKind::kSegmentSeqlensSelf || kind == OpKind::kSegmentSeqlensCross) {
    return "SegmentSeqlens";
  }
  return OpKindName(kind);
}

v1::Op BuildOp(OpKind kind, CaseBuilder& b, bool shm_only) {
  const uint64_t shm_before = b.used(Home::kShm), local_before = b.used(Home::kLocal);
  Gen gen(b, shm_only);
  v1::Op op;
  switch (kind) {
    case OpKind::kSortTokens:
      op = gen.Sort();
      break;
    case OpKind::kGatherTokens:
      op = gen.Gather();
      break;
    case OpKind::kScatterTokens:
      op = gen.Scatter();
      break;
    case OpKind::kGatherBertMask:
      op = gen.BertMask();
      break;
    case OpKind::kSliceGptMask:
      op = gen.GptMask();
      break;
    case OpKind::kSegmentSeqlensSelf:
      op = gen.Segments(/*cross=*/false);
      break;
    case OpKind::kSegmentSeqlensCross:
      op = gen.Segments(/*cross=*/true);
      break;
    case OpKind::kTopKTokens:
      op = gen.TopK();
      break;
    case OpKind::kSampleTokens:
      op = gen.Sample();
      break;
    case OpKind::kMergeTokens:
      op = gen.Merge();
      break;
    case OpKind::kSplitTokens:
      op = gen.Split();
      break;
    case OpKind::kSamplePackedTokens:
      op = gen.Packed();
      break;
  }
  if (b.used(Home::kShm) - shm_before > kMaxOpFootprint ||
      b.used(Home::kLocal) - local_before > kMaxOpFootprint) {
    std::fprintf(stderr, "load worker: a %.*s needed more than kMaxOpFootprint (budget bug)\n",
                 static_cast<int>(OpKindName(kind).size()), OpKindName(kind).data());
    std::abort();
  }
  b.NextOp();
  return op;
}

}  // namespace tokensel::load
