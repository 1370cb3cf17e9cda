// MergeTokens / SplitTokens: the spec vectors (docs/ops.md sections 9-10),
// randomized comparison with the naive references of merge_split_reference.h
// over element sizes, index dtypes, layouts, in-place forms and thread
// counts, the algebra the autograd pair relies on (Merge(x, Gather(x)) == x,
// Split then Scatter == the input), and every error writing nothing.
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/kernels/gather_reference.h"
#include "tests/kernels/merge_split_reference.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_tensor.h"

namespace tokensel::testing::merge_split_test {
namespace {

using kernels::DType;
using kernels::MergeTokensArgs;
using kernels::SplitTokensArgs;
using kernels::cpu::ThreadPool;

ThreadPool* Pool3() {
  static ThreadPool* pool = new ThreadPool(3);
  return pool;
}

// ---------------------------------------------------------------- spec vectors

// x[0,s,:] = [10s, 10s+1], S = 5; layer rows [100,101], [200,201] at [1, 3].
TEST(MergeTokensSpec, BatchFirstFp32OutOfPlaceAndInPlace) {
  TestTensor x(DType::kFloat32, {1, 5, 2}), layer(DType::kFloat32, {1, 2, 2});
  TestTensor idx(DType::kInt32, {1, 2}), out(DType::kFloat32, {1, 5, 2});
  for (int s = 0; s < 5; ++s) {
    x.Set<float>(s * 2, 10.0f * s);
    x.Set<float>(s * 2 + 1, 10.0f * s + 1);
  }
  for (int i = 0; i < 4; ++i) layer.Set<float>(i, std::vector<float>{100, 101, 200, 201}[i]);
  idx.SetIndex(0, 1);
  idx.SetIndex(1, 3);
  const std::vector<float> want = {0, 1, 100, 101, 20, 21, 200, 201, 40, 41};
  const std::vector<uint8_t> x_before = x.Bytes();
  ASSERT_OK(
      kernels::cpu::MergeTokens({x.view(), layer.view(), idx.view(), out.view(), true}, nullptr));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(out.Get<float>(i), want[i]) << i;
  EXPECT_EQ(x.Bytes(), x_before) << "x is an input";
  ASSERT_OK(
      kernels::cpu::MergeTokens({x.view(), layer.view(), idx.view(), x.view(), true}, nullptr));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(x.Get<float>(i), want[i]) << i;
}

// grad rows [1..5], idx [[0, 2]] -> layer_grad [[1],[3]], rest [0,2,0,4,5].
TEST(SplitTokensSpec, BatchFirstFp32OutOfPlaceAndInPlace) {
  TestTensor grad(DType::kFloat32, {1, 5, 1}), idx(DType::kInt64, {1, 2});
  TestTensor layer_grad(DType::kFloat32, {1, 2, 1}), rest(DType::kFloat32, {1, 5, 1});
  for (int s = 0; s < 5; ++s) grad.Set<float>(s, s + 1.0f);
  idx.SetIndex(0, 0);
  idx.SetIndex(1, 2);
  const std::vector<float> want_rest = {0, 2, 0, 4, 5};
  ASSERT_OK(kernels::cpu::SplitTokens(
      {grad.view(), idx.view(), layer_grad.view(), rest.view(), true}, nullptr));
  EXPECT_EQ(layer_grad.Get<float>(0), 1.0f);
  EXPECT_EQ(layer_grad.Get<float>(1), 3.0f);
  for (int s = 0; s < 5; ++s) EXPECT_EQ(rest.Get<float>(s), want_rest[s]) << s;
  ASSERT_OK(kernels::cpu::SplitTokens(
      {grad.view(), idx.view(), layer_grad.view(), grad.view(), true}, nullptr));
  EXPECT_EQ(layer_grad.Get<float>(1), 3.0f) << "read before the row was zeroed";
  for (int s = 0; s < 5; ++s) EXPECT_EQ(grad.Get<float>(s), want_rest[s]) << s;
}

// ------------------------------------------------------------ randomized tests

struct Case {
  DType dtype;
  DType idx_dtype;
  bool batch_first;
  int64_t batch, seq, retained, channels;
  ViewKind in_kind, out_kind;
};

std::vector<int64_t> TokensShape(const Case& k, int64_t n) {
  return k.batch_first ? std::vector<int64_t>{k.batch, n, k.channels}
                       : std::vector<int64_t>{n, k.batch, k.channels};
}

HeldView UniqueIndices(const Case& k, std::mt19937_64& rng) {
  HeldView idx = MakeHeld(k.idx_dtype, {k.batch, k.retained},
                          rng() % 2 ? ViewKind::kMisaligned : ViewKind::kContiguous, rng);
  std::vector<int64_t> perm(static_cast<size_t>(k.seq));
  for (int64_t b = 0; b < k.batch; ++b) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t r = 0; r < k.retained; ++r) idx.tensor.SetIndex(b * k.retained + r, perm[r]);
  }
  return idx;
}

std::string Describe(const Case& k) {
  return ::testing::PrintToString(
      std::vector<int64_t>{static_cast<int64_t>(k.dtype), static_cast<int64_t>(k.idx_dtype),
                           k.batch_first, k.batch, k.seq, k.retained, k.channels,
                           static_cast<int64_t>(k.in_kind), static_cast<int64_t>(k.out_kind)});
}

std::vector<Case> RandomCases(std::mt19937_64& rng) {
  const ViewKind out_kinds[] = {ViewKind::kContiguous, ViewKind::kPadded, ViewKind::kMisaligned,
                                ViewKind::kChannelStride2, ViewKind::kChannelOffset};
  const DType dtypes[] = {DType::kBool,    DType::kInt8,    DType::kFloat16,
                          DType::kFloat32, DType::kFloat64, DType::kInt64};
  const int64_t channel_choices[] = {0, 1, 3, 7, 16, 33};
  std::vector<Case> cases;
  for (DType dtype : dtypes) {
    for (DType idx_dtype : {DType::kInt32, DType::kInt64}) {
      for (bool batch_first : {true, false}) {
        for (ViewKind in_kind : kAllViewKinds) {
          Case k{dtype, idx_dtype, batch_first, 0, 0, 0, 0, in_kind, ViewKind::kContiguous};
          k.batch = static_cast<int64_t>(rng() % 4);
          k.seq = 1 + static_cast<int64_t>(rng() % 9);
          k.retained = static_cast<int64_t>(rng() % (k.seq + 1));
          k.channels = channel_choices[rng() % 6];
          k.out_kind = out_kinds[rng() % 5];
          cases.push_back(k);
        }
      }
    }
  }
  // Many rows (several parallel chunks), S not a multiple of 64, and rows
  // large enough for the streaming-store copy.
  cases.push_back({DType::kFloat32, DType::kInt32, true, 7, 131, 65, 9, ViewKind::kPadded,
                   ViewKind::kMisaligned});
  cases.push_back({DType::kBFloat16, DType::kInt64, false, 3, 700, 350, 1100, ViewKind::kContiguous,
                   ViewKind::kPadded});
  cases.push_back({DType::kFloat32, DType::kInt32, true, 2, 600, 300, 2051, ViewKind::kMisaligned,
                   ViewKind::kContiguous});
  return cases;
}

void RunMerge(const Case& k, std::mt19937_64& rng) {
  SCOPED_TRACE(Describe(k));
  HeldView x = MakeHeld(k.dtype, TokensShape(k, k.seq), k.in_kind, rng);
  HeldView layer = MakeHeld(k.dtype, TokensShape(k, k.retained), k.in_kind, rng);
  HeldView idx = UniqueIndices(k, rng);
  HeldView out = MakeHeld(k.dtype, TokensShape(k, k.seq), k.out_kind, rng);
  HeldView expected = out.Clone();
  RefMerge(x.view, layer.view, idx.view, expected.view, k.batch_first);
  const std::vector<uint8_t> x_before = x.tensor.Bytes();
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), Pool3()}) {
    HeldView got = out.Clone();
    ASSERT_OK(
        kernels::cpu::MergeTokens({x.view, layer.view, idx.view, got.view, k.batch_first}, pool));
    ASSERT_EQ(got.tensor.Bytes(), expected.tensor.Bytes());
    ASSERT_EQ(x.tensor.Bytes(), x_before);
  }
  if (k.in_kind == ViewKind::kBroadcast0) return;  // x is written in place below
  HeldView in_place_expected = x.Clone();
  RefMerge(in_place_expected.view, layer.view, idx.view, in_place_expected.view, k.batch_first);
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), Pool3()}) {
    HeldView got = x.Clone();
    ASSERT_OK(
        kernels::cpu::MergeTokens({got.view, layer.view, idx.view, got.view, k.batch_first}, pool));
    ASSERT_EQ(got.tensor.Bytes(), in_place_expected.tensor.Bytes());
  }
}

void RunSplit(const Case& k, std::mt19937_64& rng) {
  SCOPED_TRACE(Describe(k));
  HeldView grad = MakeHeld(k.dtype, TokensShape(k, k.seq), k.in_kind, rng);
  HeldView idx = UniqueIndices(k, rng);
  HeldView layer_grad = MakeHeld(k.dtype, TokensShape(k, k.retained), k.out_kind, rng);
  HeldView rest = MakeHeld(k.dtype, TokensShape(k, k.seq), k.out_kind, rng);
  HeldView want_layer = layer_grad.Clone(), want_rest = rest.Clone();
  RefSplit(grad.view, idx.view, want_layer.view, want_rest.view, k.batch_first);
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), Pool3()}) {
    HeldView got_layer = layer_grad.Clone(), got_rest = rest.Clone();
    ASSERT_OK(kernels::cpu::SplitTokens(
        {grad.view, idx.view, got_layer.view, got_rest.view, k.batch_first}, pool));
    ASSERT_EQ(got_layer.tensor.Bytes(), want_layer.tensor.Bytes());
    ASSERT_EQ(got_rest.tensor.Bytes(), want_rest.tensor.Bytes());
  }
  if (k.in_kind == ViewKind::kBroadcast0) return;  // grad is written in place below
  HeldView in_place_layer = layer_grad.Clone(), in_place_grad = grad.Clone();
  RefSplit(in_place_grad.view, idx.view, in_place_layer.view, in_place_grad.view, k.batch_first);
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), Pool3()}) {
    HeldView got_layer = layer_grad.Clone(), got_grad = grad.Clone();
    ASSERT_OK(kernels::cpu::SplitTokens(
        {got_grad.view, idx.view, got_layer.view, got_grad.view, k.batch_first}, pool));
    ASSERT_EQ(got_layer.tensor.Bytes(), in_place_layer.tensor.Bytes());
    ASSERT_EQ(got_grad.tensor.Bytes(), in_place_grad.tensor.Bytes());
  }
}

TEST(MergeTokensRandom, MatchesReference) {
  std::mt19937_64 rng(91);
  for (const Case& k : RandomCases(rng)) RunMerge(k, rng);
}

TEST(SplitTokensRandom, MatchesReference) {
  std::mt19937_64 rng(92);
  for (const Case& k : RandomCases(rng)) RunSplit(k, rng);
}

// The algebra of the autograd pair, bit for bit: merging back what was
// gathered gives x; scattering Split's layer_grad into its rest_grad gives
// the gradient back (the rows Scatter writes are exactly the rows Split
// zeroed, so no addition happens).
TEST(MergeSplitAlgebra, RoundTripsAreBitExact) {
  std::mt19937_64 rng(93);
  for (DType dtype : {DType::kFloat16, DType::kFloat32, DType::kFloat64}) {
    for (bool batch_first : {true, false}) {
      Case k{dtype, DType::kInt64,     batch_first,          3, 37, 20,
             5,     ViewKind::kPadded, ViewKind::kMisaligned};
      SCOPED_TRACE(Describe(k));
      HeldView x = MakeHeld(dtype, TokensShape(k, k.seq), ViewKind::kMisaligned, rng);
      HeldView idx = UniqueIndices(k, rng);
      HeldView part = MakeHeld(dtype, TokensShape(k, k.retained), ViewKind::kPadded, rng);
      ASSERT_OK(kernels::cpu::GatherTokens({x.view, idx.view, part.view, batch_first}, Pool3()));
      // Padded storage, compared whole: both copies start with the same gaps.
      HeldView merged = MakeHeld(dtype, TokensShape(k, k.seq), ViewKind::kPadded, rng);
      HeldView x_copy = merged.Clone();
      ASSERT_OK(kernels::cpu::MergeTokens({x.view, part.view, idx.view, merged.view, batch_first},
                                          Pool3()));
      RefMerge(x.view, part.view, idx.view, x_copy.view, batch_first);  // = x, in x_copy's layout
      EXPECT_EQ(merged.tensor.Bytes(), x_copy.tensor.Bytes());

      HeldView layer_grad = MakeHeld(dtype, TokensShape(k, k.retained), ViewKind::kPadded, rng);
      HeldView rest = merged.Clone();
      ASSERT_OK(kernels::cpu::SplitTokens(
          {merged.view, idx.view, layer_grad.view, rest.view, batch_first}, Pool3()));
      ASSERT_OK(kernels::cpu::ScatterTokens({rest.view, layer_grad.view, idx.view, batch_first},
                                            Pool3()));
      EXPECT_EQ(rest.tensor.Bytes(), merged.tensor.Bytes());
    }
  }
}

// ---------------------------------------------------------------- errors

using ::testing::HasSubstr;
constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

// B rows, S = 6, R = 4, C = 3, bf16; indices (r + b) % 6.
struct PairSetup {
  TestTensor x, layer, idx, out;
  explicit PairSetup(int64_t rows)
      : x(DType::kBFloat16, {rows, 6, 3}),
        layer(DType::kBFloat16, {rows, 4, 3}),
        idx(DType::kInt64, {rows, 4}),
        out(DType::kBFloat16, {rows, 6, 3}) {
    std::mt19937_64 rng(7);
    x.FillRandom(rng);
    layer.FillRandom(rng);
    out.FillRandom(rng);
    for (int64_t b = 0; b < rows; ++b)
      for (int64_t r = 0; r < 4; ++r) idx.SetIndex(b * 4 + r, (r + b) % 6);
  }
  MergeTokensArgs Merge() { return {x.view(), layer.view(), idx.view(), out.view(), true}; }
  // grad = x, layer_grad = layer, rest_grad = out.
  SplitTokensArgs Split() { return {x.view(), idx.view(), layer.view(), out.view(), true}; }
};

// Null, 1- and 3-thread pools: the same message (the lowest bad element),
// and no byte of any tensor changed.
template <typename ArgsT, typename Op>
void ExpectError(Op op, const ArgsT& args, PairSetup& s, const std::string& message) {
  const std::vector<uint8_t> x = s.x.Bytes(), layer = s.layer.Bytes(), out = s.out.Bytes();
  ThreadPool pool1(1);
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool1, Pool3()}) {
    EXPECT_THAT(op(args, pool), StatusIs(kInvalid, message));
    EXPECT_EQ(s.x.Bytes(), x);
    EXPECT_EQ(s.layer.Bytes(), layer);
    EXPECT_EQ(s.out.Bytes(), out);
  }
}

TEST(MergeSplitErrors, FirstBadIndexWritesNothingInEitherForm) {
  PairSetup s(400);
  s.idx.SetIndex(300 * 4 + 1, 6);   // out of range, later row
  s.idx.SetIndex(120 * 4 + 3, 99);  // out of range after the duplicate in the same row
  s.idx.SetIndex(120 * 4 + 2, 0);   // duplicates position 0 of row 120 (0 + 120) % 6 = 0
  const std::string dup =
      "indices[120,2] = 0 duplicates indices[120,0] (indices must be unique within a row)";
  ExpectError(kernels::cpu::MergeTokens, s.Merge(), s, dup);
  ExpectError(kernels::cpu::SplitTokens, s.Split(), s, dup);
  MergeTokensArgs merge_in_place = s.Merge();
  merge_in_place.out = merge_in_place.x;
  ExpectError(kernels::cpu::MergeTokens, merge_in_place, s, dup);
  SplitTokensArgs split_in_place = s.Split();
  split_in_place.rest_grad = split_in_place.grad;
  ExpectError(kernels::cpu::SplitTokens, split_in_place, s, dup);
  s.idx.SetIndex(7 * 4 + 0, -1);
  ExpectError(kernels::cpu::MergeTokens, s.Merge(), s, "indices[7,0] = -1 is out of range [0, 6)");
  ExpectError(kernels::cpu::SplitTokens, s.Split(), s, "indices[7,0] = -1 is out of range [0, 6)");
}

// Two views with the same element addresses are the same view even when a
// dim of size 1 carries another stride (B = 1 tensors made separately).
TEST(MergeSplitEdge, InPlaceWhatTheStrideOfASizeOneDimSays) {
  PairSetup s(1);
  MergeTokensArgs m = s.Merge();
  m.out = m.x;
  m.out.strides[0] = 12345;
  ASSERT_TRUE(kernels::SameView(m.out, m.x));
  TestTensor want = s.x;
  RefMerge(m.x, m.layer, m.indices, want.view(), true);
  ASSERT_OK(kernels::cpu::MergeTokens(m, Pool3()));
  EXPECT_EQ(s.x.Bytes(), want.Bytes());
  m.out.strides[1] += 1;  // a dim of size 6: another view, overlapping x
  EXPECT_FALSE(kernels::SameView(m.out, m.x));
  EXPECT_THAT(kernels::cpu::MergeTokens(m, Pool3()), StatusIs(kInvalid, HasSubstr("out")));
}

TEST(MergeSplitErrors, MetadataNamesTheField) {
  PairSetup s(2);
  MergeTokensArgs m = s.Merge();
  m.out.shape[1] = 5;  // out must be shaped like x
  EXPECT_THAT(kernels::cpu::MergeTokens(m, nullptr), StatusIs(kInvalid, HasSubstr("out")));
  m = s.Merge();
  m.out = m.x;
  m.out.data = static_cast<char*>(m.x.data) + 2;  // overlaps x without being x
  EXPECT_THAT(kernels::cpu::MergeTokens(m, nullptr),
              StatusIs(kInvalid, HasSubstr("out: overlaps x (outputs must not alias inputs)")));
  m = s.Merge();
  m.layer.dtype = DType::kFloat16;
  EXPECT_THAT(kernels::cpu::MergeTokens(m, nullptr), StatusIs(kInvalid, HasSubstr("layer")));
  m = s.Merge();
  m.out = m.layer;  // out overlaps layer (and has the wrong shape)
  EXPECT_THAT(kernels::cpu::MergeTokens(m, nullptr), StatusIs(kInvalid, HasSubstr("out")));

  SplitTokensArgs p = s.Split();
  p.layer_grad = p.grad;  // layer_grad must be [B,R,C] and disjoint from grad
  EXPECT_THAT(kernels::cpu::SplitTokens(p, nullptr), StatusIs(kInvalid, HasSubstr("layer_grad")));
  p = s.Split();
  p.rest_grad.data = static_cast<char*>(p.grad.data) + 2;
  p.rest_grad.strides[0] = p.grad.strides[0];
  p.rest_grad.strides[1] = p.grad.strides[1];
  p.rest_grad.strides[2] = p.grad.strides[2];
  EXPECT_THAT(kernels::cpu::SplitTokens(p, nullptr),
              StatusIs(kInvalid, HasSubstr("rest_grad: overlaps grad")));
  p = s.Split();
  p.indices.dtype = DType::kFloat32;
  EXPECT_THAT(kernels::cpu::SplitTokens(p, nullptr), StatusIs(kInvalid, HasSubstr("indices")));
}

// B in {0, 1, 2} x R in {0, 1, 3}: R = 0 merges to a copy of x and splits to
// an untouched copy of grad; B = 0 writes nothing. Against the references.
TEST(MergeSplitEdge, EmptyAndSingleSizes) {
  for (int64_t batch : {0, 1, 2}) {
    for (int64_t retained : {0, 1, 3}) {
      SCOPED_TRACE(::testing::PrintToString(std::vector<int64_t>{batch, retained}));
      PairSetup s(batch);
      MergeTokensArgs m = s.Merge();
      m.layer.shape[1] = retained;
      m.indices.shape[1] = retained;
      TestTensor want = s.out;
      RefMerge(m.x, m.layer, m.indices, want.view(), true);
      ASSERT_OK(kernels::cpu::MergeTokens(m, Pool3()));
      EXPECT_EQ(s.out.Bytes(), want.Bytes());

      SplitTokensArgs p = s.Split();
      p.layer_grad.shape[1] = retained;
      p.indices.shape[1] = retained;
      TestTensor want_layer = s.layer, want_rest = s.out;
      kernels::TensorView want_layer_view = want_layer.view();
      want_layer_view.shape[1] = retained;
      RefSplit(p.grad, p.indices, want_layer_view, want_rest.view(), true);
      ASSERT_OK(kernels::cpu::SplitTokens(p, Pool3()));
      EXPECT_EQ(s.layer.Bytes(), want_layer.Bytes());
      EXPECT_EQ(s.out.Bytes(), want_rest.Bytes());
    }
  }
}

}  // namespace
}  // namespace tokensel::testing::merge_split_test
