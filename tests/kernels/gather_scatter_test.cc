// GatherTokens / ScatterTokens: spec vectors (docs/ops.md sections 2-3),
// randomized comparison with the naive reference in gather_reference.h over
// element sizes, index dtypes, layouts and thread counts, round trips, and
// every error (with the outputs byte-identical afterwards).
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/kernels/gather_reference.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_tensor.h"

namespace tokensel::testing::gather_scatter_test {
namespace {

using kernels::DType;
using kernels::GatherTokensArgs;
using kernels::ScatterTokensArgs;
using kernels::TensorView;
using kernels::cpu::ThreadPool;

constexpr DType kDataDTypes[] = {DType::kBool,     DType::kInt8,    DType::kFloat16,
                                 DType::kBFloat16, DType::kFloat32, DType::kFloat64,
                                 DType::kInt64};

ThreadPool* Pool3() {
  static ThreadPool* pool = new ThreadPool(3);
  return pool;
}

TestTensor Indices(DType dtype, int64_t rows, int64_t n, const std::vector<int64_t>& values) {
  TestTensor t(dtype, {rows, n});
  for (size_t i = 0; i < values.size(); ++i) t.SetIndex(static_cast<int64_t>(i), values[i]);
  return t;
}

// ---------------------------------------------------------------- spec vectors

TEST(GatherTokensSpec, BatchFirstFp32) {
  TestTensor act(DType::kFloat32, {2, 4, 4});
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t s = 0; s < 4; ++s)
      for (int64_t c = 0; c < 4; ++c) act.Set<float>((b * 4 + s) * 4 + c, 100 * b + 10 * s + c);
  TestTensor idx = Indices(DType::kInt32, 2, 2, {0, 2, 1, 3});
  TestTensor out(DType::kFloat32, {2, 2, 4});
  ASSERT_OK(kernels::cpu::GatherTokens({act.view(), idx.view(), out.view(), true}, nullptr));
  const float expected[] = {0, 1, 2, 3, 20, 21, 22, 23, 110, 111, 112, 113, 130, 131, 132, 133};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(out.Get<float>(i), expected[i]) << i;
}

TEST(GatherTokensSpec, SeqFirstFp16) {
  TestTensor act(DType::kFloat16, {4, 2, 8});
  for (int s = 0; s < 4; ++s)
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 8; ++c)
        act.Set<uint16_t>((s * 2 + b) * 8 + c, HalfBitsOfInt(100 * b + 10 * s + c));
  TestTensor idx = Indices(DType::kInt64, 2, 2, {1, 3, 0, 2});
  TestTensor out(DType::kFloat16, {2, 2, 8});
  ASSERT_OK(kernels::cpu::GatherTokens({act.view(), idx.view(), out.view(), false}, nullptr));
  const int starts[2][2] = {{10, 100}, {30, 120}};  // out[r][b] = start..start+7
  for (int r = 0; r < 2; ++r)
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 8; ++c)
        EXPECT_EQ(out.Get<uint16_t>((r * 2 + b) * 8 + c), HalfBitsOfInt(starts[r][b] + c));
}

TEST(GatherTokensSpec, ChannelOffsetView) {
  TestTensor base(DType::kFloat32, {1, 3, 8});
  for (int s = 0; s < 3; ++s)
    for (int c = 0; c < 8; ++c) base.Set<float>(s * 8 + c, 10 * s + c);
  TensorView act = TensorView::Strided(base.ElementPtr(1), DType::kFloat32, {1, 3, 4}, {24, 8, 1});
  TestTensor idx = Indices(DType::kInt32, 1, 2, {2, 0});
  TestTensor out(DType::kFloat32, {1, 2, 4});
  ASSERT_OK(kernels::cpu::GatherTokens({act, idx.view(), out.view(), true}, Pool3()));
  const float expected[] = {21, 22, 23, 24, 1, 2, 3, 4};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out.Get<float>(i), expected[i]) << i;
}

TEST(GatherTokensSpec, OddChannelsAndIdentity) {
  TestTensor act(DType::kFloat32, {1, 3, 6});
  for (int s = 0; s < 3; ++s)
    for (int c = 0; c < 6; ++c) act.Set<float>(s * 6 + c, 10 * s + c);
  TestTensor idx = Indices(DType::kInt32, 1, 2, {2, 1});
  TestTensor out(DType::kFloat32, {1, 2, 6});
  ASSERT_OK(kernels::cpu::GatherTokens({act.view(), idx.view(), out.view(), true}, nullptr));
  for (int c = 0; c < 6; ++c) {
    EXPECT_EQ(out.Get<float>(c), 20 + c);
    EXPECT_EQ(out.Get<float>(6 + c), 10 + c);
  }
  // fp16 C=12 identity gather.
  std::mt19937_64 rng(1);
  TestTensor act16(DType::kFloat16, {1, 5, 12});
  act16.FillRandom(rng);
  TestTensor idx16 = Indices(DType::kInt64, 1, 5, {0, 1, 2, 3, 4});
  TestTensor out16(DType::kFloat16, {1, 5, 12});
  ASSERT_OK(kernels::cpu::GatherTokens({act16.view(), idx16.view(), out16.view(), true}, nullptr));
  for (int i = 0; i < 60; ++i) EXPECT_EQ(out16.Get<uint16_t>(i), act16.Get<uint16_t>(i)) << i;
}

TEST(GatherTokensSpec, WideRowC4100) {
  TestTensor act(DType::kFloat32, {1, 2, 4100});
  for (int s = 0; s < 2; ++s)
    for (int c = 0; c < 4100; ++c) act.Set<float>(s * 4100 + c, 10000 * s + c);
  TestTensor idx = Indices(DType::kInt32, 1, 1, {1});
  TestTensor out(DType::kFloat32, {1, 1, 4100});
  ASSERT_OK(kernels::cpu::GatherTokens({act.view(), idx.view(), out.view(), true}, Pool3()));
  for (int c = 0; c < 4100; ++c) ASSERT_EQ(out.Get<float>(c), 10000 + c) << c;
}

TEST(GatherTokensSpec, SpecialValuesCopiedBitForBit) {
  // fp16: qNaN/sNaN with payloads, -0, min/max subnormal, inf; bf16 likewise.
  const uint16_t fp16[] = {0x7E01, 0x7C01, 0xFD55, 0x8000, 0x0001, 0x03FF, 0x7C00, 0x83FF};
  const uint16_t bf16[] = {0x7FC1, 0x7F81, 0xFFAA, 0x8000, 0x0001, 0x007F, 0x7F80, 0x807F};
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    const uint16_t* bits = dtype == DType::kFloat16 ? fp16 : bf16;
    for (ViewKind kind : {ViewKind::kContiguous, ViewKind::kChannelStride2}) {
      std::mt19937_64 rng(7);
      HeldView act = MakeHeld(dtype, {1, 2, 8}, kind, rng);
      for (int c = 0; c < 8; ++c) std::memcpy(RefElem(act.view, {0, 1, c}), &bits[c], 2);
      TestTensor idx = Indices(DType::kInt32, 1, 1, {1});
      TestTensor out(dtype, {1, 1, 8});
      ASSERT_OK(kernels::cpu::GatherTokens({act.view, idx.view(), out.view(), true}, nullptr));
      for (int c = 0; c < 8; ++c) EXPECT_EQ(out.Get<uint16_t>(c), bits[c]) << c;
    }
  }
}

TEST(ScatterTokensSpec, BatchFirstZeros) {
  TestTensor all(DType::kFloat32, {1, 5, 4});
  TestTensor layer(DType::kFloat32, {1, 2, 4});
  for (int c = 0; c < 4; ++c) {
    layer.Set<float>(c, 1);
    layer.Set<float>(4 + c, 2);
  }
  TestTensor idx = Indices(DType::kInt32, 1, 2, {1, 4});
  ASSERT_OK(kernels::cpu::ScatterTokens({all.view(), layer.view(), idx.view(), true}, nullptr));
  const float rows[] = {0, 1, 0, 0, 2};
  for (int s = 0; s < 5; ++s)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(all.Get<float>(s * 4 + c), rows[s]) << s << "," << c;
}

TEST(ScatterTokensSpec, SeqFirstFp16) {
  TestTensor all(DType::kFloat16, {3, 2, 8});
  for (int i = 0; i < 48; ++i) all.Set<uint16_t>(i, HalfBitsOfInt(-1));
  TestTensor layer(DType::kFloat16, {2, 2, 8});
  for (int r = 0; r < 2; ++r)
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 8; ++c)
        layer.Set<uint16_t>((r * 2 + b) * 8 + c, HalfBitsOfInt(10 * b + r + 1));
  TestTensor idx = Indices(DType::kInt64, 2, 2, {0, 2, 1, 2});
  ASSERT_OK(kernels::cpu::ScatterTokens({all.view(), layer.view(), idx.view(), false}, Pool3()));
  const int expected[3][2] = {{1, -1}, {-1, 11}, {2, 12}};
  for (int s = 0; s < 3; ++s)
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 8; ++c)
        EXPECT_EQ(all.Get<uint16_t>((s * 2 + b) * 8 + c), HalfBitsOfInt(expected[s][b]));
}

// ------------------------------------------------------------ randomized tests

struct Case {
  DType dtype;
  DType idx_dtype;
  bool batch_first;
  int64_t batch, seq, retained, channels;
  ViewKind in_kind, out_kind;
  bool idx_strided;  // padded + misaligned index view
};

std::vector<int64_t> TokensShape(const Case& k, int64_t n) {
  return k.batch_first ? std::vector<int64_t>{k.batch, n, k.channels}
                       : std::vector<int64_t>{n, k.batch, k.channels};
}

HeldView MakeIndices(const Case& k, bool unique, std::mt19937_64& rng) {
  HeldView idx = MakeHeld(k.idx_dtype, {k.batch, k.retained},
                          k.idx_strided ? ViewKind::kMisaligned : ViewKind::kContiguous, rng);
  std::vector<int64_t> perm(static_cast<size_t>(k.seq));
  for (int64_t b = 0; b < k.batch; ++b) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t r = 0; r < k.retained; ++r) {
      const int64_t v = unique ? perm[r] : static_cast<int64_t>(rng() % k.seq);
      idx.tensor.SetIndex(b * k.retained + r, v);
    }
  }
  return idx;
}

std::string Describe(const Case& k) {
  return ::testing::PrintToString(std::vector<int64_t>{
      static_cast<int64_t>(k.dtype), static_cast<int64_t>(k.idx_dtype), k.batch_first, k.batch,
      k.seq, k.retained, k.channels, static_cast<int64_t>(k.in_kind),
      static_cast<int64_t>(k.out_kind), k.idx_strided});
}

void RunGather(const Case& k, std::mt19937_64& rng) {
  SCOPED_TRACE(Describe(k));
  HeldView act = MakeHeld(k.dtype, TokensShape(k, k.seq), k.in_kind, rng);
  HeldView idx = MakeIndices(k, /*unique=*/false, rng);
  HeldView out = MakeHeld(k.dtype, TokensShape(k, k.retained), k.out_kind, rng);
  HeldView expected = out.Clone();
  RefGather(act.view, idx.view, expected.view, k.batch_first);
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), Pool3()}) {
    HeldView got = out.Clone();
    ASSERT_OK(kernels::cpu::GatherTokens({act.view, idx.view, got.view, k.batch_first}, pool));
    ASSERT_EQ(got.tensor.Bytes(), expected.tensor.Bytes());
  }
}

void RunScatter(const Case& k, std::mt19937_64& rng) {
  SCOPED_TRACE(Describe(k));
  HeldView layer = MakeHeld(k.dtype, TokensShape(k, k.retained), k.in_kind, rng);
  HeldView idx = MakeIndices(k, /*unique=*/true, rng);
  HeldView all = MakeHeld(k.dtype, TokensShape(k, k.seq), k.out_kind, rng);
  HeldView expected = all.Clone();
  RefScatter(expected.view, layer.view, idx.view, k.batch_first);
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), Pool3()}) {
    HeldView got = all.Clone();
    ASSERT_OK(kernels::cpu::ScatterTokens({got.view, layer.view, idx.view, k.batch_first}, pool));
    ASSERT_EQ(got.tensor.Bytes(), expected.tensor.Bytes());
  }
}

// Every dtype x index dtype x layout order x view kind, random small sizes
// (including 0 and 1), plus a few large ones.
std::vector<Case> RandomCases(std::mt19937_64& rng) {
  const ViewKind out_kinds[] = {ViewKind::kContiguous, ViewKind::kPadded, ViewKind::kMisaligned,
                                ViewKind::kChannelStride2, ViewKind::kChannelOffset};
  const int64_t channel_choices[] = {0, 1, 3, 7, 16, 33};
  std::vector<Case> cases;
  for (DType dtype : kDataDTypes) {
    for (DType idx_dtype : {DType::kInt32, DType::kInt64}) {
      for (bool batch_first : {true, false}) {
        for (ViewKind in_kind : kAllViewKinds) {
          Case k{dtype, idx_dtype, batch_first, 0, 0, 0, 0, in_kind, ViewKind::kContiguous, false};
          k.batch = static_cast<int64_t>(rng() % 4);
          k.seq = 1 + static_cast<int64_t>(rng() % 9);
          k.retained = static_cast<int64_t>(rng() % (k.seq + 1));
          k.channels = channel_choices[rng() % 6];
          k.out_kind = out_kinds[rng() % 5];
          k.idx_strided = rng() % 2 == 0;
          cases.push_back(k);
        }
      }
    }
  }
  for (DType dtype : {DType::kBFloat16, DType::kFloat32, DType::kInt8}) {
    cases.push_back({dtype, DType::kInt32, true, 3, 67, 41, 4100, ViewKind::kContiguous,
                     ViewKind::kContiguous, false});
    cases.push_back({dtype, DType::kInt64, false, 5, 129, 77, 129, ViewKind::kPadded,
                     ViewKind::kChannelStride2, true});
  }
  // Large enough (> kStreamMinTotalBytes of rows) for the streaming-store path,
  // with odd row sizes and misaligned destinations.
  cases.push_back({DType::kFloat32, DType::kInt32, true, 2, 700, 600, 2051, ViewKind::kMisaligned,
                   ViewKind::kMisaligned, false});
  cases.push_back({DType::kBFloat16, DType::kInt64, false, 3, 1500, 1400, 1100,
                   ViewKind::kContiguous, ViewKind::kPadded, true});
  return cases;
}

TEST(GatherTokensRandom, MatchesReference) {
  std::mt19937_64 rng(42);
  for (const Case& k : RandomCases(rng)) RunGather(k, rng);
}

TEST(ScatterTokensRandom, MatchesReference) {
  std::mt19937_64 rng(43);
  for (Case k : RandomCases(rng)) {
    if (k.out_kind == ViewKind::kBroadcast0) continue;  // `all` is written
    RunScatter(k, rng);
  }
}

TEST(GatherScatterRandom, RoundTripBitExact) {
  std::mt19937_64 rng(44);
  for (DType dtype : kDataDTypes) {
    for (bool batch_first : {true, false}) {
      Case k{dtype, DType::kInt64,         batch_first,       3,   11, 6,
             9,     ViewKind::kMisaligned, ViewKind::kPadded, true};
      SCOPED_TRACE(Describe(k));
      HeldView act = MakeHeld(dtype, TokensShape(k, k.seq), ViewKind::kMisaligned, rng);
      HeldView idx = MakeIndices(k, /*unique=*/true, rng);
      HeldView mid = MakeHeld(dtype, TokensShape(k, k.retained), ViewKind::kPadded, rng);
      ASSERT_OK(kernels::cpu::GatherTokens({act.view, idx.view, mid.view, batch_first}, Pool3()));
      HeldView back = act.Clone();
      ASSERT_OK(kernels::cpu::ScatterTokens({back.view, mid.view, idx.view, batch_first}, Pool3()));
      EXPECT_EQ(back.tensor.Bytes(), act.tensor.Bytes());
    }
  }
}

TEST(ScatterTokensRandom, UnnamedRowsUntouched) {
  std::mt19937_64 rng(45);
  Case k{DType::kFloat32,       DType::kInt32,         true, 2, 10, 3, 5,
         ViewKind::kContiguous, ViewKind::kContiguous, false};
  HeldView all = MakeHeld(k.dtype, {2, 10, 5}, ViewKind::kContiguous, rng);
  HeldView before = all.Clone();
  HeldView layer = MakeHeld(k.dtype, {2, 3, 5}, ViewKind::kContiguous, rng);
  HeldView idx = MakeIndices(k, /*unique=*/true, rng);
  ASSERT_OK(kernels::cpu::ScatterTokens({all.view, layer.view, idx.view, true}, nullptr));
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t s = 0; s < 10; ++s) {
      bool named = false;
      for (int64_t r = 0; r < 3; ++r) named |= idx.tensor.GetIndex(b * 3 + r) == s;
      if (named) continue;
      EXPECT_EQ(std::memcmp(RefElem(all.view, {b, s, 0}), RefElem(before.view, {b, s, 0}), 20), 0);
    }
  }
}

// ----------------------------------------------------------------------- errors

using ::testing::HasSubstr;
constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

// A valid gather setup (B=rows, S=5, R=4, C) that each error test breaks.
struct GatherSetup {
  TestTensor act, idx, out;
  GatherSetup(int64_t rows, int64_t channels, DType idx_dtype = DType::kInt32)
      : act(DType::kFloat32, {rows, 5, channels}),
        idx(idx_dtype, {rows, 4}),
        out(DType::kFloat32, {rows, 4, channels}) {
    std::mt19937_64 rng(5);
    act.FillRandom(rng);
    out.FillRandom(rng);
    for (int64_t i = 0; i < rows * 4; ++i) idx.SetIndex(i, i % 5);
  }
  GatherTokensArgs Args() { return {act.view(), idx.view(), out.view(), true}; }
};

// Runs the op with null, 1- and 3-thread pools; each must fail with `code`
// and exactly the same message containing `substr`, writing nothing.
template <typename ArgsT, typename Op>
void ExpectError(Op op, const ArgsT& args, TestTensor& written, absl::string_view substr) {
  const std::vector<uint8_t> before = written.Bytes();
  ThreadPool pool1(1);
  std::string first_message;
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool1, Pool3()}) {
    const absl::Status status = op(args, pool);
    EXPECT_THAT(status, StatusIs(kInvalid, std::string(substr)));
    if (first_message.empty()) first_message = std::string(status.message());
    EXPECT_EQ(status.message(), first_message);
    EXPECT_EQ(written.Bytes(), before);
  }
}

TEST(GatherTokensErrors, FirstOutOfRangeIndexWhateverTheThreads) {
  for (DType idx_dtype : {DType::kInt32, DType::kInt64}) {
    GatherSetup g(300, 64, idx_dtype);
    g.idx.SetIndex(250 * 4 + 0, 9);
    g.idx.SetIndex(37 * 4 + 3, 7);
    g.idx.SetIndex(37 * 4 + 2, 5);
    ExpectError(kernels::cpu::GatherTokens, g.Args(), g.out,
                "indices[37,2] = 5 is out of range [0, 5)");
    g.idx.SetIndex(3 * 4 + 1, -2);
    ExpectError(kernels::cpu::GatherTokens, g.Args(), g.out,
                "indices[3,1] = -2 is out of range [0, 5)");
  }
  GatherSetup empty_rows(2, 0);  // C = 0: nothing to copy, indices still checked
  empty_rows.idx.SetIndex(5, 11);
  ExpectError(kernels::cpu::GatherTokens, empty_rows.Args(), empty_rows.out,
              "indices[1,1] = 11 is out of range [0, 5)");
}

TEST(GatherTokensErrors, Metadata) {
  GatherSetup g(2, 4);
  GatherTokensArgs a = g.Args();
  a.out.dtype = DType::kFloat16;
  ExpectError(kernels::cpu::GatherTokens, a, g.out, "out: dtype float16 differs from activations");
  a = g.Args();
  a.indices.dtype = DType::kFloat32;
  ExpectError(kernels::cpu::GatherTokens, a, g.out, "indices: dtype float32 is not supported");
  a = g.Args();
  a.indices.shape[0] = 1;
  ExpectError(kernels::cpu::GatherTokens, a, g.out, "indices: dim 0 (B) is 1, expected 2");
  a = g.Args();
  a.out.shape[2] = 3;
  ExpectError(kernels::cpu::GatherTokens, a, g.out, "out: dim 2 (C) is 3, expected 4");
  a = g.Args();
  a.out.shape[1] = 3;
  ExpectError(kernels::cpu::GatherTokens, a, g.out, "out: dim 1 (R) is 3, expected 4");
  a = g.Args();
  a.batch_first = false;  // act [S=2,B=5,C], out must be [R,B,C]
  ExpectError(kernels::cpu::GatherTokens, a, g.out, "indices: dim 0 (B) is 2, expected 5");
  a = g.Args();
  a.activations.rank = 2;
  ExpectError(kernels::cpu::GatherTokens, a, g.out, "activations: rank is 2");
  a = g.Args();
  a.out.strides[1] = 0;
  ExpectError(kernels::cpu::GatherTokens, a, g.out, "out: output strides");
  a = g.Args();
  a.out = a.activations;
  a.out.shape[1] = 4;
  ExpectError(kernels::cpu::GatherTokens, a, g.act, "out: overlaps activations");
  a = g.Args();
  a.out.data = a.indices.data;
  a.out.shape[0] = 1;
  a.out.shape[1] = 1;
  a.out.shape[2] = 1;
  a.indices.shape[0] = 1;
  a.indices.shape[1] = 1;
  a.activations.shape[0] = 1;
  a.activations.shape[2] = 1;
  ExpectError(kernels::cpu::GatherTokens, a, g.idx, "out: overlaps indices");
}

struct ScatterSetup {
  TestTensor all, layer, idx;
  explicit ScatterSetup(int64_t rows)
      : all(DType::kBFloat16, {rows, 6, 3}),
        layer(DType::kBFloat16, {rows, 4, 3}),
        idx(DType::kInt64, {rows, 4}) {
    std::mt19937_64 rng(6);
    all.FillRandom(rng);
    layer.FillRandom(rng);
    for (int64_t b = 0; b < rows; ++b)
      for (int64_t r = 0; r < 4; ++r) idx.SetIndex(b * 4 + r, (r + b) % 6);
  }
  ScatterTokensArgs Args() { return {all.view(), layer.view(), idx.view(), true}; }
};

TEST(ScatterTokensErrors, DuplicatesAndRanges) {
  ScatterSetup s(400);
  s.idx.SetIndex(300 * 4 + 1, 6);   // out of range, later row
  s.idx.SetIndex(120 * 4 + 3, 99);  // out of range after the duplicate in the same row
  s.idx.SetIndex(120 * 4 + 2, 0);   // duplicates position 0 of row 120
  ExpectError(kernels::cpu::ScatterTokens, s.Args(), s.all,
              "indices[120,2] = 0 duplicates indices[120,0] (indices must be unique within a row)");
  s.idx.SetIndex(7 * 4 + 0, -1);
  ExpectError(kernels::cpu::ScatterTokens, s.Args(), s.all,
              "indices[7,0] = -1 is out of range [0, 6)");
}

// A huge S with no bytes (C = 0): the uniqueness check sorts the rows instead
// of allocating a bitmap of S bits (which threw std::bad_alloc before).
TEST(ScatterTokensErrors, HugeSeqWithZeroChannelsIsCheckedBySorting) {
  constexpr int64_t kS = int64_t{1} << 40;
  char no_bytes[8];
  const TensorView all = TensorView::Contiguous(no_bytes, DType::kFloat32, {2, kS, 0});
  const TensorView layer = TensorView::Contiguous(no_bytes, DType::kFloat32, {2, 3, 0});
  TestTensor idx = Indices(DType::kInt64, 2, 3, {kS - 1, 0, 12345, 7, kS - 1, 7});
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    EXPECT_THAT(kernels::cpu::ScatterTokens({all, layer, idx.view(), true}, &pool),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         "indices[1,2] = 7 duplicates indices[1,0] (indices must be unique"));
    idx.SetIndex(5, kS);
    EXPECT_THAT(kernels::cpu::ScatterTokens({all, layer, idx.view(), true}, &pool),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         "indices[1,2] = 1099511627776 is out of range [0, 1099511627776)"));
    idx.SetIndex(5, 8);
    EXPECT_OK(kernels::cpu::ScatterTokens({all, layer, idx.view(), true}, &pool));
    idx.SetIndex(5, 7);
  }
}

TEST(ScatterTokensErrors, Metadata) {
  ScatterSetup s(2);
  ScatterTokensArgs a = s.Args();
  a.layer.dtype = DType::kFloat16;
  ExpectError(kernels::cpu::ScatterTokens, a, s.all, "layer: dtype float16 differs from all");
  a = s.Args();
  a.layer.shape[2] = 2;
  ExpectError(kernels::cpu::ScatterTokens, a, s.all, "layer: dim 2 (C) is 2, expected 3");
  a = s.Args();
  a.indices.shape[0] = 3;
  ExpectError(kernels::cpu::ScatterTokens, a, s.all, "indices: dim 0 (B) is 3, expected 2");
  a = s.Args();
  a.all.strides[0] = 0;
  ExpectError(kernels::cpu::ScatterTokens, a, s.all, "all: output strides");
  a = s.Args();
  a.layer = a.all;
  a.layer.shape[1] = 4;
  ExpectError(kernels::cpu::ScatterTokens, a, s.all, "all: overlaps layer");
}

TEST(GatherScatterEdge, EmptySizes) {
  for (int64_t rows : {0, 1}) {
    GatherSetup g(rows, 4);
    g.idx = TestTensor(DType::kInt32, {rows, 0});
    g.out = TestTensor(DType::kFloat32, {rows, 0, 4});
    EXPECT_OK(kernels::cpu::GatherTokens(g.Args(), Pool3()));
    EXPECT_OK(
        kernels::cpu::ScatterTokens({g.act.view(), g.out.view(), g.idx.view(), true}, Pool3()));
  }
}

}  // namespace
}  // namespace tokensel::testing::gather_scatter_test
