// Racing clients vs SegmentSeqlens, TopKTokens and SampleTokens on the GPU
// (label gpu; skips without a device; helpers: race_gpu_util.h).
//  - SegmentSeqlens (cross-attention, causal masks): one id or position of
//    either side flips to an invalid value while the op runs. Pass 2 used to
//    re-read the client's tensors (a valid pass 1 then a changed pass 2 gave
//    a wrong result with status OK) and Finish re-read them for the message
//    (INTERNAL when the oracle saw valid data). Now: OK with the result of
//    the original inputs, or INVALID_ARGUMENT with nothing written.
//  - TopKTokens: the whole score buffer alternates between two patterns, the
//    second ranking every position above the first's threshold. The
//    emission used to write ids[slot] for any slot < S, past the output row;
//    now every run is OK, writes only inside the ids rows (padded, guarded),
//    and only distinct positions in [0, S).
//  - SampleTokens with a bert mask: the mask op reads the sampled ids back
//    from client memory, where a host thread keeps overwriting one of them
//    with invalid values: OK with the mask of the sampled ids, or
//    INVALID_ARGUMENT with the mask untouched.
#include <cstdint>
#include <cstring>
#include <iostream>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/kernels/cuda/race_gpu_util.h"

namespace tokensel::racetest::select_segment_test {
namespace {

namespace kc = kernels::cuda;
namespace cpu = kernels::cpu;

constexpr int kRuns = 60;

class RaceSelectSegmentGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { TOKENSEL_REQUIRE_GPU(); }
  void TearDown() override {
    if (!IsSkipped()) std::cout << "runs OK " << ok_ << ", INVALID_ARGUMENT " << invalid_ << "\n";
  }
  std::mt19937_64 rng_{20240722};
  int ok_ = 0;
  int invalid_ = 0;
};

// Valid rows of one side: segments 1..k (some absent) as contiguous runs in
// increasing order with padding between them, positions 0.. within a run.
void FillSide(Tensor& ids, Tensor& pos, int64_t ns, std::mt19937_64& rng) {
  const int64_t b = ids.shape[0];
  const int64_t t_len = ids.shape[1];
  for (int64_t row = 0; row < b; ++row) {
    int64_t t = 0;
    for (int64_t id = 1; id <= ns; ++id) {
      t += static_cast<int64_t>(rng() % 4);  // padding
      if (rng() % 5 == 0) continue;          // absent on this side
      const int64_t len = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(t_len / ns));
      const int64_t shift = static_cast<int64_t>(rng() % 3);
      for (int64_t k = 0; k < len && t < t_len; ++k, ++t) {
        ids.SetIndex(row * t_len + t, id);
        pos.SetIndex(row * t_len + t, shift + k);
      }
    }
    for (; t < t_len; ++t) {
      ids.SetIndex(row * t_len + t, 0);
      pos.SetIndex(row * t_len + t, static_cast<int64_t>(rng() % 1000));
    }
  }
}

struct SideTensors {
  std::vector<Tensor> out;  // seqlen, offset[, packed seqlens, offsets, cu_seqlens]

  SideTensors(int64_t b, int64_t ns, bool packed, std::mt19937_64& rng) {
    out.emplace_back(DType::kInt32, std::vector<int64_t>{b, ns}, 1);
    out.emplace_back(DType::kInt32, std::vector<int64_t>{b, ns + 1});
    if (packed) {
      out.emplace_back(DType::kInt32, std::vector<int64_t>{b * ns});
      out.emplace_back(DType::kInt32, std::vector<int64_t>{b * (ns + 1)});
      out.emplace_back(DType::kInt32, std::vector<int64_t>{b * ns + 1});
    }
    for (Tensor& t : out) {
      for (uint8_t& byte : t.bytes) byte = static_cast<uint8_t>(rng());
    }
  }
  template <typename ViewOf>
  kernels::SegmentSeqlensSide Side(ViewOf view_of) {
    kernels::SegmentSeqlensSide side{view_of(0), view_of(1), std::nullopt};
    if (out.size() == 5) side.packed = kernels::PackedSeqlens{view_of(2), view_of(3), view_of(4)};
    return side;
  }
};

TEST_F(RaceSelectSegmentGpuTest, SegmentSeqlensCross) {
  const int64_t b = 3, tq = 600, tkv = 500, ns = 8;
  for (auto mask : {kernels::AttnMaskType::kCausal, kernels::AttnMaskType::kCausalBottomRight}) {
    Tensor ids_q(DType::kInt32, {b, tq}, 3), pos_q(DType::kInt64, {b, tq});
    Tensor ids_kv(DType::kInt64, {b, tkv}), pos_kv(DType::kInt32, {b, tkv}, 1);
    FillSide(ids_q, pos_q, ns, rng_);
    FillSide(ids_kv, pos_kv, ns, rng_);
    SideTensors q(b, ns, true, rng_), kv(b, ns, false, rng_);
    SideTensors expected_q = q, expected_kv = kv;
    Tensor h_ids_q = ids_q, h_pos_q = pos_q, h_ids_kv = ids_kv, h_pos_kv = pos_kv;
    kernels::SegmentSeqlensArgs host;
    host.segment_ids_q = h_ids_q.Host();
    host.segment_pos_q = h_pos_q.Host();
    host.segment_ids_kv = h_ids_kv.Host();
    host.segment_pos_kv = h_pos_kv.Host();
    host.max_segments = ns;
    host.mask = mask;
    host.q = expected_q.Side([&](int i) { return expected_q.out[i].Host(); });
    host.kv = expected_kv.Side([&](int i) { return expected_kv.out[i].Host(); });
    ASSERT_TRUE(cpu::SegmentSeqlens(host, nullptr).ok());

    MappedCopy m_ids_q(ids_q), m_pos_q(pos_q), m_ids_kv(ids_kv), m_pos_kv(pos_kv);
    std::vector<std::unique_ptr<GuardedCopy>> d_out;
    std::vector<Output> outputs;
    auto place = [&](SideTensors& side, SideTensors& expected) {
      for (size_t i = 0; i < side.out.size(); ++i) {
        d_out.push_back(std::make_unique<GuardedCopy>(side.out[i]));
        outputs.push_back({d_out.back().get(), side.out[i].bytes, expected.out[i].bytes});
      }
    };
    place(q, expected_q);
    place(kv, expected_kv);
    kernels::SegmentSeqlensArgs args = host;
    args.segment_ids_q = m_ids_q.view();
    args.segment_pos_q = m_pos_q.view();
    args.segment_ids_kv = m_ids_kv.view();
    args.segment_pos_kv = m_pos_kv.view();
    args.q = q.Side([&](int i) { return d_out[static_cast<size_t>(i)]->view(); });
    args.kv = kv.Side([&](int i) { return d_out[q.out.size() + static_cast<size_t>(i)]->view(); });

    const Tensor* tensors[] = {&ids_q, &pos_q, &ids_kv, &pos_kv};
    MappedCopy* mapped[] = {&m_ids_q, &m_pos_q, &m_ids_kv, &m_pos_kv};
    for (int run = 0; run < kRuns && !HasFatalFailure(); ++run) {
      const int which = run % 4;  // ids_q, pos_q, ids_kv, pos_kv
      const Tensor& t = *tensors[which];
      const int64_t e = static_cast<int64_t>(rng_() % static_cast<uint64_t>(t.Elements()));
      const int64_t value = t.GetIndex(e);
      // Ids: out of range or negative; positions: negative only (any
      // non-negative position is valid and would change the result).
      const bool negative = which % 2 == 1 || run % 8 < 4;
      absl::Status status;
      {
        Flipper flipper(mapped[which]->HostElement(e), t.dtype, value,
                        Corrupt(value, t.dtype, negative));
        status = RunCuda(args, kc::SegmentSeqlensWorkspaceBytes, kc::SegmentSeqlensAsync,
                         kc::SegmentSeqlensFinish);
      }
      ExpectOutcome(status, "segment_", outputs, &ok_, &invalid_);
      if (status.ok()) {
        for (size_t i = 0; i < outputs.size(); ++i) {
          TOKENSEL_EXPECT_CUDA(cudaMemcpy(d_out[i]->view().data, outputs[i].before.data(),
                                          outputs[i].before.size(), cudaMemcpyHostToDevice));
        }
      }
    }
  }
  if (!HasFatalFailure()) ExpectRaceObserved(ok_, invalid_, /*expect_ok=*/true);
}

TEST_F(RaceSelectSegmentGpuTest, TopKTokensScoresRewritten) {
  const int64_t rows = 16, s = 4096, r = 1000, pad = 24;
  Tensor low(DType::kFloat32, {rows, s});
  Tensor high = low;
  for (int64_t i = 0; i < low.Elements(); ++i) {
    const float a = static_cast<float>(rng_() % 1000000) / 1e6f;  // [0, 1)
    const float h = 2.0f + a;                                     // above every low score
    std::memcpy(low.bytes.data() + low.ByteOffset(i), &a, 4);
    std::memcpy(high.bytes.data() + high.ByteOffset(i), &h, 4);
  }
  Tensor ids(DType::kInt32, {rows, r}, pad);
  std::memset(ids.bytes.data(), 0xFF, ids.bytes.size());  // -1 everywhere, gaps included
  MappedCopy m_scores(low);
  GuardedCopy d_ids(ids);
  const kernels::TopKTokensArgs args{m_scores.view(), d_ids.view()};
  for (int run = 0; run < kRuns && !HasFatalFailure(); ++run) {
    absl::Status status;
    {
      Scribbler scribbler(m_scores.host(), low.bytes, high.bytes);
      status =
          RunCuda(args, kc::TopKTokensWorkspaceBytes, kc::TopKTokensAsync, kc::TopKTokensFinish);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "context lost; op status " << status;
    EXPECT_TRUE(status.ok()) << status;
    ++ok_;
    EXPECT_TRUE(d_ids.GuardsIntact()) << "write outside the ids tensor";
    const std::vector<uint8_t> now = d_ids.Download();
    std::vector<bool> element(now.size(), false);
    for (int64_t row = 0; row < rows; ++row) {
      std::set<int32_t> seen;
      for (int64_t j = 0; j < r; ++j) {
        const size_t at = ids.ByteOffset(row * r + j);
        for (int k = 0; k < 4; ++k) element[at + static_cast<size_t>(k)] = true;
        int32_t v;
        std::memcpy(&v, now.data() + at, 4);
        if (v == -1) continue;  // a slot this run did not fill
        EXPECT_TRUE(v >= 0 && v < s) << "row " << row << " slot " << j << " = " << v;
        EXPECT_TRUE(seen.insert(v).second) << "row " << row << ": position " << v << " twice";
      }
    }
    for (size_t i = 0; i < now.size(); ++i) {
      if (!element[i] && now[i] != 0xFF) {
        ADD_FAILURE() << "byte " << i << " of the ids padding written (slot past R)";
        break;
      }
    }
    TOKENSEL_EXPECT_CUDA(
        cudaMemcpy(d_ids.view().data, ids.bytes.data(), ids.bytes.size(), cudaMemcpyHostToDevice));
  }
}

TEST_F(RaceSelectSegmentGpuTest, SampleTokensBertMaskReadsIdsBack) {
  const int64_t l = 2, b = 2, s = 256, r = 40;
  Tensor mask(DType::kFloat16, {b, 1, 1, s});
  for (uint8_t& byte : mask.bytes) byte = static_cast<uint8_t>(rng_());
  Tensor ids(DType::kInt32, {l, b, r});
  Tensor bert(DType::kFloat16, {l, b, 1, r, r});
  for (uint8_t& byte : bert.bytes) byte = static_cast<uint8_t>(rng_());
  Tensor expected_ids = ids, expected_bert = bert;
  kernels::SampleTokensArgs host;
  host.layers = l;
  host.batch = b;
  host.original_tokens = s;
  host.retained_tokens = r;
  host.seed = 1234;
  host.step = 5;
  host.ids = expected_ids.Host();
  host.mask = mask.Host();
  host.bert_mask = expected_bert.Host();
  ASSERT_TRUE(cpu::SampleTokens(host, nullptr).ok());

  GuardedCopy d_mask(mask), d_bert(bert);
  MappedCopy m_ids(ids);
  kernels::SampleTokensArgs args = host;
  args.ids = m_ids.view();
  args.mask = d_mask.view();
  args.bert_mask = d_bert.view();
  for (int run = 0; run < kRuns && !HasFatalFailure(); ++run) {
    const int64_t e = static_cast<int64_t>(rng_() % static_cast<uint64_t>(ids.Elements()));
    const int64_t sampled = expected_ids.GetIndex(e);
    absl::Status status;
    {
      // Both values invalid: the kernel writes the sampled id, the client
      // overwrites it; the mask op sees one of the three.
      Flipper flipper(m_ids.HostElement(e), DType::kInt32, Corrupt(sampled, DType::kInt32, false),
                      Corrupt(sampled, DType::kInt32, true));
      status = RunCuda(args, kc::SampleTokensWorkspaceBytes, kc::SampleTokensAsync,
                       kc::SampleTokensFinish);
    }
    ExpectOutcome(status, "indices", {{&d_bert, bert.bytes, expected_bert.bytes}}, &ok_, &invalid_);
    if (status.ok()) {
      TOKENSEL_EXPECT_CUDA(cudaMemcpy(d_bert.view().data, bert.bytes.data(), bert.bytes.size(),
                                      cudaMemcpyHostToDevice));
    }
  }
  // OK needs the mask's snapshot to land between the kernel's store and the
  // writer's next one: possible, not expected.
  if (!HasFatalFailure()) ExpectRaceObserved(ok_, invalid_, /*expect_ok=*/false);
}

}  // namespace
}  // namespace tokensel::racetest::select_segment_test
