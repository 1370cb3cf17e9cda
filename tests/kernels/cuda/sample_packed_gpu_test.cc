// GPU conformance of SamplePackedTokens: the CUDA op and the CPU op (the
// oracle) run on byte-identical host tensors, and every byte of every tensor
// (gaps included) and the status (code and message) must match; error cases
// thereby prove that the CUDA path wrote nothing. Covers both CUDA paths
// (one block per short sequence; chunks of long sequences over many blocks,
// sample_packed_plan.h) and the multi-block scans. The workspace starts
// filled with 0xA5 (gpu_twins.h), so a section read before it is written
// shows. Skips with "no CUDA device: ..." when there is no device.
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/kernels/cuda/gpu_twins.h"
#include "tests/testing/test_tensor.h"

namespace tokensel::kernels::cuda {
namespace {

using gputest::Compare;
using gputest::Twin;
using testing::TestTensor;

// A twin whose two copies get the same contents from `fill`.
std::unique_ptr<Twin> MakeFilled(DType dtype, std::vector<int64_t> shape, testing::Layout layout,
                                 int64_t step,
                                 const std::function<void(TestTensor&, Twin&)>& fill) {
  std::mt19937_64 unused(0);
  auto twin = gputest::MakeTwin(dtype, std::move(shape), layout, step, unused);
  fill(twin->cpu, *twin);
  fill(twin->gpu, *twin);
  return twin;
}

void Sentinel(TestTensor& t, Twin&) { t.Fill(0xC5); }

class SamplePackedGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { TOKENSEL_REQUIRE_GPU(); }
  std::mt19937_64 rng_{20240611};
};

struct PackedGpuCase {
  std::vector<int32_t> cu;
  int64_t total_tokens;
  int64_t keep_num, keep_den, min_tokens;
  int64_t layers;
  int64_t kept_dim;  // dim 1 of ids / positions, dim 0 of out (T' when valid)
  bool positions, inverse;
  int64_t channels;  // > 0: activations and out (layers must be 1)
};

void RunPacked(const PackedGpuCase& c, std::mt19937_64& rng) {
  const int64_t n_plus_1 = static_cast<int64_t>(c.cu.size());
  std::vector<Twin*> twins;
  auto cu = MakeFilled(DType::kInt32, {n_plus_1}, {.pad = {}, .misalign = 4}, 2,
                       [&](TestTensor& t, Twin& twin) {
                         t.Fill(0x7F);
                         const TensorView v = twin.View(t);
                         for (int64_t i = 0; i < n_plus_1; ++i) {
                           std::memcpy(v.At(i * v.strides[0]), &c.cu[i], 4);
                         }
                       });
  twins.push_back(cu.get());
  auto cu_kept = MakeFilled(DType::kInt32, {n_plus_1}, {}, 1, Sentinel);
  twins.push_back(cu_kept.get());
  auto ids = MakeFilled(DType::kInt32, {c.layers, c.kept_dim}, {.pad = {0, 3}, .misalign = 0}, 1,
                        Sentinel);
  twins.push_back(ids.get());
  std::unique_ptr<Twin> pos, inv, act, out;
  if (c.positions) {
    pos = MakeFilled(DType::kInt32, {c.layers, c.kept_dim}, {}, 1, Sentinel);
    twins.push_back(pos.get());
  }
  if (c.inverse) {
    inv = MakeFilled(DType::kInt32, {c.layers, c.total_tokens}, {.pad = {0, 1}, .misalign = 0}, 1,
                     Sentinel);
    twins.push_back(inv.get());
  }
  if (c.channels > 0) {
    const uint64_t fill_seed = rng();
    act = MakeFilled(DType::kBFloat16, {c.total_tokens, c.channels}, {}, 1,
                     [&](TestTensor& t, Twin&) {
                       std::mt19937_64 local(fill_seed);
                       t.FillRandom(local);
                     });
    twins.push_back(act.get());
    out = MakeFilled(DType::kBFloat16, {c.kept_dim, c.channels}, {.pad = {0, 5}, .misalign = 2}, 1,
                     Sentinel);
    twins.push_back(out.get());
  }
  const uint64_t seed = rng(), step = rng() >> 40;
  Compare<SamplePackedTokensArgs>(
      [&](const std::vector<TensorView>& v) {
        SamplePackedTokensArgs a;
        size_t i = 0;
        a.cu_seqlens = v[i++];
        a.cu_seqlens_kept = v[i++];
        a.ids = v[i++];
        if (c.positions) a.positions = v[i++];
        if (c.inverse) a.inverse = v[i++];
        if (c.channels > 0) {
          a.activations = v[i++];
          a.out = v[i++];
        }
        a.total_tokens = c.total_tokens;
        a.keep_num = c.keep_num;
        a.keep_den = c.keep_den;
        a.min_tokens = c.min_tokens;
        a.layers = c.layers;
        a.seed = seed;
        a.step = step;
        return a;
      },
      twins, [](const SamplePackedTokensArgs& a) { return cpu::SamplePackedTokens(a, nullptr); },
      SamplePackedTokensWorkspaceBytes, SamplePackedTokensAsync, SamplePackedTokensFinish);
}

// ids sized right (T' = 3) but positions with dim 1 = 4: the device's dims
// check must flag it like the CPU, writing nothing.
void RunPackedPositionsMismatch(std::mt19937_64& rng) {
  std::vector<Twin*> twins;
  const std::vector<int32_t> cu_values = {0, 4, 6};
  auto cu = MakeFilled(DType::kInt32, {3}, {}, 1, [&](TestTensor& t, Twin&) {
    for (int64_t i = 0; i < 3; ++i) t.SetIndex(i, cu_values[i]);
  });
  auto cu_kept = MakeFilled(DType::kInt32, {3}, {}, 1, Sentinel);
  auto ids = MakeFilled(DType::kInt32, {1, 3}, {}, 1, Sentinel);
  auto pos = MakeFilled(DType::kInt32, {1, 4}, {}, 1, Sentinel);
  twins = {cu.get(), cu_kept.get(), ids.get(), pos.get()};
  const uint64_t seed = rng();
  Compare<SamplePackedTokensArgs>(
      [&](const std::vector<TensorView>& v) {
        SamplePackedTokensArgs a;
        a.cu_seqlens = v[0];
        a.cu_seqlens_kept = v[1];
        a.ids = v[2];
        a.positions = v[3];
        a.total_tokens = 6;
        a.keep_num = 1;
        a.keep_den = 2;
        a.layers = 1;
        a.seed = seed;
        return a;
      },
      twins, [](const SamplePackedTokensArgs& a) { return cpu::SamplePackedTokens(a, nullptr); },
      SamplePackedTokensWorkspaceBytes, SamplePackedTokensAsync, SamplePackedTokensFinish);
}

int64_t PackedKept(const std::vector<int32_t>& cu, int64_t num, int64_t den, int64_t min_tokens) {
  SamplePackedTokensArgs a;
  a.keep_num = num;
  a.keep_den = den;
  a.min_tokens = min_tokens;
  return PackedKeptTokens(cu.data(), static_cast<int64_t>(cu.size()), a);
}

TEST_F(SamplePackedGpuTest, MatchesCpuBitForBit) {
  // Mixed lengths: empty, one token, odd, one past the radix tile, long.
  std::vector<int32_t> mixed = {0};
  for (int32_t n : {0, 1, 7, 513, 0, 3, 40000, 2, 1000}) mixed.push_back(mixed.back() + n);
  // Many short sequences (more tasks than the grid's blocks).
  std::vector<int32_t> many = {0};
  for (int i = 0; i < 70000; ++i) many.push_back(many.back() + static_cast<int32_t>(rng_() % 6));
  for (const auto& cu : {std::vector<int32_t>{0}, std::vector<int32_t>{0, 0}, mixed, many}) {
    for (const auto& [num, den, min_tokens] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {1, 2, 1}, {1, 1, 0}, {0, 1, 0}, {3, 7, 2}}) {
      const int64_t kept = PackedKept(cu, num, den, min_tokens);
      const int64_t T = cu.back() + 3;
      RunPacked({cu, T, num, den, min_tokens, 2, kept, true, true, 0}, rng_);
      RunPacked({cu, T, num, den, min_tokens, 1, kept, false, false, 9}, rng_);
      RunPacked({cu, T, num, den, min_tokens, 1, kept, true, true, 64}, rng_);
    }
  }
  // The 128-bit keep rule on the device: keep_den near 2^63.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (const auto& [num, den] : std::vector<std::pair<int64_t, int64_t>>{
           {kMax - 1, kMax}, {kMax / 3, kMax}, {1, kMax}, {(int64_t{1} << 62) + 1, kMax}}) {
    RunPacked({mixed, mixed.back(), num, den, 0, 1, PackedKept(mixed, num, den, 0), true, true, 0},
              rng_);
  }
  // Empty pack (T = 0), no layers (L = 0).
  RunPacked({{0}, 0, 1, 2, 0, 2, 0, true, true, 0}, rng_);
  RunPacked({mixed, mixed.back(), 1, 2, 0, 0, PackedKept(mixed, 1, 2, 0), true, true, 0}, rng_);
  // One sequence past the CPU's chunked-select threshold.
  const std::vector<int32_t> long_cu = {0, (1 << 20) + 5, (1 << 20) + 9};
  RunPacked({long_cu, long_cu.back(), 1, 3, 0, 1, PackedKept(long_cu, 1, 3, 0), true, true, 0},
            rng_);
}

// The long path (sample_packed_long.cu: sequences of >= kPackedLongMinTokens
// tokens, one block's task per (layer, chunk of 4096), grid-stride): every
// byte against the CPU.
TEST_F(SamplePackedGpuTest, LongPathMatchesCpu) {
  // One sequence of 2^20 tokens, every keep ratio from nothing to all
  // (r_i = 0, 1, n_i / 1000, n_i / 3, n_i / 2, n_i - 1, n_i), L = 3.
  const std::vector<int32_t> one = {0, 1 << 20};
  for (const auto& [num, den, min_tokens] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{0, 1, 0},
                                                          {0, 1, 1},
                                                          {1, 1000, 0},
                                                          {1, 3, 0},
                                                          {1, 2, 0},
                                                          {(1 << 20) - 1, 1 << 20, 0},
                                                          {1, 1, 0}}) {
    const int64_t kept = PackedKept(one, num, den, min_tokens);
    RunPacked({one, one.back() + 5, num, den, min_tokens, 3, kept, true, true, 0}, rng_);
    RunPacked({one, one.back(), num, den, min_tokens, 1, kept, false, false, 4}, rng_);
  }
  // More (layer, chunk) tasks than any device's resident grid (GridFor: 8
  // blocks per SM): L = 8 x 256 chunks = 2048 tasks, so blocks take several
  // tasks each and reuse their shared memory across them.
  for (const auto& [num, den] : std::vector<std::pair<int64_t, int64_t>>{{1, 3}, {1, 1}}) {
    RunPacked({one, one.back(), num, den, 0, 8, PackedKept(one, num, den, 0), false, false, 0},
              rng_);
  }
  // The path boundary (8192 short, 8193 long) and chunk boundaries, between
  // empty sequences.
  std::vector<int32_t> edges = {0};
  for (const int32_t n : {8192, 0, 8193, 8194, 0, 12288, 12289, 16383, 1}) {
    edges.push_back(edges.back() + n);
  }
  for (const auto& [num, den] : std::vector<std::pair<int64_t, int64_t>>{{1, 2}, {5, 7}}) {
    const int64_t kept = PackedKept(edges, num, den, 0);
    RunPacked({edges, edges.back() + 2, num, den, 0, 2, kept, true, true, 0}, rng_);
    RunPacked({edges, edges.back(), num, den, 0, 1, kept, true, false, 16}, rng_);
  }
  // Thousands of short sequences with a few long ones among them: both
  // paths in one launch sequence, L = 1 and L = 4.
  std::vector<int32_t> mixed = {0};
  for (int i = 0; i < 6000; ++i) {
    int32_t n = static_cast<int32_t>(rng_() % 40);
    if (i == 17) n = 100000;
    if (i == 2500) n = 8193;
    if (i == 4999) n = (1 << 18) + 3;
    if (i == 5999) n = 40000;
    mixed.push_back(mixed.back() + n);
  }
  for (const auto& [num, den, min_tokens] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 2, 1}, {3, 7, 2}, {0, 1, 0}, {1, 1, 0}}) {
    const int64_t kept = PackedKept(mixed, num, den, min_tokens);
    RunPacked({mixed, mixed.back() + 7, num, den, min_tokens, 4, kept, true, true, 0}, rng_);
    RunPacked({mixed, mixed.back(), num, den, min_tokens, 1, kept, true, true, 8}, rng_);
  }
}

// Millions of sequences: the multi-block scans (more than 1024 tiles of 4096
// sums, so the tile-sum scan takes several steps too).
TEST_F(SamplePackedGpuTest, MillionsOfSequences) {
  std::vector<int32_t> cu = {0};
  cu.reserve(5000008);
  for (int i = 0; i < 5000007; ++i) cu.push_back(cu.back() + static_cast<int32_t>(rng_() % 3));
  const int64_t kept = PackedKept(cu, 1, 2, 1);
  RunPacked({cu, cu.back() + 1, 1, 2, 1, 1, kept, true, false, 0}, rng_);
  RunPacked({cu, cu.back(), 1, 2, 1, 1, kept + 1, false, false, 0}, rng_);  // T' mismatch
}

// Bad data that would take the long path: nothing written,
// the CPU's message (from the device's report, not a host copy of cu_seqlens).
TEST_F(SamplePackedGpuTest, LongPathBadData) {
  const int32_t big = 1 << 16;
  RunPacked({{0, big, big - 1, 2 * big}, 2 * big, 1, 2, 0, 2, big, true, true, 0}, rng_);
  RunPacked({{0, big, 3 * big}, 2 * big, 1, 2, 0, 1, big, true, true, 0}, rng_);      // past T
  RunPacked({{0, big, 2 * big}, 2 * big, 1, 2, 0, 1, big - 1, true, true, 0}, rng_);  // T'
  // The first bad i wins among many (decreasing at i = 3000 and 5000).
  std::vector<int32_t> many = {0};
  for (int i = 0; i < 6000; ++i) many.push_back(many.back() + (i == 10 ? 9000 : 2));
  many[3001] = many[3000] - 1;
  many[5001] = many[5000] - 5;
  RunPacked({many, many.back() + 1, 1, 2, 0, 1, 1, true, true, 0}, rng_);
}

// Bad data: the same message as the CPU and nothing written (the Compare
// checks every byte of every tensor against the CPU run, which writes none).
TEST_F(SamplePackedGpuTest, BadDataWritesNothing) {
  RunPacked({{1, 3}, 4, 1, 2, 0, 1, 1, true, true, 4}, rng_);       // cu[0] != 0
  RunPacked({{0, 4, 2}, 4, 1, 2, 0, 1, 2, true, true, 4}, rng_);    // decreasing
  RunPacked({{0, 5}, 4, 1, 2, 0, 1, 3, true, true, 4}, rng_);       // past T
  RunPacked({{0, 4, 6}, 6, 1, 2, 0, 2, 4, true, true, 0}, rng_);    // T' = 3, not 4
  RunPacked({{0, 4, 6}, 6, 1, 2, 0, 1, 2, false, false, 4}, rng_);  // T' = 3, not 2
  RunPackedPositionsMismatch(rng_);                                 // ids right, positions not
}

}  // namespace
}  // namespace tokensel::kernels::cuda
