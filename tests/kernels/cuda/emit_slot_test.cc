// Host tests of the emission slot rule of the CUDA radix select
// (kernels/cuda/emit_slot.h, used by BlockEmitSelected in select.cuh). The
// emission is replayed sequentially: the slot of a position depends only on
// the counts of keys > T and == T before it, exactly what the block scan of
// the device gives each position. A reference top-r (sort, ties to the lower
// position) is computed independently.
//
// The race case: TopKTokens reads the client's scores again in the emission
// pass, so a client that rewrites them after the threshold passes can make
// more than r keys qualify. Every slot must still be in [0, r) and distinct.
#include "kernels/cuda/emit_slot.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace tokensel::kernels::cuda {
namespace {

struct Threshold {
  uint32_t key;
  int64_t ties;
};

// The threshold of the r largest keys (0 < r < n): the r-th largest key and
// how many keys equal to it are taken.
Threshold ReferenceThreshold(const std::vector<uint32_t>& keys, int64_t r) {
  std::vector<uint32_t> sorted = keys;
  std::sort(sorted.begin(), sorted.end(), std::greater<uint32_t>());
  const uint32_t t = sorted[static_cast<size_t>(r - 1)];
  const int64_t above = std::count_if(keys.begin(), keys.end(), [&](uint32_t k) { return k > t; });
  return {t, r - above};
}

// The r largest keys, ties to the lower position, in ascending position order.
std::vector<int64_t> ReferenceTopK(const std::vector<uint32_t>& keys, int64_t r) {
  std::vector<int64_t> order(keys.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return keys[a] > keys[b]; });
  order.resize(static_cast<size_t>(r));
  std::sort(order.begin(), order.end());
  return order;
}

// Replays the emission over `keys` with threshold `t`: slot -> position
// (-1 = unwritten); fails the test on a slot outside [0, r) or written twice.
std::vector<int64_t> Emit(const std::vector<uint32_t>& keys, const Threshold& t, int64_t r) {
  std::vector<int64_t> ids(static_cast<size_t>(r), -1);
  int64_t gt = 0;
  int64_t eq = 0;
  for (size_t p = 0; p < keys.size(); ++p) {
    const bool is_gt = keys[p] > t.key;
    const bool is_eq = keys[p] == t.key;
    const int64_t slot = EmitSlot(is_gt, is_eq, gt, eq, t.ties, r);
    if (slot >= 0) {
      EXPECT_LT(slot, r) << "position " << p;
      if (slot >= r) return ids;  // the device would have written past the row
      EXPECT_EQ(ids[static_cast<size_t>(slot)], -1) << "slot " << slot << " written twice";
      ids[static_cast<size_t>(slot)] = static_cast<int64_t>(p);
    }
    gt += is_gt ? 1 : 0;
    eq += is_eq ? 1 : 0;
  }
  return ids;
}

TEST(EmitSlotTest, ConsistentKeysGiveTheTopK) {
  std::mt19937_64 rng(7);
  for (int64_t n : {2, 3, 17, 1000}) {
    for (uint32_t range : {2u, 5u, 1000000u}) {  // many ties .. few ties
      std::vector<uint32_t> keys(static_cast<size_t>(n));
      for (uint32_t& k : keys) k = static_cast<uint32_t>(rng() % range);
      for (int64_t r : {int64_t{1}, n / 2 + 1, n - 1}) {
        SCOPED_TRACE(::testing::Message() << "n " << n << " range " << range << " r " << r);
        EXPECT_EQ(Emit(keys, ReferenceThreshold(keys, r), r), ReferenceTopK(keys, r));
      }
    }
  }
}

// The threshold comes from the keys before the rewrite, the emission sees
// the keys after it: every slot stays in the row, none twice.
TEST(EmitSlotTest, KeysRewrittenAfterTheThresholdStayInTheRow) {
  std::mt19937_64 rng(11);
  const int64_t n = 4096;
  const int64_t r = 100;
  std::vector<uint32_t> before(static_cast<size_t>(n));
  for (uint32_t& k : before) k = static_cast<uint32_t>(rng() % 1000);
  const Threshold t = ReferenceThreshold(before, r);

  // Every key raised above the threshold: n candidates for r slots.
  std::vector<uint32_t> raised(static_cast<size_t>(n), 0xFFFFFFFFu);
  std::vector<int64_t> ids = Emit(raised, t, r);
  for (int64_t i = 0; i < r; ++i) EXPECT_EQ(ids[static_cast<size_t>(i)], i);

  // Every key equal to the threshold: ties capped by t.ties, then nothing.
  std::vector<uint32_t> tied(static_cast<size_t>(n), t.key);
  ids = Emit(tied, t, r);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), -1), r - t.ties);

  // Random rewrites, and stale ties (an uninitialized shared word on the
  // device could hand any count to the emission).
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<uint32_t> after(static_cast<size_t>(n));
    for (uint32_t& k : after) k = static_cast<uint32_t>(rng() % 1000);
    const Threshold stale{t.key, trial % 2 == 0 ? t.ties : int64_t{0xFFFFFFFF}};
    ids = Emit(after, stale, r);
    std::set<int64_t> positions;
    for (int64_t p : ids) {
      if (p < 0) continue;
      EXPECT_LT(p, n);
      EXPECT_TRUE(positions.insert(p).second) << "position " << p << " emitted twice";
    }
  }
}

}  // namespace
}  // namespace tokensel::kernels::cuda
