// Test harness for SegmentSeqlens: poisoned output tensors, input builders,
// one-call runner and comparison against the naive reference
// (segment_reference.h).
#ifndef TOKENSEL_TESTS_KERNELS_SEGMENT_TEST_HARNESS_H_
#define TOKENSEL_TESTS_KERNELS_SEGMENT_TEST_HARNESS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "tests/kernels/segment_reference.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_tensor.h"

namespace tokensel::segtest {

using kernels::AttnMaskType;
using kernels::DType;
using ::testing::ElementsAreArray;
using testing::Layout;
using testing::TestTensor;
using testing::segref::PackedResult;
using testing::segref::Row;
using testing::segref::SideResult;

// Output tensors of one side, poisoned before the call.
class SideOut {
 public:
  SideOut(int64_t batch, int64_t ns, bool packed, const Layout& layout = {})
      : batch_(batch), ns_(ns), packed_(packed) {
    const Layout l1{{layout.pad.empty() ? 0 : layout.pad.back()}, layout.misalign};
    t_.emplace_back(DType::kInt32, std::vector<int64_t>{batch, ns}, layout);
    t_.emplace_back(DType::kInt32, std::vector<int64_t>{batch, ns + 1}, layout);
    if (packed) {
      t_.emplace_back(DType::kInt32, std::vector<int64_t>{batch * ns}, l1);
      t_.emplace_back(DType::kInt32, std::vector<int64_t>{batch * (ns + 1)}, l1);
      t_.emplace_back(DType::kInt32, std::vector<int64_t>{batch * ns + 1}, l1);
    }
    std::mt19937_64 rng(batch * 131 + ns);
    for (auto& t : t_) t.FillRandom(rng);
    for (auto& t : t_) {
      before_.push_back(t.Bytes());
      poison_.emplace_back();
      for (int64_t e = 0; e < t.NumElements(); ++e) poison_.back().push_back(t.Get<int32_t>(e));
    }
  }

  kernels::SegmentSeqlensSide Side() {
    kernels::SegmentSeqlensSide s{t_[0].view(), t_[1].view(), std::nullopt};
    if (packed_) s.packed = kernels::PackedSeqlens{t_[2].view(), t_[3].view(), t_[4].view()};
    return s;
  }
  bool Untouched() const {
    for (size_t i = 0; i < t_.size(); ++i) {
      if (t_[i].Bytes() != before_[i]) return false;
    }
    return true;
  }
  // True when nothing outside the tensors' elements changed: put the
  // poisoned element values back, compare every byte, then restore.
  bool GapsUntouched() {
    bool ok = true;
    for (size_t i = 0; i < t_.size(); ++i) {
      std::vector<int32_t> now;
      for (int64_t e = 0; e < t_[i].NumElements(); ++e) {
        now.push_back(t_[i].Get<int32_t>(e));
        t_[i].Set<int32_t>(e, poison_[i][e]);
      }
      ok = ok && t_[i].Bytes() == before_[i];
      for (int64_t e = 0; e < t_[i].NumElements(); ++e) t_[i].Set<int32_t>(e, now[e]);
    }
    return ok;
  }
  SideResult Read() {
    SideResult r;
    for (int64_t b = 0; b < batch_; ++b) {
      r.seqlen.emplace_back();
      r.offset.emplace_back();
      for (int64_t j = 0; j < ns_; ++j) r.seqlen[b].push_back(t_[0].Get<int32_t>(b * ns_ + j));
      for (int64_t j = 0; j <= ns_; ++j) {
        r.offset[b].push_back(t_[1].Get<int32_t>(b * (ns_ + 1) + j));
      }
    }
    return r;
  }
  PackedResult ReadPacked() {
    PackedResult p;
    for (int64_t i = 0; i < t_[2].NumElements(); ++i) p.seqlens.push_back(t_[2].Get<int32_t>(i));
    for (int64_t i = 0; i < t_[3].NumElements(); ++i) p.offsets.push_back(t_[3].Get<int32_t>(i));
    for (int64_t i = 0; i < t_[4].NumElements(); ++i) {
      p.cu_seqlens.push_back(t_[4].Get<int32_t>(i));
    }
    return p;
  }

 private:
  int64_t batch_;
  int64_t ns_;
  bool packed_;
  std::vector<TestTensor> t_;
  std::vector<std::vector<uint8_t>> before_;
  std::vector<std::vector<int32_t>> poison_;
};

// [B, T] index tensor holding `rows` (all of length t).
inline TestTensor MakeIndex(DType dtype, const std::vector<Row>& rows, int64_t t,
                            const Layout& layout = {}) {
  TestTensor x(dtype, {static_cast<int64_t>(rows.size()), t}, layout);
  std::mt19937_64 rng(rows.size() + 7 * t);
  x.FillRandom(rng);
  for (size_t b = 0; b < rows.size(); ++b) {
    for (int64_t i = 0; i < t; ++i) x.SetIndex(static_cast<int64_t>(b) * t + i, rows[b][i]);
  }
  return x;
}

// One call: self-attention when ids_kv is empty and !cross.
struct Case {
  std::vector<Row> ids_q, pos_q, ids_kv, pos_kv;  // pos empty = not given
  int64_t tq = 0;
  int64_t tkv = 0;
  int64_t ns = 1;
  AttnMaskType mask = AttnMaskType::kPadding;
  bool cross = false;
};

struct Options {
  DType ids_dtype = DType::kInt32;
  DType pos_dtype = DType::kInt32;
  Layout in_layout;
  Layout out_layout;
  bool packed = true;
  kernels::cpu::ThreadPool* pool = nullptr;
};

struct Outcome {
  absl::Status status;
  std::unique_ptr<SideOut> q;
  std::unique_ptr<SideOut> kv;
};

inline Outcome RunOp(const Case& c, const Options& o = {}) {
  const int64_t batch = static_cast<int64_t>(c.ids_q.size());
  TestTensor iq = MakeIndex(o.ids_dtype, c.ids_q, c.tq, o.in_layout);
  TestTensor pq, ikv, pkv;
  kernels::SegmentSeqlensArgs args;
  args.segment_ids_q = iq.view();
  args.max_segments = c.ns;
  args.mask = c.mask;
  if (!c.pos_q.empty()) {
    pq = MakeIndex(o.pos_dtype, c.pos_q, c.tq, o.in_layout);
    args.segment_pos_q = pq.view();
  }
  Outcome out;
  out.q = std::make_unique<SideOut>(batch, c.ns, o.packed, o.out_layout);
  args.q = out.q->Side();
  if (c.cross) {
    ikv = MakeIndex(o.ids_dtype == DType::kInt32 ? DType::kInt64 : DType::kInt32, c.ids_kv, c.tkv,
                    o.in_layout);
    args.segment_ids_kv = ikv.view();
    if (!c.pos_kv.empty()) {
      pkv = MakeIndex(o.pos_dtype, c.pos_kv, c.tkv, o.in_layout);
      args.segment_pos_kv = pkv.view();
    }
    out.kv = std::make_unique<SideOut>(batch, c.ns, o.packed, o.out_layout);
    args.kv = out.kv->Side();
  }
  out.status = kernels::cpu::SegmentSeqlens(args, o.pool);
  return out;
}

inline void ExpectSide(SideOut& got, const SideResult& want, int64_t ns, int64_t t, bool packed,
                       const std::string& what) {
  SCOPED_TRACE(what);
  const SideResult r = got.Read();
  ASSERT_EQ(r.seqlen.size(), want.seqlen.size());
  for (size_t b = 0; b < r.seqlen.size(); ++b) {
    EXPECT_THAT(r.seqlen[b], ElementsAreArray(want.seqlen[b])) << "row " << b;
    EXPECT_THAT(r.offset[b], ElementsAreArray(want.offset[b])) << "row " << b;
  }
  if (packed) {
    const PackedResult p = got.ReadPacked();
    const PackedResult w = testing::segref::NaivePack(want, ns, t);
    EXPECT_THAT(p.seqlens, ElementsAreArray(w.seqlens));
    EXPECT_THAT(p.offsets, ElementsAreArray(w.offsets));
    EXPECT_THAT(p.cu_seqlens, ElementsAreArray(w.cu_seqlens));
  }
  EXPECT_TRUE(got.GapsUntouched());
}

// Reference for any case: brute-force keep, then the naive core.
inline void ExpectMatchesReference(const Case& c, const Options& o, const std::string& what) {
  Outcome out = RunOp(c, o);
  ASSERT_OK(out.status) << what;
  std::vector<Row> kq = c.ids_q, kkv;
  if (c.cross) {
    kkv.resize(c.ids_kv.size());
    for (size_t b = 0; b < c.ids_q.size(); ++b) {
      const Row& pq = c.pos_q.empty() ? Row(c.tq, 0) : c.pos_q[b];
      const Row& pkv = c.pos_kv.empty() ? Row(c.tkv, 0) : c.pos_kv[b];
      testing::segref::BruteKeep(c.ids_q[b], pq, c.ids_kv[b], pkv, c.mask, &kq[b], &kkv[b]);
    }
  }
  ExpectSide(*out.q, testing::segref::NaiveSide(kq, c.ns), c.ns, c.tq, o.packed, what + " q");
  if (c.cross) {
    ExpectSide(*out.kv, testing::segref::NaiveSide(kkv, c.ns), c.ns, c.tkv, o.packed, what + " kv");
  }
}

inline Row StandardPos(const Row& ids) {
  Row pos(ids.size(), 0);
  for (size_t t = 1; t < ids.size(); ++t) pos[t] = ids[t] == ids[t - 1] ? pos[t - 1] + 1 : 0;
  return pos;
}

inline Case SelfCase(std::vector<Row> rows, int64_t ns) {
  Case c;
  c.tq = rows.empty() ? 0 : static_cast<int64_t>(rows[0].size());
  c.ids_q = std::move(rows);
  c.ns = ns;
  return c;
}

inline Case CrossCase(Row iq, Row pq, Row ikv, Row pkv, int64_t ns, AttnMaskType mask) {
  Case c;
  c.cross = true;
  c.tq = static_cast<int64_t>(iq.size());
  c.tkv = static_cast<int64_t>(ikv.size());
  c.ids_q = {std::move(iq)};
  c.pos_q = {std::move(pq)};
  c.ids_kv = {std::move(ikv)};
  c.pos_kv = {std::move(pkv)};
  c.ns = ns;
  c.mask = mask;
  return c;
}

}  // namespace tokensel::segtest

#endif  // TOKENSEL_TESTS_KERNELS_SEGMENT_TEST_HARNESS_H_
