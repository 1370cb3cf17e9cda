#include "client/cli/demo_model.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cli/op_util.h"
#include "common/status_macros.h"
#include "kernels/cpu/cpu_ops.h"
#include "tokensel/client/tensor_ref.h"

namespace tokensel::cli {
namespace demo_internal {

using kernels::DType;
using kernels::TensorView;

// IEEE binary16 <-> binary32 (round to nearest even); the stand-in layer's
// arithmetic, identical for the shm data and the oracle copy.
namespace {
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    f = mant == 0 ? INFINITY : NAN;
  } else {
    f = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  }
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  bits |= sign;
  std::memcpy(&f, &bits, sizeof(bits));
  return f;
}
}  // namespace

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7fffffff;
  if (abs >= 0x7f800000) return sign | (abs > 0x7f800000 ? 0x7e00 : 0x7c00);
  if (abs >= 0x477ff000) return sign | 0x7c00;                        // rounds to >= 65520: inf
  if (abs < 0x38800000) {                                             // subnormal half (or zero)
    const float scaled = std::nearbyint(std::fabs(f) * 16777216.0f);  // units of 2^-24
    return sign | static_cast<uint16_t>(scaled);
  }
  const uint32_t rounded = abs + 0xfff + ((abs >> 13) & 1);
  return sign | static_cast<uint16_t>((rounded - 0x38000000) >> 13);
}

void AddOne(const TensorView& rows) {
  const int64_t n = rows.NumElements();
  for (int64_t i = 0; i < n; ++i) {
    char* p = rows.At(kernels::LinearToOffset(rows, i));
    uint16_t h;
    std::memcpy(&h, p, 2);
    h = FloatToHalf(HalfToFloat(h) + 1.0f);
    std::memcpy(p, &h, 2);
  }
}

v1::Tensor Ref(uint64_t offset, DType dtype, std::vector<int64_t> shape) {
  return client::TensorRef::InBuffer(kBuffer, offset)
      .Dtype(ToProto(dtype))
      .Shape(std::move(shape))
      .ToProto();
}

}  // namespace demo_internal

using demo_internal::AddOne;
using demo_internal::FloatToHalf;
using demo_internal::kBuffer;
using demo_internal::Ref;
using kernels::DType;
using kernels::TensorView;

int64_t RetainedTokens(int64_t layer, int64_t layers, int64_t seq) {
  if (layers <= 1) return seq;
  const double exact = static_cast<double>(seq) - static_cast<double>(layer) *
                                                      (static_cast<double>(seq) / 2.0) /
                                                      static_cast<double>(layers - 1);
  const int64_t r = 16 * static_cast<int64_t>(std::llround(exact / 16.0));
  return std::clamp<int64_t>(r, std::min<int64_t>(16, seq), seq);
}

absl::StatusOr<std::unique_ptr<DemoWorker>> DemoWorker::Create(client::Session* session,
                                                               const DemoShapes& sh,
                                                               uint64_t seed) {
  const int64_t B = sh.batch, S = sh.seq, C = sh.channels;
  const int64_t TB = sh.thd_batch, T = sh.thd_tokens, NS = sh.thd_segments;
  std::vector<Slot> slots;
  uint64_t used = 0;
  auto place = [&](const char* name, int64_t bytes) {
    slots.push_back({name, used, static_cast<uint64_t>(bytes)});
    used = (used + static_cast<uint64_t>(bytes) + 63) / 64 * 64;
  };
  place("activations", B * S * C * 2);
  place("gathered", B * S * C * 2);
  place("ids", B * S * 4);
  place("bert_mask_in", B * S * S);
  place("gpt_mask_in", B * S * S);
  place("bert_mask", B * S * S);
  place("gpt_mask", B * S * S);
  place("thd_segment_ids", TB * T * 4);
  place("q_seqlen", TB * NS * 4);
  place("q_offset", TB * (NS + 1) * 4);
  place("q_packed_seqlens", TB * NS * 4);
  place("q_packed_offsets", TB * (NS + 1) * 4);
  place("q_cu_seqlens", (TB * NS + 1) * 4);
  // The packed layer: T' <= TB*T.
  const int64_t TC = sh.thd_channels;
  place("thd_act", TB * T * TC * 2);
  place("thd_kept", TB * T * TC * 2);
  place("thd_ids", TB * T * 4);
  place("thd_positions", TB * T * 4);
  place("thd_cu_kept", (TB * NS + 1) * 4);
  ASSIGN_OR_RETURN(
      client::SharedRegion region,
      client::SharedRegion::CreateSealed(client::SharedRegion::UniqueName("", "demo"), used));
  std::unique_ptr<DemoWorker> w(new DemoWorker(std::move(region), std::move(slots), sh, seed));
  w->session_ = session;
  uint8_t* base = w->region_.data();
  // Activations: fp16 values in [-2, 2); masks: BERT = key padding (each
  // row b attends to its first len_b tokens), GPT = causal.
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  for (const auto& [slot, n] :
       {std::pair<const char*, int64_t>{"activations", B * S * C}, {"thd_act", TB * T * TC}}) {
    uint8_t* act = base + w->Offset(slot);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = FloatToHalf(value(w->rng_));
      std::memcpy(act + 2 * i, &h, 2);
    }
  }
  uint8_t* bert = base + w->Offset("bert_mask_in");
  uint8_t* gpt = base + w->Offset("gpt_mask_in");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = std::uniform_int_distribution<int64_t>(S / 2, S)(w->rng_);
    for (int64_t i = 0; i < S; ++i) {
      for (int64_t j = 0; j < S; ++j) {
        bert[(b * S + i) * S + j] = j < len ? 1 : 0;
        gpt[(b * S + i) * S + j] = j <= i ? 1 : 0;
      }
    }
  }
  w->oracle_.assign(base, base + w->region_.size());
  RETURN_IF_ERROR(session->RegisterBuffer(w->region_.RegisterRequest(kBuffer)).status());
  return w;
}

DemoWorker::DemoWorker(client::SharedRegion region, std::vector<Slot> slots, DemoShapes shapes,
                       uint64_t seed)
    : region_(std::move(region)),
      shapes_(shapes),
      seed_(seed),
      rng_(seed),
      slots_(std::move(slots)) {}

uint64_t DemoWorker::Offset(const std::string& slot) const {
  for (const Slot& s : slots_) {
    if (s.name == slot) return s.offset;
  }
  std::abort();  // a slot name typo in this file
}

TensorView DemoWorker::View(bool oracle, const std::string& slot, DType dtype,
                            std::initializer_list<int64_t> shape) const {
  uint8_t* base = oracle ? const_cast<uint8_t*>(oracle_.data()) : region_.data();
  return TensorView::Contiguous(base + Offset(slot), dtype, shape);
}

LatencyStats& DemoWorker::Stats(const std::string& name) {
  for (auto& [n, stats] : latencies_) {
    if (n == name) return stats;
  }
  latencies_.emplace_back(name, LatencyStats());
  return latencies_.back().second;
}

absl::Status DemoWorker::Execute(const std::string& row, const v1::ExecuteRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<v1::ExecuteResponse> resp = session_->client().Execute(request);
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  if (!resp.ok())
    return absl::Status(resp.status().code(), absl::StrCat(row, ": ", resp.status().message()));
  Stats(row).Add(us);
  return absl::OkStatus();
}

absl::Status DemoWorker::Check(const std::string& what) {
  ++checks_;
  const uint8_t* shm = region_.data();
  if (std::memcmp(shm, oracle_.data(), oracle_.size()) == 0) return absl::OkStatus();
  size_t i = 0;
  while (shm[i] == oracle_[i]) ++i;
  std::string slot = "padding";
  for (const Slot& s : slots_) {
    if (i >= s.offset && i < s.offset + s.bytes)
      slot = absl::StrCat(s.name, " byte ", i - s.offset);
  }
  return absl::InternalError(absl::StrCat("check failed after ", what, ": ", slot, " is ",
                                          static_cast<int>(shm[i]), ", the CPU oracle has ",
                                          static_cast<int>(oracle_[i])));
}

absl::Status DemoWorker::ModelStep(bool gpt, uint64_t step) {
  const int64_t B = shapes_.batch, S = shapes_.seq, C = shapes_.channels, L = shapes_.layers;
  const char* model = gpt ? "gpt" : "bert";
  const std::string mask_in = gpt ? "gpt_mask_in" : "bert_mask_in";
  for (int64_t l = 0; l < L; ++l) {
    const int64_t R = RetainedTokens(l, L, S);
    const uint64_t seed = seed_ + static_cast<uint64_t>(l);
    const std::string where = absl::StrCat(model, " step ", step, " layer ", l, " (R=", R, ")");
    // Layer in: sample (+ mask) and gather, one round trip.
    v1::ExecuteRequest in;
    auto* sample = in.add_ops()->mutable_sample_tokens();
    sample->set_layers(1);
    sample->set_batch(B);
    sample->set_original_tokens(S);
    sample->set_retained_tokens(R);
    sample->set_seed(seed);
    sample->set_step(step);
    *sample->mutable_ids() = Ref(Offset("ids"), DType::kInt32, {1, B, R});
    *sample->mutable_mask() = Ref(Offset(mask_in), DType::kUInt8, {B, 1, S, S});
    if (gpt) {
      *sample->mutable_gpt_mask() = Ref(Offset("gpt_mask"), DType::kUInt8, {B, 1, R, R});
    } else {
      *sample->mutable_bert_mask() = Ref(Offset("bert_mask"), DType::kUInt8, {1, B, 1, R, R});
    }
    auto* gather = in.add_ops()->mutable_gather_tokens();
    *gather->mutable_activations() = Ref(Offset("activations"), DType::kFloat16, {B, S, C});
    *gather->mutable_indices() = Ref(Offset("ids"), DType::kInt32, {B, R});
    *gather->mutable_out() = Ref(Offset("gathered"), DType::kFloat16, {B, R, C});
    gather->set_batch_first(true);
    RETURN_IF_ERROR(Execute(absl::StrCat(model, " layer in: Sample+Gather"), in));

    kernels::SampleTokensArgs sa;
    sa.layers = 1;
    sa.batch = B;
    sa.original_tokens = S;
    sa.retained_tokens = R;
    sa.seed = seed;
    sa.step = step;
    sa.ids = View(true, "ids", DType::kInt32, {1, B, R});
    sa.mask = View(true, mask_in, DType::kUInt8, {B, 1, S, S});
    if (gpt) {
      sa.gpt_mask = View(true, "gpt_mask", DType::kUInt8, {B, 1, R, R});
    } else {
      sa.bert_mask = View(true, "bert_mask", DType::kUInt8, {1, B, 1, R, R});
    }
    RETURN_IF_ERROR(kernels::cpu::SampleTokens(sa, nullptr));
    RETURN_IF_ERROR(
        kernels::cpu::GatherTokens({View(true, "activations", DType::kFloat16, {B, S, C}),
                                    View(true, "ids", DType::kInt32, {B, R}),
                                    View(true, "gathered", DType::kFloat16, {B, R, C}), true},
                                   nullptr));
    RETURN_IF_ERROR(Check(absl::StrCat(where, " sample+gather")));

    // The stand-in layer, on the worker's side of the shared memory.
    AddOne(View(false, "gathered", DType::kFloat16, {B, R, C}));
    AddOne(View(true, "gathered", DType::kFloat16, {B, R, C}));

    // Layer out: scatter the layer's output back.
    v1::ExecuteRequest out;
    auto* scatter = out.add_ops()->mutable_scatter_tokens();
    *scatter->mutable_all() = Ref(Offset("activations"), DType::kFloat16, {B, S, C});
    *scatter->mutable_layer() = Ref(Offset("gathered"), DType::kFloat16, {B, R, C});
    *scatter->mutable_indices() = Ref(Offset("ids"), DType::kInt32, {B, R});
    scatter->set_batch_first(true);
    RETURN_IF_ERROR(Execute("layer out: Scatter", out));
    RETURN_IF_ERROR(
        kernels::cpu::ScatterTokens({View(true, "activations", DType::kFloat16, {B, S, C}),
                                     View(true, "gathered", DType::kFloat16, {B, R, C}),
                                     View(true, "ids", DType::kInt32, {B, R}), true},
                                    nullptr));
    RETURN_IF_ERROR(Check(absl::StrCat(where, " scatter")));
  }
  return absl::OkStatus();
}

absl::Status DemoWorker::ThdBatch(uint64_t step) {
  const int64_t B = shapes_.thd_batch, T = shapes_.thd_tokens, NS = shapes_.thd_segments;
  // Each row: k in [1, NS] segments of random lengths covering the first
  // `used` tokens, then padding (id 0).
  std::vector<int32_t> ids(static_cast<size_t>(B * T), 0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t k = std::uniform_int_distribution<int64_t>(1, NS)(rng_);
    const int64_t used =
        std::uniform_int_distribution<int64_t>(std::max<int64_t>(k, T / 2), T)(rng_);
    std::vector<int64_t> cuts;  // k-1 distinct cut points in [1, used)
    while (static_cast<int64_t>(cuts.size()) < k - 1) {
      const int64_t c = std::uniform_int_distribution<int64_t>(1, used - 1)(rng_);
      if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.push_back(used);
    int64_t start = 0;
    for (int64_t s = 0; s < k; ++s) {
      for (int64_t t = start; t < cuts[static_cast<size_t>(s)]; ++t)
        ids[static_cast<size_t>(b * T + t)] = static_cast<int32_t>(s + 1);
      start = cuts[static_cast<size_t>(s)];
    }
  }
  std::memcpy(region_.data() + Offset("thd_segment_ids"), ids.data(), ids.size() * 4);
  std::memcpy(oracle_.data() + Offset("thd_segment_ids"), ids.data(), ids.size() * 4);

  v1::SegmentSeqlensRequest req;
  *req.mutable_segment_ids_q() = Ref(Offset("thd_segment_ids"), DType::kInt32, {B, T});
  req.set_max_segments(NS);
  req.set_mask(v1::ATTN_MASK_CAUSAL);
  req.set_packed(true);
  *req.mutable_q_seqlen() = Ref(Offset("q_seqlen"), DType::kInt32, {B, NS});
  *req.mutable_q_offset() = Ref(Offset("q_offset"), DType::kInt32, {B, NS + 1});
  *req.mutable_q_packed_seqlens() = Ref(Offset("q_packed_seqlens"), DType::kInt32, {B * NS});
  *req.mutable_q_packed_offsets() = Ref(Offset("q_packed_offsets"), DType::kInt32, {B * (NS + 1)});
  *req.mutable_q_cu_seqlens() = Ref(Offset("q_cu_seqlens"), DType::kInt32, {B * NS + 1});
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<v1::OpResponse> resp = session_->client().SegmentSeqlens(req);
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  if (!resp.ok()) return resp.status();
  Stats("thd: SegmentSeqlens packed").Add(us);

  kernels::SegmentSeqlensArgs args;
  args.segment_ids_q = View(true, "thd_segment_ids", DType::kInt32, {B, T});
  args.max_segments = NS;
  args.mask = kernels::AttnMaskType::kCausal;
  args.q = {View(true, "q_seqlen", DType::kInt32, {B, NS}),
            View(true, "q_offset", DType::kInt32, {B, NS + 1}),
            kernels::PackedSeqlens{View(true, "q_packed_seqlens", DType::kInt32, {B * NS}),
                                   View(true, "q_packed_offsets", DType::kInt32, {B * (NS + 1)}),
                                   View(true, "q_cu_seqlens", DType::kInt32, {B * NS + 1})}};
  RETURN_IF_ERROR(kernels::cpu::SegmentSeqlens(args, nullptr));
  RETURN_IF_ERROR(Check("thd SegmentSeqlens"));
  return PackedLayer(step);
}

}  // namespace tokensel::cli
