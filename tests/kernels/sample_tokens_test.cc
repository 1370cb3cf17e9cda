// SampleTokens (ops.h op 7) and Philox4x32-10: known answers, the naive
// reference of sample_reference.h, determinism, statistics, edge cases,
// masks and errors (with outputs untouched).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/sample_select.h"
#include "kernels/philox.h"
#include "kernels/sample_math.h"
#include "tests/kernels/sample_reference.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_tensor.h"

namespace tokensel::kernels {
namespace {

using ::tokensel::testing::ExpectMatchesReference;
using ::tokensel::testing::Layout;
using ::tokensel::testing::MakeArgs;
using ::tokensel::testing::MakeOutputs;
using ::tokensel::testing::OnlyElementsWritten;
using ::tokensel::testing::Outputs;
using ::tokensel::testing::ReferenceSampleRow;
using ::tokensel::testing::Row;
using ::tokensel::testing::StatusIs;
using ::tokensel::testing::TestTensor;

using ::tokensel::testing::kPoison;

cpu::ThreadPool& Pool3() {
  static cpu::ThreadPool* pool = new cpu::ThreadPool(3);
  return *pool;
}

// ---------------------------------------------------------------- Philox KATs

struct Kat {
  Philox4x32Counter counter;
  Philox4x32Key key;
  uint32_t expected[4];
};

TEST(PhiloxTest, Random123KnownAnswers) {
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, {{0, 0}}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       {{0xffffffff, 0xffffffff}},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       {{0xa4093822, 0x299f31d0}},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& kat : kats) {
    const Philox4x32Counter out = Philox4x32_10(kat.counter, kat.key);
    EXPECT_THAT(out.v, ::testing::ElementsAreArray(kat.expected));
  }
  static_assert(Philox4x32_10({{0, 0, 0, 0}}, {{0, 0}}).v[3] == 0x9b00dbd8u, "constexpr");
}

TEST(PhiloxTest, SamplePositionKeyFollowsTheContract) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200; ++i) {
    const uint64_t seed = rng(), step = rng() >> 32;
    const int64_t l = rng() % 5000, b = rng() % 5000, s = rng() % 100000;
    EXPECT_EQ(SamplePositionKey(seed, step, l, b, s),
              testing::ReferenceSampleKey(seed, step, l, b, s));
  }
}

// ------------------------------------------------------------ vs. reference

TEST(SampleTokensTest, MatchesNaiveReference) {
  std::mt19937_64 rng(2024);
  const int64_t sizes[] = {1, 2, 3, 7, 16, 63, 64, 255, 1000, 4097};
  int cases = 0;
  for (int64_t S : sizes) {
    for (int rep = 0; rep < 4; ++rep) {
      const int64_t L = 1 + rng() % 3, B = 1 + rng() % 3;
      int64_t R = static_cast<int64_t>(rng() % (S + 1));
      if (rep == 0) R = S / 2;
      const DType dtype = rep % 2 == 0 ? DType::kInt32 : DType::kInt64;
      const Layout layout = rep >= 2 ? Layout{{1, 2, 3}, 4 + rep} : Layout{};
      const uint64_t seed = rng(), step = rng() >> 32;
      for (cpu::ThreadPool* pool : {static_cast<cpu::ThreadPool*>(nullptr), &Pool3()}) {
        Outputs o = MakeOutputs(L, B, S, R, dtype, /*inverse=*/rep != 1, layout);
        ASSERT_OK(cpu::SampleTokens(MakeArgs(L, B, S, R, seed, step, o), pool));
        ExpectMatchesReference(o, L, B, S, R, seed, step);
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 80);
}

TEST(SampleTokensTest, LargeRowsMatchReference) {
  const int64_t S = 20001, R = 15000;
  Outputs o = MakeOutputs(2, 2, S, R, DType::kInt64, true, {{0, 1, 0}, 3});
  ASSERT_OK(cpu::SampleTokens(MakeArgs(2, 2, S, R, 0xDEADBEEFCAFEull, 9, o), &Pool3()));
  ExpectMatchesReference(o, 2, 2, S, R, 0xDEADBEEFCAFEull, 9);
}

// Rows longer than kChunkedSelectMinS take the chunked path (keys recomputed
// per pass instead of S * 12 bytes of scratch): same contract, same reference.
TEST(SampleTokensTest, ChunkedLongRowsMatchReference) {
  const int64_t S = cpu::kChunkedSelectMinS + 77;
  for (const int64_t R : {int64_t{1}, S / 2 + 1, S - 1}) {
    const int64_t B = R == 1 ? 2 : 1;
    Outputs o = MakeOutputs(1, B, S, R, DType::kInt32, R != S - 1);
    ASSERT_OK(cpu::SampleTokens(MakeArgs(1, B, S, R, 0x5EED, 3, o), &Pool3()));
    ExpectMatchesReference(o, 1, B, S, R, 0x5EED, 3);
  }
}

// -------------------------------------------------------------- determinism

TEST(SampleTokensTest, DeterministicAcrossCallsAndThreadCounts) {
  const int64_t L = 5, B = 7, S = 300, R = 111;
  Outputs a = MakeOutputs(L, B, S, R, DType::kInt32, true);
  Outputs b = MakeOutputs(L, B, S, R, DType::kInt32, true);
  Outputs c = MakeOutputs(L, B, S, R, DType::kInt32, true);
  cpu::ThreadPool pool1(1);
  ASSERT_OK(cpu::SampleTokens(MakeArgs(L, B, S, R, 42, 3, a), &pool1));
  ASSERT_OK(cpu::SampleTokens(MakeArgs(L, B, S, R, 42, 3, b), &Pool3()));
  ASSERT_OK(cpu::SampleTokens(MakeArgs(L, B, S, R, 42, 3, c), &Pool3()));
  EXPECT_EQ(a.ids.Bytes(), b.ids.Bytes());
  EXPECT_EQ(b.ids.Bytes(), c.ids.Bytes());
  EXPECT_EQ(a.inverse->Bytes(), b.inverse->Bytes());
}

TEST(SampleTokensTest, EveryInputOfTheCounterChangesTheRow) {
  const int64_t S = 64, R = 16;
  auto row = [&](uint64_t seed, uint64_t step, int64_t L, int64_t B) {
    Outputs o = MakeOutputs(L, B, S, R, DType::kInt32, false);
    EXPECT_OK(cpu::SampleTokens(MakeArgs(L, B, S, R, seed, step, o), nullptr));
    return Row(o.ids, L * B - 1);  // the last row: (L-1, B-1)
  };
  const std::vector<int64_t> base = row(1, 1, 1, 1);
  EXPECT_NE(row(2, 1, 1, 1), base);                        // seed, low word
  EXPECT_NE(row(1 + (uint64_t{1} << 32), 1, 1, 1), base);  // seed, high word
  EXPECT_NE(row(1, 2, 1, 1), base);                        // step
  EXPECT_NE(row(1, 1, 2, 1), base);                        // layer
  EXPECT_NE(row(1, 1, 1, 2), base);                        // batch
  EXPECT_EQ(row(1, 1, 1, 1), base);
  // Row (l, b) does not depend on L and B.
  Outputs big = MakeOutputs(3, 4, S, R, DType::kInt32, false);
  ASSERT_OK(cpu::SampleTokens(MakeArgs(3, 4, S, R, 1, 1, big), nullptr));
  Outputs small = MakeOutputs(1, 1, S, R, DType::kInt32, false);
  ASSERT_OK(cpu::SampleTokens(MakeArgs(1, 1, S, R, 1, 1, small), nullptr));
  EXPECT_EQ(Row(big.ids, 0), Row(small.ids, 0));
}

TEST(SampleTokensTest, RowsAreAscendingUniqueAndInRange) {
  const int64_t L = 4, B = 50, S = 97, R = 40;
  Outputs o = MakeOutputs(L, B, S, R, DType::kInt64, false);
  ASSERT_OK(cpu::SampleTokens(MakeArgs(L, B, S, R, 99, 0, o), &Pool3()));
  for (int64_t row = 0; row < L * B; ++row) {
    const std::vector<int64_t> ids = Row(o.ids, row);
    for (int64_t i = 0; i < R; ++i) {
      ASSERT_GE(ids[i], 0);
      ASSERT_LT(ids[i], S);
      if (i > 0) {
        ASSERT_LT(ids[i - 1], ids[i]);
      }
    }
  }
}

// ---------------------------------------------------------------- statistics

// Inclusion counts over L*B rows: z-score of every position and a chi-square
// style sum, plus the co-inclusion of every pair. Fixed seeds: cannot flake.
void CheckUniform(int64_t S, int64_t R, int64_t L, int64_t B, uint64_t seed) {
  Outputs o = MakeOutputs(L, B, S, R, DType::kInt32, false);
  ASSERT_OK(cpu::SampleTokens(MakeArgs(L, B, S, R, seed, 5, o), &Pool3()));
  const double n = static_cast<double>(L * B);
  std::vector<double> count(S, 0.0);
  std::vector<double> pair(S * S, 0.0);
  for (int64_t row = 0; row < L * B; ++row) {
    const std::vector<int64_t> ids = Row(o.ids, row);
    for (int64_t i = 0; i < R; ++i) {
      count[ids[i]] += 1;
      for (int64_t j = i + 1; j < R; ++j) pair[ids[i] * S + ids[j]] += 1;
    }
  }
  const double p = static_cast<double>(R) / S;
  const double var = n * p * (1 - p);
  double max_z = 0, chi = 0;
  for (int64_t s = 0; s < S; ++s) {
    const double d = count[s] - n * p;
    max_z = std::max(max_z, std::abs(d) / std::sqrt(var));
    chi += d * d / var;
  }
  EXPECT_LT(max_z, 6.0) << "S=" << S << " R=" << R;
  // Mean S, sd about sqrt(2S): a generous two-sided window.
  EXPECT_LT(chi, S + 8 * std::sqrt(2.0 * S) + 10) << "S=" << S;
  EXPECT_GT(chi, std::max(0.0, S - 8 * std::sqrt(2.0 * S) - 10)) << "S=" << S;
  const double q = p * (R - 1.0) / (S - 1.0);
  double max_pair_z = 0;
  for (int64_t i = 0; i < S; ++i) {
    for (int64_t j = i + 1; j < S; ++j) {
      max_pair_z =
          std::max(max_pair_z, std::abs(pair[i * S + j] - n * q) / std::sqrt(n * q * (1 - q)));
    }
  }
  EXPECT_LT(max_pair_z, 7.0) << "S=" << S;
}

TEST(SampleTokensTest, InclusionFrequencyIsUniform) {
  CheckUniform(64, 16, 100, 200, 12345);
  CheckUniform(7, 3, 40, 500, 777);
  CheckUniform(33, 32, 20, 1000, 1);
}

// ---------------------------------------------------------------- edge cases

TEST(SampleTokensTest, RetainNothingOrEverything) {
  for (int64_t S : {1, 2, 9}) {
    for (int64_t R : {int64_t{0}, S}) {
      Outputs o = MakeOutputs(2, 3, S, R, DType::kInt64, true, {{1, 0, 1}, 8});
      ASSERT_OK(cpu::SampleTokens(MakeArgs(2, 3, S, R, 5, 6, o), &Pool3()));
      for (int64_t row = 0; row < 6; ++row) {
        for (int64_t i = 0; i < R; ++i) EXPECT_EQ(o.ids.GetIndex(row * R + i), i);
        for (int64_t s = 0; s < S; ++s) {
          EXPECT_EQ(o.inverse->Get<int32_t>(row * S + s), R == 0 ? -1 : s);
        }
      }
      EXPECT_TRUE(OnlyElementsWritten(o.ids, o.ids_before, kPoison));
      EXPECT_TRUE(OnlyElementsWritten(*o.inverse, o.inverse_before, kPoison));
    }
  }
}

TEST(SampleTokensTest, EmptyShapes) {
  for (auto [L, B, S] : {std::tuple{0, 3, 5}, {2, 0, 5}, {2, 3, 0}}) {
    Outputs o = MakeOutputs(L, B, S, 0, DType::kInt32, true);
    EXPECT_OK(cpu::SampleTokens(MakeArgs(L, B, S, 0, 1, 1, o), &Pool3()));
    EXPECT_TRUE(OnlyElementsWritten(*o.inverse, o.inverse_before, kPoison));
  }
  Outputs o = MakeOutputs(0, 3, 5, 2, DType::kInt32, false);
  EXPECT_OK(cpu::SampleTokens(MakeArgs(0, 3, 5, 2, 1, 1, o), nullptr));
}

TEST(SampleTokensTest, ExtremeSeedAndStep) {
  const uint64_t seed = ~uint64_t{0}, step = kSampleMaxCounterWord;
  Outputs o = MakeOutputs(2, 2, 50, 20, DType::kInt32, true);
  ASSERT_OK(cpu::SampleTokens(MakeArgs(2, 2, 50, 20, seed, step, o), nullptr));
  ExpectMatchesReference(o, 2, 2, 50, 20, seed, step);
}

// ------------------------------------------------------- ties (crafted keys)

// The selection core with keys from a tiny range (many ties) or all in one
// radix bucket, against a stable sort; Philox keys never tie in practice.
TEST(SampleSelectTest, TiesGoToTheLowerPosition) {
  std::mt19937_64 rng(31);
  for (int iter = 0; iter < 300; ++iter) {
    const int64_t S = 1 + static_cast<int64_t>(rng() % 300);
    const int64_t R = static_cast<int64_t>(rng() % (S + 1));
    const int mode = iter % 3;
    std::vector<uint64_t> keys(S);
    for (uint64_t& k : keys) {
      if (mode == 0) k = rng() % 4;                               // many ties
      if (mode == 1) k = (uint64_t{0xABC} << 52) | (rng() % 64);  // one bucket
      if (mode == 2) k = (rng() % 3) << 62 | (rng() % 2);         // ties, few buckets
    }
    std::vector<int64_t> order(S);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t x, int64_t y) { return keys[x] < keys[y]; });
    order.resize(R);
    std::sort(order.begin(), order.end());
    std::vector<int32_t> picked(S + 1, -7);
    std::vector<int32_t> inv(S, -7);
    cpu::SelectScratch scratch;
    cpu::SelectRow(keys.data(), S, R, scratch, picked.data(), reinterpret_cast<char*>(inv.data()),
                   sizeof(int32_t));
    std::vector<int32_t> expected_inv(S, -1);
    for (int64_t i = 0; i < R; ++i) {
      ASSERT_EQ(picked[i], order[i]) << "iter " << iter << " S=" << S << " R=" << R;
      expected_inv[order[i]] = static_cast<int32_t>(i);
    }
    ASSERT_EQ(inv, expected_inv) << "iter " << iter;
    // The chunked selection (long rows) agrees, for any chunk size.
    const int64_t chunk = 1 + static_cast<int64_t>(rng() % S);
    std::vector<int32_t> picked_chunked(R + 1, -7);
    std::vector<int32_t> inv_chunked(S, -7);
    std::vector<uint64_t> buffer;
    int64_t produced = 0;
    auto keys_of = [&](int64_t begin, int64_t count, uint64_t* out) {
      ASSERT_EQ(begin % chunk, 0);
      std::copy(keys.begin() + begin, keys.begin() + begin + count, out);
      produced += count;
    };
    cpu::SelectRowChunked(keys_of, S, R, chunk, scratch, buffer, picked_chunked.data(),
                          reinterpret_cast<char*>(inv_chunked.data()), sizeof(int32_t));
    picked_chunked.resize(R);
    picked.resize(R);
    ASSERT_EQ(picked_chunked, picked) << "iter " << iter << " chunk " << chunk;
    ASSERT_EQ(inv_chunked, expected_inv) << "iter " << iter << " chunk " << chunk;
    ASSERT_LE(buffer.size(), static_cast<size_t>(chunk));
    if (R != 0 && R != S) {
      // Three passes, keys never held whole; more only to narrow a bucket of
      // more than MaxBucketKeys(S) = 256 crafted keys.
      ASSERT_EQ(produced % S, 0);
      ASSERT_GE(produced, 3 * S);
      if (S <= 256) {
        ASSERT_EQ(produced, 3 * S);
      }
    }
  }
}

// Threshold buckets above the limit are narrowed BucketBits(S) bits at a time (crafted
// keys only): same selection as a stable sort, and the bucket never holds
// more than the limit, for every narrowing depth (one to all 64 bits).
TEST(SampleSelectTest, NarrowedBucketsGiveTheSameSelection) {
  std::mt19937_64 rng(37);
  for (int iter = 0; iter < 400; ++iter) {
    const int64_t S = 2 + static_cast<int64_t>(rng() % 200);
    const int64_t R = 1 + static_cast<int64_t>(rng() % (S - 1));
    const int64_t max_bucket = 1 + static_cast<int64_t>(rng() % 8);
    const int mode = iter % 5;
    std::vector<uint64_t> keys(S);
    for (uint64_t& k : keys) {
      if (mode == 0) k = rng() % 4;                                 // ties, one top bucket
      if (mode == 1) k = (uint64_t{0xABC} << 52) | (rng() % 4096);  // one top bucket
      if (mode == 2) k = (uint64_t{0x12345} << 40) | (rng() % 3) << 20 | (rng() % 5);
      if (mode == 3) k = 0x0123456789ABCDEFu;  // all equal: 64 bits
      if (mode == 4) k = rng();
    }
    std::vector<int64_t> order(S);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t x, int64_t y) { return keys[x] < keys[y]; });
    order.resize(R);
    std::sort(order.begin(), order.end());
    std::vector<int32_t> inv(S, -7), expected_inv(S, -1);
    for (int64_t i = 0; i < R; ++i) expected_inv[order[i]] = static_cast<int32_t>(i);
    std::vector<int32_t> picked(R + 1, -7);
    cpu::SelectScratch scratch;
    cpu::SelectRow(keys.data(), S, R, scratch, picked.data(), reinterpret_cast<char*>(inv.data()),
                   sizeof(int32_t), max_bucket);
    picked.resize(R);
    ASSERT_EQ(std::vector<int64_t>(picked.begin(), picked.end()), order)
        << "iter " << iter << " S=" << S << " R=" << R << " limit " << max_bucket;
    ASSERT_EQ(inv, expected_inv) << "iter " << iter;
    ASSERT_LE(scratch.bucket.capacity(), static_cast<size_t>(max_bucket + 1)) << "iter " << iter;
    const int64_t chunk = 1 + static_cast<int64_t>(rng() % S);
    std::vector<int32_t> picked_chunked(R + 1, -7);
    std::vector<uint64_t> buffer;
    cpu::SelectScratch chunked_scratch;
    auto keys_of = [&](int64_t begin, int64_t count, uint64_t* out) {
      std::copy(keys.begin() + begin, keys.begin() + begin + count, out);
    };
    ASSERT_TRUE(cpu::SelectRowChunked(keys_of, S, R, chunk, chunked_scratch, buffer,
                                      picked_chunked.data(), nullptr, 0, max_bucket));
    picked_chunked.resize(R);
    ASSERT_EQ(picked_chunked, picked) << "iter " << iter << " chunk " << chunk;
    ASSERT_LE(chunked_scratch.bucket.capacity(), static_cast<size_t>(max_bucket + 1));
  }
}

// --------------------------------------------------------------------- masks

// SampleTokens with every optional output. mask is [B,H,sq,S].
struct Fixture {
  Fixture(int64_t L, int64_t B, int64_t H, int64_t sq, int64_t S, int64_t R, DType mask_dtype,
          const Layout& layout = {})
      : o(MakeOutputs(L, B, S, R, DType::kInt32, true, layout)),
        mask(mask_dtype, {B, H, sq, S}, layout),
        bert(mask_dtype, {L, B, H, R, R}, layout),
        gpt(mask_dtype, {B, H, R, R}, layout) {
    std::mt19937_64 rng(L * 1000 + S);
    mask.FillRandom(rng);
    bert.Fill(kPoison);
    gpt.Fill(kPoison);
    bert_before = bert.Bytes();
    gpt_before = gpt.Bytes();
    args = MakeArgs(L, B, S, R, 77, 8, o);
    args.mask = mask.view();
    args.bert_mask = bert.view();
    if (sq == S) args.gpt_mask = gpt.view();
  }
  bool Untouched() {
    return o.ids.Bytes() == o.ids_before && o.inverse->Bytes() == o.inverse_before &&
           bert.Bytes() == bert_before && gpt.Bytes() == gpt_before;
  }
  Outputs o;
  TestTensor mask, bert, gpt;
  std::vector<uint8_t> bert_before, gpt_before;
  SampleTokensArgs args;
};

TEST(SampleTokensTest, MasksMatchNaiveGatherAndSlice) {
  const int64_t L = 2, B = 3, H = 2, S = 11, R = 5;
  for (DType dtype : {DType::kUInt8, DType::kBFloat16, DType::kFloat32, DType::kInt64}) {
    for (int64_t sq : {int64_t{1}, S}) {
      for (bool padded : {false, true}) {
        const Layout layout = padded ? Layout{{1, 0, 2, 1, 3}, 1} : Layout{};
        Fixture f(L, B, H, sq, S, R, dtype, layout);
        ASSERT_OK(cpu::SampleTokens(f.args, &Pool3()));
        ExpectMatchesReference(f.o, L, B, S, R, 77, 8);
        for (int64_t l = 0; l < L; ++l) {
          for (int64_t b = 0; b < B; ++b) {
            const std::vector<int64_t> ids = ReferenceSampleRow(77, 8, l, b, S, R);
            for (int64_t h = 0; h < H; ++h) {
              for (int64_t i = 0; i < R; ++i) {
                for (int64_t j = 0; j < R; ++j) {
                  const int64_t q = sq == 1 ? 0 : ids[i];
                  const int64_t src = ((b * H + h) * sq + q) * S + ids[j];
                  const int64_t dst = (((l * B + b) * H + h) * R + i) * R + j;
                  ASSERT_EQ(f.bert.ElementBytes(dst), f.mask.ElementBytes(src));
                }
              }
            }
          }
        }
        EXPECT_TRUE(OnlyElementsWritten(f.bert, f.bert_before, kPoison));
        if (sq != S) continue;
        for (int64_t bh = 0; bh < B * H; ++bh) {
          for (int64_t i = 0; i < R; ++i) {
            for (int64_t j = 0; j < R; ++j) {
              ASSERT_EQ(f.gpt.ElementBytes((bh * R + i) * R + j),
                        f.mask.ElementBytes((bh * S + i) * S + j));
            }
          }
        }
        EXPECT_TRUE(OnlyElementsWritten(f.gpt, f.gpt_before, kPoison));
      }
    }
  }
}

// -------------------------------------------------------------------- errors

struct ErrorCase {
  const char* message;
  void (*mutate)(Fixture& f);
};

TEST(SampleTokensTest, ErrorsNameTheFieldAndWriteNothing) {
  const ErrorCase cases[] = {
      {"retained_tokens: 9 is out of range [0, 8]", [](Fixture& f) { f.args.retained_tokens = 9; }},
      {"retained_tokens: -1", [](Fixture& f) { f.args.retained_tokens = -1; }},
      {"original_tokens: 2147483648 is out of range",
       [](Fixture& f) { f.args.original_tokens = int64_t{1} << 31; }},
      {"original_tokens: -1", [](Fixture& f) { f.args.original_tokens = -1; }},
      {"layers: -1", [](Fixture& f) { f.args.layers = -1; }},
      {"batch: 4294967296", [](Fixture& f) { f.args.batch = int64_t{1} << 32; }},
      {"step: 4294967296 is out of range [0, 2^32)",
       [](Fixture& f) { f.args.step = uint64_t{1} << 32; }},
      {"ids: dtype float32", [](Fixture& f) { f.args.ids.dtype = DType::kFloat32; }},
      {"ids: rank is 2", [](Fixture& f) { f.args.ids.rank = 2; }},
      {"ids: dim 2 (R) is 4, expected 3", [](Fixture& f) { f.args.retained_tokens = 3; }},
      {"ids: dim 1 (B) is 2, expected 3", [](Fixture& f) { f.args.batch = 3; }},
      {"ids: output strides", [](Fixture& f) { f.args.ids.strides[2] = 0; }},
      {"inverse: dtype int64", [](Fixture& f) { f.args.inverse->dtype = DType::kInt64; }},
      {"inverse: dim 2 (S) is 8, expected 7",
       [](Fixture& f) {
         f.args.original_tokens = 7;
         f.args.mask.reset();
         f.args.bert_mask.reset();
         f.args.gpt_mask.reset();
       }},
      {"inverse: overlaps ids", [](Fixture& f) { f.args.inverse->data = f.args.ids.data; }},
      {"bert_mask: requires mask", [](Fixture& f) { f.args.mask.reset(); }},
      {"gpt_mask: requires mask",
       [](Fixture& f) {
         f.args.mask.reset();
         f.args.bert_mask.reset();
       }},
      {"mask: given but neither",
       [](Fixture& f) {
         f.args.bert_mask.reset();
         f.args.gpt_mask.reset();
       }},
      {"mask: dim 0 (B) is 1, expected 2", [](Fixture& f) { f.args.mask->shape[0] = 1; }},
      {"bert_mask: dtype float32 differs from mask dtype bfloat16",
       [](Fixture& f) { f.args.bert_mask->dtype = DType::kFloat32; }},
      {"bert_mask: dim 3 (R) is 3", [](Fixture& f) { f.args.bert_mask->shape[3] = 3; }},
      {"mask: dim 2 (Sq) is 3",
       [](Fixture& f) {
         f.args.mask->shape[2] = 3;
         f.args.gpt_mask.reset();
       }},
      {"mask: dim 2 (S) is 1",
       [](Fixture& f) {
         f.args.mask->shape[2] = 1;
         f.args.bert_mask.reset();
       }},
      {"bert_mask: dim 2 (H) is 2, expected 1", [](Fixture& f) { f.args.mask->shape[1] = 1; }},
      {"gpt_mask: dim 1 (H) is 2, expected 1",
       [](Fixture& f) {
         f.args.mask->shape[1] = 1;
         f.args.bert_mask.reset();
       }},
      {"gpt_mask: rank is 5", [](Fixture& f) { f.args.gpt_mask = f.args.bert_mask; }},
      {"bert_mask: overlaps mask", [](Fixture& f) { f.args.bert_mask->data = f.args.mask->data; }},
      {"gpt_mask: overlaps bert_mask",
       [](Fixture& f) { f.args.gpt_mask->data = f.args.bert_mask->data; }},
  };
  {
    Fixture ok(2, 2, 2, 8, 8, 4, DType::kBFloat16);
    ASSERT_OK(cpu::SampleTokens(ok.args, nullptr));
  }
  for (const ErrorCase& c : cases) {
    Fixture f(2, 2, 2, 8, 8, 4, DType::kBFloat16);
    c.mutate(f);
    EXPECT_THAT(ValidateSampleTokens(f.args),
                StatusIs(absl::StatusCode::kInvalidArgument, c.message));
    EXPECT_THAT(cpu::SampleTokens(f.args, &Pool3()),
                StatusIs(absl::StatusCode::kInvalidArgument, c.message));
    EXPECT_TRUE(f.Untouched()) << c.message;
  }
}

}  // namespace
}  // namespace tokensel::kernels
