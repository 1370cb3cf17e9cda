// Tests of cpu::SegmentSeqlens (op 6): spec vectors, brute-force comparison
// (segment_reference.h), data and metadata errors with untouched outputs.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "tests/kernels/segment_reference.h"
#include "tests/kernels/segment_test_harness.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_tensor.h"

namespace tokensel {
namespace {

using kernels::AttnMaskType;
using kernels::DType;
using segtest::Case;
using segtest::CrossCase;
using segtest::ExpectMatchesReference;
using segtest::ExpectSide;
using segtest::MakeIndex;
using segtest::Options;
using segtest::Outcome;
using segtest::RunOp;
using segtest::SelfCase;
using segtest::SideOut;
using segtest::StandardPos;
using ::testing::ElementsAreArray;
using testing::Layout;
using testing::StatusIs;
using testing::TestTensor;
using testing::segref::PackedResult;
using testing::segref::Row;
using testing::segref::SideResult;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
const AttnMaskType kAllMasks[] = {AttnMaskType::kPadding, AttnMaskType::kCausal,
                                  AttnMaskType::kCausalBottomRight};

// ---------------------------------------------------------------------------
// Spec vectors (section 6), typed in from docs.

struct SpecVector {
  Row ids;
  int64_t ns;
  std::vector<int32_t> seqlen, offset;
  std::vector<int32_t> packed_seqlens, packed_offsets, cu;  // empty = not in the spec
};

TEST(SegmentSeqlensTest, SpecSelfVectors) {
  const std::vector<SpecVector> vectors = {
      {{1, 1, 1, 1}, 1, {4}, {0, -1}, {4}, {0, 4}, {0, 4}},
      {{1, 1, 1, 2, 2, 3, 3, 3, 3}, 3, {3, 2, 4}, {0, 3, 5, -1}, {}, {0, 3, 5, 9}, {}},
      {{1, 1, 2, 2, 2, 0, 0, 0}, 2, {2, 3}, {0, 2, -1}, {}, {0, 2, 8}, {0, 2, 5}},
      {{1, 0, 2, 2, 3, 0, 0, 4, 4},
       4,
       {1, 2, 1, 2},
       {0, 2, 4, 7, -1},
       {},
       {0, 2, 4, 7, 9},
       {0, 1, 3, 4, 6}},
      {{0, 0, 1, 1, 0, 2}, 2, {2, 1}, {2, 5, -1}, {}, {2, 5, 6}, {0, 2, 3}},
      {{1, 1, 2}, 4, {2, 1, 0, 0}, {0, 2, -1, -1, -1}, {}, {}, {}},
      {{0, 0, 0, 0}, 2, {0, 0}, {-1, -1, -1}, {}, {4, 4, 4}, {0, 0, 0}},
      {{1}, 1, {1}, {0, -1}, {}, {}, {}},
      {{0}, 1, {0}, {-1, -1}, {}, {}, {}},
  };
  for (const SpecVector& v : vectors) {
    for (AttnMaskType mask : kAllMasks) {
      for (bool with_pos : {false, true}) {
        Case c = SelfCase({v.ids}, v.ns);
        c.mask = mask;
        if (with_pos) c.pos_q = {StandardPos(v.ids)};
        Outcome out = RunOp(c);
        ASSERT_OK(out.status);
        const SideResult r = out.q->Read();
        EXPECT_THAT(r.seqlen[0], ElementsAreArray(v.seqlen));
        EXPECT_THAT(r.offset[0], ElementsAreArray(v.offset));
        const PackedResult p = out.q->ReadPacked();
        if (!v.packed_seqlens.empty()) {
          EXPECT_THAT(p.seqlens, ElementsAreArray(v.packed_seqlens));
        }
        if (!v.packed_offsets.empty()) {
          EXPECT_THAT(p.offsets, ElementsAreArray(v.packed_offsets));
        }
        if (!v.cu.empty()) {
          EXPECT_THAT(p.cu_seqlens, ElementsAreArray(v.cu));
        }
      }
    }
  }
}

TEST(SegmentSeqlensTest, SpecTwoRowsPacked) {
  Outcome out = RunOp(SelfCase({{1, 1, 1, 0, 2, 2}, {1, 1, 2, 2, 2, 2}}, 2));
  ASSERT_OK(out.status);
  const SideResult r = out.q->Read();
  EXPECT_THAT(r.seqlen[0], ElementsAreArray({3, 2}));
  EXPECT_THAT(r.seqlen[1], ElementsAreArray({2, 4}));
  EXPECT_THAT(r.offset[0], ElementsAreArray({0, 4, -1}));
  EXPECT_THAT(r.offset[1], ElementsAreArray({0, 2, -1}));
  const PackedResult p = out.q->ReadPacked();
  EXPECT_THAT(p.seqlens, ElementsAreArray({3, 2, 2, 4}));
  EXPECT_THAT(p.offsets, ElementsAreArray({0, 4, 6, 8, 12, 12}));
  EXPECT_THAT(p.cu_seqlens, ElementsAreArray({0, 3, 5, 7, 11}));
}

TEST(SegmentSeqlensTest, SpecBrcmCrossQLonger) {
  Outcome out = RunOp(
      CrossCase({1, 1, 1, 1}, {0, 1, 2, 3}, {1, 1}, {0, 1}, 1, AttnMaskType::kCausalBottomRight));
  ASSERT_OK(out.status);
  EXPECT_THAT(out.q->Read().seqlen[0], ElementsAreArray({2}));
  EXPECT_THAT(out.q->Read().offset[0], ElementsAreArray({2, -1}));
  EXPECT_THAT(out.kv->Read().seqlen[0], ElementsAreArray({2}));
  EXPECT_THAT(out.kv->Read().offset[0], ElementsAreArray({0, -1}));
}

// Found by the op fuzzer (clang UBSan): B = 0 cross-attention formed a pointer
// from the empty staging buffer's null data plus the kv side's offset. GCC's
// UBSan (the asan preset) does not check null + offset, so this case guards
// the path; the fuzz preset's clang build is what flags a regression.
TEST(SegmentSeqlensTest, EmptyBatchCrossAttentionWithPacked) {
  Case c;
  c.tq = 5;
  c.tkv = 3;
  c.ns = 7;
  c.cross = true;
  c.mask = AttnMaskType::kPadding;
  Outcome out = RunOp(c);
  ASSERT_OK(out.status);
  EXPECT_THAT(out.q->ReadPacked().cu_seqlens, ElementsAreArray({0}));
  EXPECT_THAT(out.kv->ReadPacked().cu_seqlens, ElementsAreArray({0}));
}

// TE's striped context-parallel example (reference doc T17), CAUSAL.
TEST(SegmentSeqlensTest, StripedCausalExample) {
  Outcome out = RunOp(
      CrossCase({1, 1, 2, 2}, {0, 2, 0, 2}, {1, 1, 2, 2}, {1, 3, 1, 3}, 2, AttnMaskType::kCausal));
  ASSERT_OK(out.status);
  EXPECT_THAT(out.q->Read().offset[0], ElementsAreArray({1, 3, -1}));
  EXPECT_THAT(out.q->Read().seqlen[0], ElementsAreArray({1, 1}));
  EXPECT_THAT(out.kv->Read().offset[0], ElementsAreArray({0, 2, -1}));
  EXPECT_THAT(out.kv->Read().seqlen[0], ElementsAreArray({1, 1}));
}

// Closed forms for standard positions (spec): CAUSAL kv = min(Lk, Lq);
// BRCM q = min(Lq, Lk) starting max(0, Lq - Lk) later; PADDING keeps all.
TEST(SegmentSeqlensTest, ClosedFormsStandardPositions) {
  for (int64_t lq = 1; lq <= 5; ++lq) {
    for (int64_t lk = 1; lk <= 5; ++lk) {
      for (int64_t pad = 0; pad <= 2; ++pad) {
        Row iq(pad, 0), ikv(pad, 0);
        iq.resize(pad + lq, 1);
        ikv.resize(pad + lk, 1);
        for (AttnMaskType mask : kAllMasks) {
          Outcome out = RunOp(CrossCase(iq, StandardPos(iq), ikv, StandardPos(ikv), 1, mask));
          ASSERT_OK(out.status);
          int64_t q_len = lq, q_off = pad, kv_len = lk;
          if (mask == AttnMaskType::kCausal) kv_len = std::min(lk, lq);
          if (mask == AttnMaskType::kCausalBottomRight) {
            q_len = std::min(lq, lk);
            q_off = pad + std::max<int64_t>(0, lq - lk);
          }
          EXPECT_THAT(out.q->Read().seqlen[0], ElementsAreArray(std::vector<int64_t>{q_len}));
          EXPECT_THAT(out.q->Read().offset[0], ElementsAreArray(std::vector<int64_t>{q_off, -1}));
          EXPECT_THAT(out.kv->Read().seqlen[0], ElementsAreArray(std::vector<int64_t>{kv_len}));
          EXPECT_THAT(out.kv->Read().offset[0], ElementsAreArray(std::vector<int64_t>{pad, -1}));
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Data errors: status, message naming field/row/token/value, nothing written.

void ExpectDataError(const Case& c, const std::string& substr, const std::string& substr2 = "") {
  for (bool packed : {false, true}) {
    Options o;
    o.packed = packed;
    Outcome out = RunOp(c, o);
    EXPECT_THAT(out.status, StatusIs(kInvalid, substr));
    if (!substr2.empty()) {
      EXPECT_THAT(out.status, StatusIs(kInvalid, substr2));
    }
    EXPECT_TRUE(out.q->Untouched());
    if (out.kv) {
      EXPECT_TRUE(out.kv->Untouched());
    }
  }
}

TEST(SegmentSeqlensTest, SpecErrorVectors) {
  ExpectDataError(SelfCase({{1, 1, 0, 1, 2, 2}}, 2), "segment_ids_q[0,3] = 1",
                  "padding inside segment 1");
  ExpectDataError(SelfCase({{1, 1, 2, 2, 1, 1}}, 2), "segment_ids_q[0,4] = 1", "strictly increase");
  ExpectDataError(SelfCase({{2, 2, 2, 1}}, 2), "segment_ids_q[0,3] = 1", "strictly increase");
  ExpectDataError(SelfCase({{1, 2, 3, 4, 5}}, 2), "segment_ids_q[0,2] = 3", "out of range [0, 2]");
  ExpectDataError(SelfCase({{1, 1, 3, 3}}, 2), "segment_ids_q[0,2] = 3", "out of range");
  ExpectDataError(SelfCase({{1, 1, -1}}, 2), "segment_ids_q[0,2] = -1", "out of range");
  // The lowest row wins, whatever the thread count.
  ExpectDataError(SelfCase({{1, 1, 2}, {1, 0, 1}, {3, 3, 3}}, 2), "segment_ids_q[1,2] = 1");
}

TEST(SegmentSeqlensTest, CrossErrors) {
  const AttnMaskType kCausal = AttnMaskType::kCausal;
  ExpectDataError(CrossCase({1, 1}, {0, -2}, {1}, {0}, 1, kCausal), "segment_pos_q[0,1] = -2",
                  "is negative");
  ExpectDataError(CrossCase({1, 1}, {0, 1}, {0, 1}, {0, -1}, 1, kCausal),
                  "segment_pos_kv[0,1] = -1");
  ExpectDataError(CrossCase({1, 2}, {0, 0}, {2, 1}, {0, 0}, 2, kCausal), "segment_ids_kv[0,1] = 1");
  // Id error before a later negative position; position before a later id error.
  ExpectDataError(CrossCase({1, 3, 3}, {0, 0, -1}, {1}, {0}, 2, kCausal), "segment_ids_q[0,1] = 3");
  ExpectDataError(CrossCase({1, 1, 3}, {0, -1, 0}, {1}, {0}, 2, kCausal), "segment_pos_q[0,1]");
  // Row 0's kv error precedes row 1's q error.
  Case c = CrossCase({1, 1}, {0, 1}, {1, 1}, {0, 1}, 2, kCausal);
  c.ids_q.push_back({2, 1});
  c.pos_q.push_back({0, 0});
  c.ids_kv[0] = {0, 5};
  c.ids_kv.push_back({1, 1});
  c.pos_kv.push_back({0, 1});
  ExpectDataError(c, "segment_ids_kv[0,1] = 5");
  // Pad positions are never read; PADDING never reads positions at all.
  ASSERT_OK(RunOp(CrossCase({0, 1}, {-7, 0}, {1, 0}, {0, -3}, 1, kCausal)).status);
  ASSERT_OK(RunOp(CrossCase({1, 1}, {-1, -1}, {1}, {-5}, 1, AttnMaskType::kPadding)).status);
}

// Random corruptions: the first bad token (naive finder) is reported.
TEST(SegmentSeqlensTest, RandomDataErrors) {
  std::mt19937_64 rng(42);
  kernels::cpu::ThreadPool pool(3);
  for (int iter = 0; iter < 200; ++iter) {
    const int64_t ns = 1 + static_cast<int64_t>(rng() % 6);
    const int64_t batch = 1 + static_cast<int64_t>(rng() % 4);
    const bool cross = iter % 2 == 1;
    std::vector<testing::segref::SideRows> q(batch), kv(batch);
    int64_t tq = 1, tkv = 1;
    for (int64_t b = 0; b < batch; ++b) {
      testing::segref::RandomPair(rng, ns, 4, testing::segref::PosStyle::kStandard, &q[b], &kv[b]);
      tq = std::max<int64_t>(tq, q[b].ids.size());
      tkv = std::max<int64_t>(tkv, kv[b].ids.size());
    }
    Case c;
    c.ns = ns;
    c.cross = cross;
    c.tq = tq;
    c.tkv = tkv;
    for (int64_t b = 0; b < batch; ++b) {
      q[b].ids.resize(tq, 0);
      kv[b].ids.resize(tkv, 0);
      c.ids_q.push_back(q[b].ids);
      c.ids_kv.push_back(kv[b].ids);
    }
    auto corrupt = [&](std::vector<Row>* rows, int64_t t) {
      Row& row = (*rows)[rng() % batch];
      row[rng() % t] = static_cast<int64_t>(rng() % (ns + 4)) - 1;
    };
    for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k) {
      const bool kv_side = cross && rng() % 2 == 0;
      corrupt(kv_side ? &c.ids_kv : &c.ids_q, kv_side ? tkv : tq);
    }
    if (!cross) c.ids_kv.clear();
    if (cross && rng() % 2 == 0) {  // causal: valid positions everywhere
      c.mask = AttnMaskType::kCausal;
      c.pos_q.assign(batch, Row(tq, 0));
      c.pos_kv.assign(batch, Row(tkv, 0));
    }
    std::string expected;
    for (int64_t b = 0; b < batch && expected.empty(); ++b) {
      const int64_t tq_bad = testing::segref::NaiveFirstBadId(c.ids_q[b], ns);
      if (tq_bad >= 0) {
        expected = absl::StrCat("segment_ids_q[", b, ",", tq_bad, "] = ", c.ids_q[b][tq_bad]);
      } else if (cross) {
        const int64_t tkv_bad = testing::segref::NaiveFirstBadId(c.ids_kv[b], ns);
        if (tkv_bad >= 0) {
          expected = absl::StrCat("segment_ids_kv[", b, ",", tkv_bad, "] = ", c.ids_kv[b][tkv_bad]);
        }
      }
    }
    Options o;
    o.pool = iter % 3 == 0 ? &pool : nullptr;
    Outcome out = RunOp(c, o);
    if (expected.empty()) {
      EXPECT_OK(out.status);
      continue;
    }
    EXPECT_THAT(out.status, StatusIs(kInvalid, expected)) << "iter " << iter;
    EXPECT_TRUE(out.q->Untouched());
    if (out.kv) {
      EXPECT_TRUE(out.kv->Untouched());
    }
  }
}

// ---------------------------------------------------------------------------
// Metadata errors (ValidateSegmentSeqlens): nothing read, nothing written.

class SegmentSeqlensMetaTest : public ::testing::Test {
 protected:
  static constexpr int64_t kB = 2, kT = 4, kNs = 2;
  SegmentSeqlensMetaTest()
      : ids_q_(MakeIndex(DType::kInt32, {{1, 1, 2, 0}, {1, 2, 2, 2}}, kT)),
        pos_q_(MakeIndex(DType::kInt32, {{0, 1, 0, 0}, {0, 0, 1, 2}}, kT)),
        ids_kv_(MakeIndex(DType::kInt64, {{1, 1, 2, 0}, {1, 2, 2, 2}}, kT)),
        pos_kv_(MakeIndex(DType::kInt32, {{0, 1, 0, 0}, {0, 0, 1, 2}}, kT)),
        q_(kB, kNs, true),
        kv_(kB, kNs, true) {
    args_.segment_ids_q = ids_q_.view();
    args_.segment_pos_q = pos_q_.view();
    args_.segment_ids_kv = ids_kv_.view();
    args_.segment_pos_kv = pos_kv_.view();
    args_.max_segments = kNs;
    args_.mask = AttnMaskType::kCausal;
    args_.q = q_.Side();
    args_.kv = kv_.Side();
  }
  void ExpectError(const std::string& substr) {
    EXPECT_THAT(kernels::ValidateSegmentSeqlens(args_), StatusIs(kInvalid, substr));
    EXPECT_THAT(kernels::cpu::SegmentSeqlens(args_, nullptr), StatusIs(kInvalid, substr));
    EXPECT_TRUE(q_.Untouched());
    EXPECT_TRUE(kv_.Untouched());
  }
  TestTensor ids_q_, pos_q_, ids_kv_, pos_kv_;
  SideOut q_, kv_;
  kernels::SegmentSeqlensArgs args_;
};

TEST_F(SegmentSeqlensMetaTest, ValidArgsPass) { EXPECT_OK(kernels::ValidateSegmentSeqlens(args_)); }

TEST_F(SegmentSeqlensMetaTest, Errors) {
  const kernels::SegmentSeqlensArgs valid = args_;
  struct Mutation {
    std::string substr;
    std::function<void(kernels::SegmentSeqlensArgs&)> fn;
  };
  int32_t scratch[64] = {};
  const std::vector<Mutation> mutations = {
      {"max_segments", [](auto& a) { a.max_segments = 0; }},
      {"mask", [](auto& a) { a.mask = static_cast<AttnMaskType>(7); }},
      {"segment_ids_q: rank", [](auto& a) { a.segment_ids_q.rank = 1; }},
      {"segment_ids_q: dtype", [](auto& a) { a.segment_ids_q.dtype = DType::kFloat32; }},
      {"segment_pos_q: dim 1", [](auto& a) { a.segment_pos_q->shape[1] = 3; }},
      {"segment_ids_kv: dim 0", [](auto& a) { a.segment_ids_kv->shape[0] = 1; }},
      {"segment_pos_kv: dtype", [](auto& a) { a.segment_pos_kv->dtype = DType::kInt16; }},
      {"segment_pos_q: required", [](auto& a) { a.segment_pos_q.reset(); }},
      {"segment_pos_kv: required", [](auto& a) { a.segment_pos_kv.reset(); }},
      {"kv: outputs are required", [](auto& a) { a.kv.reset(); }},
      {"kv: outputs given without",
       [](auto& a) { a.segment_ids_kv.reset(), a.segment_pos_kv.reset(); }},
      {"segment_pos_kv: given without", [](auto& a) { a.segment_ids_kv.reset(), a.kv.reset(); }},
      {"q.seqlen: dim 1", [](auto& a) { a.q.seqlen.shape[1] = 3; }},
      {"q.seqlen: dtype", [](auto& a) { a.q.seqlen.dtype = DType::kInt64; }},
      {"q.offset: dim 1", [](auto& a) { a.q.offset.shape[1] = 2; }},
      {"kv.offset: dim 0", [](auto& a) { a.kv->offset.shape[0] = 3; }},
      {"q.packed.seqlens: dim 0", [](auto& a) { a.q.packed->seqlens.shape[0] = 5; }},
      {"kv.packed.offsets: dim 0", [](auto& a) { a.kv->packed->offsets.shape[0] = 5; }},
      {"q.packed.cu_seqlens: dim 0", [](auto& a) { a.q.packed->cu_seqlens.shape[0] = 4; }},
      {"q.seqlen: output strides", [](auto& a) { a.q.seqlen.strides[0] = 0; }},
      {"q.offset: overlaps q.seqlen", [](auto& a) { a.q.offset.data = a.q.seqlen.data; }},
      {"kv.packed.cu_seqlens: overlaps segment_pos_q",
       [](auto& a) { a.kv->packed->cu_seqlens.data = a.segment_pos_q->data; }},
      {"q.seqlen: overlaps segment_ids_kv",
       [](auto& a) { a.q.seqlen.data = a.segment_ids_kv->data; }},
      {"segment_ids_q: dim 1 (T)",  // T beyond int32 (broadcast view, never read)
       [&](auto& a) {
         a.segment_ids_q =
             kernels::TensorView::Strided(scratch, DType::kInt32, {2, int64_t{1} << 31}, {0, 0});
       }},
      {"q.packed: B*T",  // B*T beyond int32 with the packed layout
       [&](auto& a) {
         a.segment_ids_q =
             kernels::TensorView::Strided(scratch, DType::kInt32, {2, int64_t{1} << 30}, {0, 0});
         a.segment_pos_q = a.segment_ids_q;
       }},
  };
  for (const Mutation& m : mutations) {
    SCOPED_TRACE(m.substr);
    args_ = valid;
    m.fn(args_);
    ExpectError(m.substr);
  }
}

// ---------------------------------------------------------------------------
// Randomized comparison against the naive reference.

// Pads (or truncates: a prefix of a valid row stays valid) to length t.
void Fit(Row* ids, Row* pos, int64_t t) {
  ids->resize(t, 0);
  if (pos != nullptr) pos->resize(t, -1);
}

std::vector<Options> LayoutOptions(kernels::cpu::ThreadPool* pool) {
  std::vector<Options> opts;
  for (DType ids : {DType::kInt32, DType::kInt64}) {
    for (int layout = 0; layout < 2; ++layout) {
      Options o;
      o.ids_dtype = ids;
      o.pos_dtype = layout == 0 ? ids : (ids == DType::kInt32 ? DType::kInt64 : DType::kInt32);
      if (layout == 1) {
        o.in_layout = {{1, 3}, 4};
        o.out_layout = {{2, 1}, 2};
      }
      o.packed = layout == 1 || ids == DType::kInt32;
      o.pool = pool;
      opts.push_back(o);
    }
  }
  return opts;
}

TEST(SegmentSeqlensTest, RandomSelfAttention) {
  std::mt19937_64 rng(7);
  kernels::cpu::ThreadPool pool(3);
  for (int64_t batch : {0, 1, 3, 8}) {
    for (int64_t t : {0, 1, 2, 7, 33, 200}) {
      const int64_t ns = 1 + static_cast<int64_t>(rng() % 9);
      Case c = SelfCase({}, ns);
      c.tq = t;
      for (int64_t b = 0; b < batch; ++b) {
        testing::segref::SideRows q, kv;
        testing::segref::RandomPair(rng, ns, 1 + t / ns, testing::segref::PosStyle::kStandard, &q,
                                    &kv);
        if (b == 1) q.ids.clear();  // an all-padding row
        Fit(&q.ids, nullptr, t);
        c.ids_q.push_back(q.ids);
      }
      for (kernels::cpu::ThreadPool* p : {static_cast<kernels::cpu::ThreadPool*>(nullptr), &pool}) {
        for (const Options& o : LayoutOptions(p)) {
          ExpectMatchesReference(c, o, absl::StrCat("B=", batch, " T=", t, " NS=", ns));
        }
      }
    }
  }
}

TEST(SegmentSeqlensTest, RandomCrossAttention) {
  std::mt19937_64 rng(11);
  kernels::cpu::ThreadPool pool(3);
  const testing::segref::PosStyle styles[] = {testing::segref::PosStyle::kStandard,
                                              testing::segref::PosStyle::kStriped,
                                              testing::segref::PosStyle::kRandom};
  int cases = 0;
  for (int iter = 0; iter < 60; ++iter) {
    for (AttnMaskType mask : kAllMasks) {
      const auto style = styles[iter % 3];
      const int64_t batch = 1 + static_cast<int64_t>(rng() % 4);
      const int64_t ns = 1 + static_cast<int64_t>(rng() % 8);
      const int64_t max_len = 1 + static_cast<int64_t>(rng() % 6);
      std::vector<testing::segref::SideRows> q(batch), kv(batch);
      int64_t tq = 0, tkv = 0;
      for (int64_t b = 0; b < batch; ++b) {
        testing::segref::RandomPair(rng, ns, max_len, style, &q[b], &kv[b]);
        tq = std::max<int64_t>(tq, q[b].ids.size());
        tkv = std::max<int64_t>(tkv, kv[b].ids.size());
      }
      tq += static_cast<int64_t>(rng() % 3);
      Case c;
      c.cross = true;
      c.mask = mask;
      c.ns = ns;
      c.tq = tq;
      c.tkv = tkv;
      for (int64_t b = 0; b < batch; ++b) {
        Fit(&q[b].ids, &q[b].pos, tq);
        Fit(&kv[b].ids, &kv[b].pos, tkv);
        c.ids_q.push_back(q[b].ids);
        c.pos_q.push_back(q[b].pos);
        c.ids_kv.push_back(kv[b].ids);
        c.pos_kv.push_back(kv[b].pos);
      }
      const std::vector<Options> opts = LayoutOptions(iter % 2 == 0 ? &pool : nullptr);
      ExpectMatchesReference(c, opts[iter % opts.size()],
                             absl::StrCat("iter ", iter, " mask ", static_cast<int>(mask)));
      ++cases;
    }
  }
  EXPECT_EQ(cases, 180);
}

// Same data on both sides (cross with kv == q) equals self-attention for
// every mask with standard positions, and thread counts agree on large rows.
TEST(SegmentSeqlensTest, LargeRowsAndThreadCounts) {
  std::mt19937_64 rng(3);
  kernels::cpu::ThreadPool pool(3);
  const int64_t ns = 40, t = 20000, batch = 5;
  Case self = SelfCase({}, ns);
  self.tq = t;
  for (int64_t b = 0; b < batch; ++b) {
    testing::segref::SideRows q, kv;
    testing::segref::RandomPair(rng, ns, 2 * t / ns, testing::segref::PosStyle::kStandard, &q, &kv);
    Fit(&q.ids, nullptr, t);
    self.ids_q.push_back(q.ids);
  }
  for (const Options& o : LayoutOptions(&pool)) ExpectMatchesReference(self, o, "large self");
  for (AttnMaskType mask : kAllMasks) {
    Case c = self;
    c.cross = true;
    c.mask = mask;
    c.tkv = t;
    c.ids_kv = self.ids_q;
    for (const Row& r : self.ids_q) c.pos_q.push_back(StandardPos(r));
    c.pos_kv = c.pos_q;
    Options o;
    Outcome one = RunOp(c, o);
    o.pool = &pool;
    Outcome three = RunOp(c, o);
    ASSERT_OK(one.status);
    ASSERT_OK(three.status);
    const SideResult want = testing::segref::NaiveSide(self.ids_q, ns);
    ExpectSide(*one.q, want, ns, t, true, "cross==self q");
    ExpectSide(*one.kv, want, ns, t, true, "cross==self kv");
    EXPECT_EQ(one.q->ReadPacked().offsets, three.q->ReadPacked().offsets);
    EXPECT_EQ(one.kv->Read().seqlen, three.kv->Read().seqlen);
  }
}

}  // namespace
}  // namespace tokensel
