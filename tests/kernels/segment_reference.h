// Naive, independently written reference for SegmentSeqlens (op 6) tests:
// the brute-force O(Tq*Tkv) visibility mask, the plain core, the packed
// compaction, a naive first-error finder, and random valid segmentations.
// Nothing here calls or shares code with the implementation under test.
#ifndef TOKENSEL_TESTS_KERNELS_SEGMENT_REFERENCE_H_
#define TOKENSEL_TESTS_KERNELS_SEGMENT_REFERENCE_H_

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "kernels/ops.h"

namespace tokensel::testing::segref {

using Row = std::vector<int64_t>;
using kernels::AttnMaskType;

// Per side, per row: seqlen [NS] and offset [NS+1].
struct SideResult {
  std::vector<std::vector<int32_t>> seqlen;
  std::vector<std::vector<int32_t>> offset;
};

struct PackedResult {
  std::vector<int32_t> seqlens;
  std::vector<int32_t> offsets;
  std::vector<int32_t> cu_seqlens;
};

// seqlen[j] = #{t : x[t] == j+1}; offset = first NS+1 run starts, fill -1.
inline void NaiveCore(const Row& x, int64_t ns, std::vector<int32_t>* seqlen,
                      std::vector<int32_t>* offset) {
  seqlen->assign(ns, 0);
  offset->assign(ns + 1, -1);
  int64_t runs = 0;
  for (size_t t = 0; t < x.size(); ++t) {
    const bool start = x[t] != 0 && (t == 0 || x[t] != x[t - 1]);
    if (start) {
      if (runs < ns + 1) (*offset)[runs] = static_cast<int32_t>(t);
      ++runs;
    }
    if (x[t] >= 1 && x[t] <= ns) ++(*seqlen)[x[t] - 1];
  }
}

inline SideResult NaiveSide(const std::vector<Row>& kept_rows, int64_t ns) {
  SideResult r;
  r.seqlen.resize(kept_rows.size());
  r.offset.resize(kept_rows.size());
  for (size_t b = 0; b < kept_rows.size(); ++b)
    NaiveCore(kept_rows[b], ns, &r.seqlen[b], &r.offset[b]);
  return r;
}

// Length of the maximal run of equal ids containing each token (0 for pads).
inline Row RunLengthFill(const Row& ids) {
  Row out(ids.size(), 0);
  size_t t = 0;
  while (t < ids.size()) {
    size_t e = t;
    while (e < ids.size() && ids[e] == ids[t]) ++e;
    for (size_t i = t; i < e; ++i) out[i] = ids[t] == 0 ? 0 : static_cast<int64_t>(e - t);
    t = e;
  }
  return out;
}

// Brute force: M[i][j] = same non-zero id && visible(mask); a token is kept
// (keeps its id) iff its row/column of M has a 1, else it becomes 0.
inline void BruteKeep(const Row& iq, const Row& pq, const Row& ikv, const Row& pkv,
                      AttnMaskType mask, Row* kept_q, Row* kept_kv) {
  const Row lq = RunLengthFill(iq);
  const Row lkv = RunLengthFill(ikv);
  kept_q->assign(iq.size(), 0);
  kept_kv->assign(ikv.size(), 0);
  for (size_t i = 0; i < iq.size(); ++i) {
    for (size_t j = 0; j < ikv.size(); ++j) {
      if (iq[i] == 0 || iq[i] != ikv[j]) continue;
      bool visible = true;
      if (mask == AttnMaskType::kCausal) visible = pq[i] >= pkv[j];
      if (mask == AttnMaskType::kCausalBottomRight) visible = lq[i] - pq[i] <= lkv[j] - pkv[j];
      if (visible) {
        (*kept_q)[i] = iq[i];
        (*kept_kv)[j] = ikv[j];
      }
    }
  }
}

// Compaction across rows: non-zero seqlens, offsets >= 0 shifted by b*T.
inline PackedResult NaivePack(const SideResult& r, int64_t ns, int64_t row_length) {
  const int64_t batch = static_cast<int64_t>(r.seqlen.size());
  PackedResult p;
  for (int64_t b = 0; b < batch; ++b) {
    for (int32_t s : r.seqlen[b]) {
      if (s > 0) p.seqlens.push_back(s);
    }
    for (int32_t o : r.offset[b]) {
      if (o >= 0) p.offsets.push_back(static_cast<int32_t>(o + b * row_length));
    }
  }
  p.seqlens.resize(batch * ns, 0);
  p.offsets.resize(batch * (ns + 1), static_cast<int32_t>(batch * row_length));
  p.cu_seqlens.push_back(0);
  for (int32_t s : p.seqlens) p.cu_seqlens.push_back(p.cu_seqlens.back() + s);
  return p;
}

// First invalid token of an id row, or -1: id outside [0, ns]; an id that
// was already seen or is below an earlier id, at the start of its run.
inline int64_t NaiveFirstBadId(const Row& ids, int64_t ns) {
  std::set<int64_t> seen;
  int64_t max_seen = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    const int64_t v = ids[t];
    if (v < 0 || v > ns) return static_cast<int64_t>(t);
    if (v == 0 || (t > 0 && ids[t - 1] == v)) continue;
    if (seen.count(v) > 0 || v < max_seen) return static_cast<int64_t>(t);
    seen.insert(v);
    max_seen = v;
  }
  return -1;
}

enum class PosStyle { kStandard, kStriped, kRandom };

// One side of a random valid segmentation.
struct SideRows {
  Row ids;
  Row pos;
};

// A random valid pair of rows (q, kv) over ids 1..ns: ids increase with
// random skips; each chosen id is present on both sides, only q, or only kv;
// random padding before/between/after segments. Pad positions are negative
// (they must never be read).
inline void RandomPair(std::mt19937_64& rng, int64_t ns, int64_t max_len, PosStyle style,
                       SideRows* q, SideRows* kv) {
  q->ids.clear();
  q->pos.clear();
  kv->ids.clear();
  kv->pos.clear();
  auto pad = [&](SideRows* s) {
    const int64_t n = rng() % 3 == 0 ? static_cast<int64_t>(rng() % 4) : 0;
    for (int64_t i = 0; i < n; ++i) {
      s->ids.push_back(0);
      s->pos.push_back(-1 - static_cast<int64_t>(rng() % 3));
    }
  };
  auto run = [&](SideRows* s, int64_t id) {
    const int64_t len = 1 + static_cast<int64_t>(rng() % max_len);
    const int64_t first = static_cast<int64_t>(rng() % 2);
    const int64_t step = 1 + static_cast<int64_t>(rng() % 2);
    for (int64_t i = 0; i < len; ++i) {
      s->ids.push_back(id);
      int64_t p = i;
      if (style == PosStyle::kStriped) p = first + step * i;
      if (style == PosStyle::kRandom) p = static_cast<int64_t>(rng() % (2 * max_len + 2));
      s->pos.push_back(p);
    }
  };
  for (int64_t id = 1; id <= ns; ++id) {
    if (rng() % 4 == 0) continue;                   // skip this id
    const int which = static_cast<int>(rng() % 6);  // 0..3 both, 4 q only, 5 kv only
    pad(q);
    pad(kv);
    if (which != 5) run(q, id);
    if (which != 4) run(kv, id);
  }
  pad(q);
  pad(kv);
}

}  // namespace tokensel::testing::segref

#endif  // TOKENSEL_TESTS_KERNELS_SEGMENT_REFERENCE_H_
