// SamplePackedTokens (ops.h op 11) against the naive reference of
// sample_packed_reference.h and the spec's properties: the spec vectors,
// random packs (sizes 0/1/odd/large, strided and misaligned views, 1 and 3
// threads), SampleTokens reproduced by equal-length packs, independence from
// the neighbours, inclusion frequency, the fused gather = GatherTokens, the
// kept segments through SegmentSeqlens, the 128-bit keep rule, and every
// error with nothing written.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/sample_math.h"
#include "tests/kernels/sample_packed_reference.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_tensor.h"

namespace tokensel::kernels {
namespace {

using ::tokensel::testing::kPoison;
using ::tokensel::testing::Layout;
using ::tokensel::testing::OnlyElementsWritten;
using ::tokensel::testing::PackedExpected;
using ::tokensel::testing::PackedRule;
using ::tokensel::testing::ReferenceSamplePacked;
using ::tokensel::testing::StatusIs;
using ::tokensel::testing::TestTensor;

cpu::ThreadPool* Pool(int threads) {
  static cpu::ThreadPool* three = new cpu::ThreadPool(3);
  return threads == 1 ? nullptr : three;
}

struct Want {
  bool positions = true, inverse = true;
  int64_t channels = 0;  // > 0: activations [T,C] and out (L must be 1)
  DType dtype = DType::kFloat32;
  Layout layout;
};

// One call's tensors: cu_seqlens from `cu`, every output poisoned.
struct PackedCase {
  PackedCase(const std::vector<int64_t>& cu_values, int64_t T, const PackedRule& rule, int64_t L,
             int64_t kept, const Want& want, std::mt19937_64& rng)
      : cu(DType::kInt32, {static_cast<int64_t>(cu_values.size())}, want.layout),
        cu_kept(DType::kInt32, {static_cast<int64_t>(cu_values.size())}, want.layout),
        ids(DType::kInt32, {L, kept}, want.layout) {
    for (size_t i = 0; i < cu_values.size(); ++i)
      cu.SetIndex(static_cast<int64_t>(i), cu_values[i]);
    args.cu_seqlens = cu.view();
    args.total_tokens = T;
    args.keep_num = rule.keep_num;
    args.keep_den = rule.keep_den;
    args.min_tokens = rule.min_tokens;
    args.layers = L;
    args.seed = rng();
    args.step = rng() >> 40;
    Poison(cu_kept);
    args.cu_seqlens_kept = cu_kept.view();
    Poison(ids);
    args.ids = ids.view();
    if (want.positions) {
      positions = TestTensor(DType::kInt32, {L, kept}, want.layout);
      Poison(*positions);
      args.positions = positions->view();
    }
    if (want.inverse) {
      inverse = TestTensor(DType::kInt32, {L, T}, want.layout);
      Poison(*inverse);
      args.inverse = inverse->view();
    }
    if (want.channels > 0) {
      activations = TestTensor(want.dtype, {T, want.channels}, want.layout);
      activations->FillRandom(rng);
      args.activations = activations->view();
      out = TestTensor(want.dtype, {kept, want.channels}, want.layout);
      Poison(*out);
      args.out = out->view();
    }
  }
  void Poison(TestTensor& t) {
    t.Fill(kPoison);
    before.push_back({&t, t.Bytes()});
  }
  // Nothing of any output was written (after an error).
  bool Untouched() {
    for (auto& [t, bytes] : before) {
      if (t->Bytes() != bytes) return false;
    }
    return true;
  }

  TestTensor cu, cu_kept, ids;
  std::optional<TestTensor> positions, inverse, activations, out;
  std::vector<std::pair<TestTensor*, std::vector<uint8_t>>> before;
  SamplePackedTokensArgs args;
};

std::vector<int64_t> Values(TestTensor& t, int64_t row, int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = t.GetIndex(row * n + i);
  return v;
}

void ExpectMatches(PackedCase& c, const std::vector<int64_t>& cu, int64_t T, const PackedRule& rule,
                   int64_t L, const std::string& what) {
  const PackedExpected e = ReferenceSamplePacked(cu, T, rule, L, c.args.seed, c.args.step);
  const int64_t kept = e.cu_kept.back();
  ASSERT_EQ(Values(c.cu_kept, 0, static_cast<int64_t>(cu.size())), e.cu_kept) << what;
  for (int64_t l = 0; l < L; ++l) {
    ASSERT_EQ(Values(c.ids, l, kept), e.ids[l]) << what << " layer " << l;
    if (c.positions) {
      ASSERT_EQ(Values(*c.positions, l, kept), e.positions[l]) << what;
    }
    if (c.inverse) {
      ASSERT_EQ(Values(*c.inverse, l, T), e.inverse[l]) << what;
    }
  }
  if (c.out) {
    const int64_t C = c.out->shape()[1];
    for (int64_t j = 0; j < kept; ++j) {
      for (int64_t ch = 0; ch < C; ++ch) {
        ASSERT_EQ(c.out->ElementBytes(j * C + ch),
                  c.activations->ElementBytes(e.ids[0][j] * C + ch))
            << what << " out row " << j;
      }
    }
  }
  for (auto& [t, bytes] : c.before) EXPECT_TRUE(OnlyElementsWritten(*t, bytes, kPoison)) << what;
}

int64_t KeptOf(const std::vector<int64_t>& cu, const PackedRule& rule) {
  int64_t kept = 0;
  for (size_t i = 0; i + 1 < cu.size(); ++i)
    kept += testing::ReferenceKeep(cu[i + 1] - cu[i], rule);
  return kept;
}

TEST(SamplePackedTokensTest, SpecVectorHalfWithMinOne) {
  std::mt19937_64 rng(1);
  const std::vector<int64_t> cu = {0, 3, 3, 8};
  const PackedRule rule{1, 2, 1};
  PackedCase c(cu, 8, rule, 2, 5, {}, rng);
  ASSERT_OK(cpu::SamplePackedTokens(c.args, nullptr));
  EXPECT_THAT(Values(c.cu_kept, 0, 4), ::testing::ElementsAre(0, 2, 2, 5));
  for (int64_t l = 0; l < 2; ++l) {
    const std::vector<int64_t> ids = Values(c.ids, l, 5);
    EXPECT_LT(ids[0], ids[1]);
    EXPECT_GE(ids[0], 0);
    EXPECT_LT(ids[1], 3);
    EXPECT_LT(ids[2], ids[3]);
    EXPECT_LT(ids[3], ids[4]);
    EXPECT_GE(ids[2], 3);
    EXPECT_LT(ids[4], 8);
    const std::vector<int64_t> offsets = {0, 0, 3, 3, 3};
    const std::vector<int64_t> pos = Values(*c.positions, l, 5);
    for (int k = 0; k < 5; ++k) EXPECT_EQ(pos[k], ids[k] - offsets[k]);
  }
  ExpectMatches(c, cu, 8, rule, 2, "spec vector");
}

TEST(SamplePackedTokensTest, KeepAllIsTheIdentityAndPastTheEndIsDropped) {
  std::mt19937_64 rng(2);
  const std::vector<int64_t> cu = {0, 4, 4, 9, 10};
  PackedCase c(cu, 13, {1, 1, 0}, 3, 10, {}, rng);
  ASSERT_OK(cpu::SamplePackedTokens(c.args, Pool(3)));
  EXPECT_EQ(Values(c.cu_kept, 0, 5), cu);
  for (int64_t l = 0; l < 3; ++l) {
    std::vector<int64_t> identity(10), inverse(13, -1);
    for (int64_t t = 0; t < 10; ++t) identity[t] = inverse[t] = t;
    EXPECT_EQ(Values(c.ids, l, 10), identity);
    EXPECT_EQ(Values(*c.inverse, l, 13), inverse);
  }
}

TEST(SamplePackedTokensTest, KeepNothingGivesAnEmptyPack) {
  std::mt19937_64 rng(3);
  const std::vector<int64_t> cu = {0, 3, 7};
  PackedCase c(cu, 7, {0, 1, 0}, 2, 0, {}, rng);
  ASSERT_OK(cpu::SamplePackedTokens(c.args, nullptr));
  EXPECT_THAT(Values(c.cu_kept, 0, 3), ::testing::ElementsAre(0, 0, 0));
  EXPECT_EQ(Values(*c.inverse, 1, 7), std::vector<int64_t>(7, -1));
}

TEST(SamplePackedTokensTest, SpecErrorsNameTheFirstBadSequenceAndWriteNothing) {
  struct Bad {
    std::vector<int64_t> cu;
    int64_t T;
    PackedRule rule;
    const char* message;
  };
  const Bad cases[] = {
      {{1, 3}, 4, {1, 2, 0}, "cu_seqlens[0] is 1, expected 0"},
      {{0, 4, 2},
       4,
       {1, 2, 0},
       "decreasing at sequence i = 1: cu_seqlens[1] = 4 > cu_seqlens[2] = 2"},
      {{0, 5}, 4, {1, 2, 0}, "sequence i = 0 ends at cu_seqlens[1] = 5, past total_tokens T = 4"},
      {{0, 2, 2, 9, 3}, 8, {1, 2, 0}, "decreasing at sequence i = 3"},
      {{0, 2}, 4, {3, 2, 0}, "keep_num: 3 is out of range [0, 2]"},
      {{0, 2}, 4, {1, 0, 0}, "keep_den: 0 is out of range, expected >= 1"},
      {{0, 2}, 4, {1, 2, -1}, "min_tokens: -1 is negative"},
  };
  std::mt19937_64 rng(4);
  for (const Bad& bad : cases) {
    PackedCase c(bad.cu, bad.T, bad.rule, 1, 1, {.channels = 2}, rng);
    EXPECT_THAT(cpu::SamplePackedTokens(c.args, Pool(3)),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr(bad.message)));
    EXPECT_TRUE(c.Untouched()) << bad.message;
  }
}

TEST(SamplePackedTokensTest, MetadataErrorsNameTheTensor) {
  std::mt19937_64 rng(5);
  const std::vector<int64_t> cu = {0, 4, 6};
  const PackedRule rule{1, 2, 0};  // r = [2, 1]: T' = 3
  {
    PackedCase c(cu, 6, rule, 1, 4, {}, rng);  // ids sized for T' = 4
    EXPECT_THAT(cpu::SamplePackedTokens(c.args, nullptr),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("ids: dim 1")));
    EXPECT_TRUE(c.Untouched());
  }
  {
    PackedCase c(cu, 6, rule, 2, 3, {.channels = 4}, rng);  // out with L = 2
    EXPECT_THAT(cpu::SamplePackedTokens(c.args, nullptr),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("layers == 1")));
  }
  {
    PackedCase c(cu, 6, rule, 1, 3, {}, rng);
    c.args.cu_seqlens_kept = c.ids.view();  // overlaps ids (and has the wrong shape)
    EXPECT_THAT(
        cpu::SamplePackedTokens(c.args, nullptr),
        StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("cu_seqlens_kept")));
  }
  {
    PackedCase c(cu, 6, rule, 1, 3, {}, rng);
    c.args.positions = c.ids.view();
    EXPECT_THAT(cpu::SamplePackedTokens(c.args, nullptr),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("positions")));
    EXPECT_TRUE(c.Untouched());
  }
  {
    // 2^32 - 1 layers of 2^32 sequences (a broadcast cu_seqlens of zeros):
    // more tasks than int64 counts.
    PackedCase c(cu, 6, rule, 1, 3, {}, rng);
    const int64_t n_plus_1 = (int64_t{1} << 32) + 1;
    c.args.cu_seqlens = TensorView::Strided(c.cu.view().data, DType::kInt32, {n_plus_1}, {0});
    c.args.cu_seqlens_kept =
        TensorView::Strided(c.cu_kept.view().data, DType::kInt32, {n_plus_1}, {0});
    c.args.layers = (int64_t{1} << 32) - 1;
    EXPECT_THAT(cpu::SamplePackedTokens(c.args, nullptr),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("2^63 tasks")));
  }
  {
    PackedCase c(cu, 6, rule, 1, 3, {}, rng);
    c.args.step = uint64_t{1} << 32;
    EXPECT_THAT(cpu::SamplePackedTokens(c.args, nullptr),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("step")));
  }
}

// A random pack: lengths from 0 to long, N from 0 to many.
std::vector<int64_t> RandomPack(std::mt19937_64& rng, int64_t* T) {
  const int64_t shapes[] = {0, 1, 2, 7, 33, 200};
  const int64_t N = shapes[rng() % 6];
  std::vector<int64_t> cu = {0};
  for (int64_t i = 0; i < N; ++i) {
    int64_t n = 0;
    switch (rng() % 5) {
      case 0:
        n = 0;
        break;
      case 1:
        n = 1;
        break;
      case 2:
        n = static_cast<int64_t>(rng() % 9);
        break;
      case 3:
        n = static_cast<int64_t>(rng() % 300);
        break;
      default:
        n = N <= 2 ? static_cast<int64_t>(rng() % 5000) : static_cast<int64_t>(rng() % 64);
    }
    cu.push_back(cu.back() + n);
  }
  *T = cu.back() + static_cast<int64_t>(rng() % 3);  // tokens past cu[N] are padding
  return cu;
}

TEST(SamplePackedTokensTest, RandomPacksMatchTheReference) {
  std::mt19937_64 rng(6);
  for (int iter = 0; iter < 300; ++iter) {
    int64_t T = 0;
    const std::vector<int64_t> cu = RandomPack(rng, &T);
    const int64_t den = 1 + static_cast<int64_t>(rng() % 10);
    const PackedRule rule{static_cast<int64_t>(rng() % (den + 1)), den,
                          static_cast<int64_t>(rng() % 3)};
    const int64_t L = 1 + static_cast<int64_t>(rng() % 3);
    Want want;
    want.positions = rng() % 2;
    want.inverse = rng() % 2;
    if (L == 1 && rng() % 2) {
      want.channels = 1 + static_cast<int64_t>(rng() % 9);
      const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kInt8, DType::kInt64};
      want.dtype = dtypes[rng() % 4];
    }
    if (rng() % 2) want.layout = {{1, 2}, static_cast<int64_t>(rng() % 2) * 4};
    const int threads = rng() % 2 ? 1 : 3;
    PackedCase c(cu, T, rule, L, KeptOf(cu, rule), want, rng);
    const std::string what =
        "iter " + std::to_string(iter) + " N=" + std::to_string(cu.size() - 1) +
        " T=" + std::to_string(T) + " keep " + std::to_string(rule.keep_num) + "/" +
        std::to_string(rule.keep_den) + " min " + std::to_string(rule.min_tokens) + " threads " +
        std::to_string(threads);
    ASSERT_OK(cpu::SamplePackedTokens(c.args, Pool(threads))) << what;
    ExpectMatches(c, cu, T, rule, L, what);
  }
}

// A long sequence (past the chunked-select threshold) next to short ones.
TEST(SamplePackedTokensTest, LongSequenceMatchesTheReference) {
  std::mt19937_64 rng(7);
  const int64_t long_n = (int64_t{1} << 20) + 5;
  const std::vector<int64_t> cu = {0, 3, 3 + long_n, 3 + long_n + 17};
  const PackedRule rule{1, 3, 0};
  PackedCase c(cu, cu.back(), rule, 1, KeptOf(cu, rule), {.positions = false}, rng);
  ASSERT_OK(cpu::SamplePackedTokens(c.args, Pool(3)));
  ExpectMatches(c, cu, cu.back(), rule, 1, "long");
}

// Equal lengths (n_i = S, r_i = R): layer l's ids of sequence i are
// SampleTokens' row (l, b = i) plus cu[i]. One generator for both ops.
TEST(SamplePackedTokensTest, EqualLengthsReproduceSampleTokens) {
  std::mt19937_64 rng(8);
  for (const auto& [N, S, L] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 1}, {3, 7, 2}, {16, 2048, 3}, {5, 131, 1}}) {
    const PackedRule rule{3, 4, 0};
    const int64_t R = testing::ReferenceKeep(S, rule);
    std::vector<int64_t> cu(N + 1);
    for (int64_t i = 0; i <= N; ++i) cu[i] = i * S;
    PackedCase c(cu, N * S, rule, L, N * R, {}, rng);
    ASSERT_OK(cpu::SamplePackedTokens(c.args, Pool(3)));
    TestTensor sampled(DType::kInt32, {L, N, R});
    SampleTokensArgs sample;
    sample.layers = L;
    sample.batch = N;
    sample.original_tokens = S;
    sample.retained_tokens = R;
    sample.seed = c.args.seed;
    sample.step = c.args.step;
    sample.ids = sampled.view();
    ASSERT_OK(cpu::SampleTokens(sample, nullptr));
    for (int64_t l = 0; l < L; ++l) {
      const std::vector<int64_t> packed = Values(c.ids, l, N * R);
      for (int64_t i = 0; i < N; ++i) {
        for (int64_t k = 0; k < R; ++k) {
          ASSERT_EQ(packed[i * R + k], sampled.GetIndex((l * N + i) * R + k) + cu[i])
              << "l " << l << " i " << i << " k " << k;
        }
      }
    }
  }
}

// Sequence i's subset does not change when its neighbours' lengths change.
TEST(SamplePackedTokensTest, SelectionIgnoresTheNeighbours) {
  std::mt19937_64 rng(9);
  const PackedRule rule{1, 2, 1};
  const std::vector<int64_t> a = {0, 5, 45, 50}, b = {0, 90, 130, 131};  // sequence 1: 40 tokens
  PackedCase ca(a, 50, rule, 2, KeptOf(a, rule), {}, rng);
  PackedCase cb(b, 131, rule, 2, KeptOf(b, rule), {}, rng);
  cb.args.seed = ca.args.seed;
  cb.args.step = ca.args.step;
  ASSERT_OK(cpu::SamplePackedTokens(ca.args, nullptr));
  ASSERT_OK(cpu::SamplePackedTokens(cb.args, Pool(3)));
  const int64_t ka = KeptOf(a, rule), kb = KeptOf(b, rule);
  for (int64_t l = 0; l < 2; ++l) {
    const std::vector<int64_t> pa = Values(*ca.positions, l, ka), pb = Values(*cb.positions, l, kb);
    // Sequence 1 keeps 20 tokens: entries [3, 23) in a, [45, 65) in b.
    EXPECT_EQ(std::vector<int64_t>(pa.begin() + 3, pa.begin() + 23),
              std::vector<int64_t>(pb.begin() + 45, pb.begin() + 65));
  }
}

// Each token of a sequence is kept with probability r_i / n_i.
TEST(SamplePackedTokensTest, InclusionFrequencyIsRiOverNi) {
  std::mt19937_64 rng(10);
  const std::vector<int64_t> cu = {0, 10, 13, 50};
  const PackedRule rule{3, 10, 0};  // r = [3, 1, 12]
  const int64_t kept = KeptOf(cu, rule), L = 8, trials = 500;
  std::vector<int64_t> hits(50, 0);
  PackedCase c(cu, 50, rule, L, kept, {.positions = false, .inverse = false}, rng);
  for (int64_t step = 0; step < trials; ++step) {
    c.args.step = static_cast<uint64_t>(step);
    ASSERT_OK(cpu::SamplePackedTokens(c.args, nullptr));
    for (int64_t l = 0; l < L; ++l) {
      for (int64_t id : Values(c.ids, l, kept)) ++hits[id];
    }
  }
  const double draws = static_cast<double>(trials * L);
  for (int64_t i = 0; i < 3; ++i) {
    const double p = static_cast<double>(testing::ReferenceKeep(cu[i + 1] - cu[i], rule)) /
                     static_cast<double>(cu[i + 1] - cu[i]);
    const double sigma = std::sqrt(p * (1 - p) / draws);
    for (int64_t t = cu[i]; t < cu[i + 1]; ++t) {
      EXPECT_NEAR(hits[t] / draws, p, 5 * sigma + 1e-9) << "token " << t;
    }
  }
}

// out equals GatherTokens of activations [1,T,C] with ids [1,T'].
TEST(SamplePackedTokensTest, FusedGatherEqualsGatherTokens) {
  std::mt19937_64 rng(11);
  for (int iter = 0; iter < 20; ++iter) {
    int64_t T = 0;
    const std::vector<int64_t> cu = RandomPack(rng, &T);
    const PackedRule rule{2, 3, 1};
    const int64_t kept = KeptOf(cu, rule), C = 1 + static_cast<int64_t>(rng() % 70);
    PackedCase c(cu, T, rule, 1, kept, {.channels = C, .dtype = DType::kBFloat16}, rng);
    ASSERT_OK(cpu::SamplePackedTokens(c.args, Pool(3)));
    TestTensor gathered(DType::kBFloat16, {1, kept, C});
    GatherTokensArgs gather;
    gather.activations = c.activations->view();
    gather.activations.rank = 3;
    gather.activations.shape[0] = 1;
    gather.activations.shape[1] = T;
    gather.activations.shape[2] = C;
    gather.activations.strides[0] = T * C;
    gather.activations.strides[1] = C;
    gather.activations.strides[2] = 1;
    gather.indices = c.ids.view();
    gather.out = gathered.view();
    gather.batch_first = true;
    ASSERT_OK(cpu::GatherTokens(gather, nullptr));
    for (int64_t e = 0; e < kept * C; ++e) {
      ASSERT_EQ(gathered.ElementBytes(e), c.out->ElementBytes(e)) << "iter " << iter << " e " << e;
    }
  }
}

// Segment ids of the kept tokens (sequence i + 1) through SegmentSeqlens
// reproduce cu_seqlens_kept (empty sequences have no segment there).
TEST(SamplePackedTokensTest, KeptSegmentsThroughSegmentSeqlensGiveCuSeqlensKept) {
  std::mt19937_64 rng(12);
  const std::vector<int64_t> cu = {0, 7, 8, 20, 51, 52};
  const PackedRule rule{1, 2, 1};
  const int64_t kept = KeptOf(cu, rule), N = 5;
  PackedCase c(cu, 52, rule, 1, kept, {}, rng);
  ASSERT_OK(cpu::SamplePackedTokens(c.args, nullptr));
  const std::vector<int64_t> ids = Values(c.ids, 0, kept);
  TestTensor seg(DType::kInt32, {1, kept});
  for (int64_t j = 0; j < kept; ++j) {
    int64_t i = 0;
    while (cu[i + 1] <= ids[j]) ++i;
    seg.SetIndex(j, i + 1);
  }
  TestTensor seqlen(DType::kInt32, {1, N}), offset(DType::kInt32, {1, N + 1});
  TestTensor packed_seqlens(DType::kInt32, {N}), packed_offsets(DType::kInt32, {N + 1}),
      packed_cu(DType::kInt32, {N + 1});
  SegmentSeqlensArgs segs;
  segs.segment_ids_q = seg.view();
  segs.max_segments = N;
  segs.q.seqlen = seqlen.view();
  segs.q.offset = offset.view();
  segs.q.packed = PackedSeqlens{packed_seqlens.view(), packed_offsets.view(), packed_cu.view()};
  ASSERT_OK(cpu::SegmentSeqlens(segs, nullptr));
  EXPECT_EQ(Values(packed_cu, 0, N + 1), Values(c.cu_kept, 0, N + 1));
}

// The 128-bit keep rule: scaling keep_num / keep_den by k changes nothing,
// up to keep_den near 2^63, and r_i stays in [min(min_tokens, n), n].
TEST(SamplePackedTokensTest, KeepRuleIsExactForHugeDenominators) {
  std::mt19937_64 rng(13);
  for (int iter = 0; iter < 5000; ++iter) {
    const int64_t n = iter % 7 == 0 ? 2147483647 : static_cast<int64_t>(rng() % 100000);
    const int64_t den = 1 + static_cast<int64_t>(rng() % 1000);
    const int64_t num = static_cast<int64_t>(rng() % (den + 1));
    const int64_t min_tokens = static_cast<int64_t>(rng() % 4);
    const int64_t scale = int64_t{1} << (rng() % 53);  // den * scale < 2^63
    const int64_t want = testing::ReferenceKeep(n, {num, den, min_tokens});
    ASSERT_EQ(PackedKeep(n, num, den, min_tokens), want) << n << " " << num << "/" << den;
    ASSERT_EQ(PackedKeep(n, num * scale, den * scale, min_tokens), want)
        << n << " " << num << "/" << den << " x" << scale;
  }
  EXPECT_EQ(PackedKeep(2147483647, INT64_MAX, INT64_MAX, 0), 2147483647);
  EXPECT_EQ(PackedKeep(2147483647, INT64_MAX - 1, INT64_MAX, 0), 2147483647);
  EXPECT_EQ(PackedKeep(2147483647, 1, INT64_MAX, 0), 1);
  EXPECT_EQ(PackedKeep(0, 1, 1, 5), 0);
}

// The result does not depend on the thread count or on repetition.
TEST(SamplePackedTokensTest, SameResultForAnyThreadCount) {
  std::mt19937_64 rng(14);
  std::vector<int64_t> cu = {0};
  for (int i = 0; i < 2000; ++i) cu.push_back(cu.back() + static_cast<int64_t>(rng() % 40));
  const PackedRule rule{1, 4, 2};
  const int64_t kept = KeptOf(cu, rule);
  PackedCase one(cu, cu.back(), rule, 2, kept, {}, rng);
  ASSERT_OK(cpu::SamplePackedTokens(one.args, nullptr));
  for (int rep = 0; rep < 3; ++rep) {
    PackedCase three(cu, cu.back(), rule, 2, kept, {}, rng);
    three.args.seed = one.args.seed;
    three.args.step = one.args.step;
    ASSERT_OK(cpu::SamplePackedTokens(three.args, Pool(3)));
    EXPECT_EQ(three.ids.Bytes(), one.ids.Bytes());
    EXPECT_EQ(three.inverse->Bytes(), one.inverse->Bytes());
  }
}

}  // namespace
}  // namespace tokensel::kernels
