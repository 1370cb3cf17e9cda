// The host-decidable plan of the CUDA SamplePackedTokens' token balance
// (kernels/cuda/sample_packed_plan.h), without a device: which sequences
// are chunked, that the workspace bound holds for every pack the data can
// describe, that chunk owners and state slots are right, and that every
// block gets a bounded number of tokens.
#include "kernels/cuda/sample_packed_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

namespace tokensel::kernels::cuda {
namespace {

// chunk_base of the lengths: the exclusive prefix sums of PackedChunks,
// N + 1 values (what LaunchPackedScan leaves in the workspace).
std::vector<int64_t> ChunkBase(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> base = {0};
  for (const int64_t n : lengths) base.push_back(base.back() + PackedChunks(n));
  return base;
}

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (const int64_t x : v) s += x;
  return s;
}

// Checks every property the kernels rely on for one pack.
void CheckPack(const std::vector<int64_t>& lengths) {
  const int64_t tokens = Sum(lengths);
  const std::vector<int64_t> base = ChunkBase(lengths);
  const auto n = static_cast<int64_t>(lengths.size());
  const int64_t chunks = base.back();
  ASSERT_LE(chunks, PackedMaxChunks(tokens)) << "workspace bound, tokens = " << tokens;
  std::set<int64_t> slots;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = base[i + 1] - base[i];
    if (c == 0) {
      EXPECT_LT(lengths[i], kPackedLongMinTokens);
      EXPECT_LE(lengths[i], 2 * kPackedChunkTokens) << "a short block's tokens";
      continue;
    }
    EXPECT_GE(c, kPackedMinLongChunks);
    const int64_t slot = PackedLongSlot(base[i]);
    EXPECT_TRUE(slots.insert(slot).second) << "state slot " << slot << " shared, i = " << i;
    EXPECT_LT(slot, PackedLongSlots(PackedMaxChunks(tokens)));
    // Each chunk covers [start, start + len) of its sequence; together they
    // cover the sequence exactly once.
    int64_t covered = 0;
    for (int64_t g = base[i]; g < base[i + 1]; ++g) {
      ASSERT_EQ(PackedChunkOwner(base.data(), n, g), i) << "chunk " << g;
      const int64_t start = (g - base[i]) * kPackedChunkTokens;
      EXPECT_EQ(start, covered);
      EXPECT_EQ(start % 2, 0) << "Philox pairs start at even positions";
      const int64_t len = std::min(kPackedChunkTokens, lengths[i] - start);
      EXPECT_GT(len, 0);
      covered += len;
    }
    EXPECT_EQ(covered, lengths[i]);
  }
}

TEST(SamplePackedPlanTest, PathChoice) {
  EXPECT_FALSE(PackedIsLong(0));
  EXPECT_FALSE(PackedIsLong(kPackedLongMinTokens - 1));
  EXPECT_TRUE(PackedIsLong(kPackedLongMinTokens));
  EXPECT_EQ(PackedChunks(kPackedLongMinTokens - 1), 0);
  EXPECT_EQ(PackedChunks(kPackedLongMinTokens), kPackedMinLongChunks);
  EXPECT_EQ(PackedChunks(int64_t{1} << 20), (int64_t{1} << 20) / kPackedChunkTokens);
  EXPECT_EQ(PackedChunks((int64_t{1} << 20) + 1), (int64_t{1} << 20) / kPackedChunkTokens + 1);
  EXPECT_EQ(PackedChunks(kPackedMaxTokens), (kPackedMaxTokens + 4095) / 4096);
}

TEST(SamplePackedPlanTest, ScanTilesCoverEveryValue) {
  EXPECT_EQ(PackedScanTiles(0), 0);
  EXPECT_EQ(PackedScanTiles(1), 1);
  EXPECT_EQ(PackedScanTiles(kPackedScanTile), 1);
  EXPECT_EQ(PackedScanTiles(kPackedScanTile + 1), 2);
  for (const int64_t n : {int64_t{1000000}, int64_t{1} << 32}) {
    const int64_t tiles = PackedScanTiles(n);
    EXPECT_GE(tiles * kPackedScanTile, n);        // values 1..n all in a tile
    EXPECT_LT((tiles - 1) * kPackedScanTile, n);  // no empty tile
  }
}

TEST(SamplePackedPlanTest, MaxChunksIsTightAndClamped) {
  EXPECT_EQ(PackedMaxChunks(0), 0);
  EXPECT_EQ(PackedMaxChunks(-5), 0);
  EXPECT_EQ(PackedMaxChunks(kPackedLongMinTokens - 1), 0);  // no long sequence fits
  // Every sequence just long enough: the worst case, reached exactly.
  for (const int64_t k : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{1000}}) {
    EXPECT_EQ(PackedMaxChunks(k * kPackedLongMinTokens), k * kPackedMinLongChunks) << k;
  }
  EXPECT_EQ(PackedMaxChunks(int64_t{1} << 40), PackedMaxChunks(kPackedMaxTokens));
  EXPECT_LT(PackedMaxChunks(kPackedMaxTokens), int64_t{1} << 20);
}

TEST(SamplePackedPlanTest, AdversarialPacks) {
  CheckPack({});
  CheckPack({0, 0, 0});
  CheckPack({kPackedLongMinTokens - 1, kPackedLongMinTokens, kPackedLongMinTokens + 1});
  CheckPack(std::vector<int64_t>(40, kPackedLongMinTokens));
  CheckPack(std::vector<int64_t>(40, kPackedLongMinTokens + kPackedChunkTokens - 1));
  CheckPack({int64_t{1} << 20});
  CheckPack({5, int64_t{1} << 20, 0, 3, (int64_t{1} << 20) + 1, 1});
  // Long sequences between empty ones (owners skip empty ranges).
  CheckPack({0, 9000, 0, 0, 20000, 0});
}

TEST(SamplePackedPlanTest, RandomPacks) {
  std::mt19937_64 rng(15);
  for (int round = 0; round < 300; ++round) {
    std::vector<int64_t> lengths(1 + rng() % 60);
    for (int64_t& n : lengths) {
      switch (rng() % 4) {
        case 0:
          n = static_cast<int64_t>(rng() % 16);
          break;
        case 1:
          n = kPackedLongMinTokens - 2 + static_cast<int64_t>(rng() % 5);
          break;
        default:
          n = static_cast<int64_t>(rng() % 70000);
      }
    }
    SCOPED_TRACE(round);
    CheckPack(lengths);
  }
}

// The owner search on the chunk_base of a huge N with one long sequence in
// the middle, and at both ends.
TEST(SamplePackedPlanTest, OwnerAmongManyShort) {
  for (const int64_t at : {int64_t{0}, int64_t{31337}, int64_t{99999}}) {
    std::vector<int64_t> lengths(100000, 3);
    lengths[at] = 50000;
    const std::vector<int64_t> base = ChunkBase(lengths);
    ASSERT_EQ(base.back(), PackedChunks(50000));
    for (int64_t g = 0; g < base.back(); ++g) {
      EXPECT_EQ(PackedChunkOwner(base.data(), 100000, g), at);
    }
  }
}

}  // namespace
}  // namespace tokensel::kernels::cuda
