// Racing clients vs the index ops on the GPU (label gpu; skips without a
// device): GatherTokens, ScatterTokens, GatherBertMask and SortTokens run
// while a host thread flips one index element of the client's buffer between
// its valid value and an out-of-range, negative or duplicate one
// (race_gpu_util.h). Before the snapshot (kernels/cuda/snapshot.cuh), the
// check kernel and the copy kernel read the buffer separately: a run whose
// check saw the valid value and whose copy saw the flipped one read or wrote
// far outside the views (illegal address: INTERNAL and a dead context) or
// wrote wrong rows; SortTokens's Finish re-read the buffer for its message
// and could return INTERNAL. Now every run must end OK with the result of the
// original indices, or INVALID_ARGUMENT with nothing written, and never
// write outside its outputs.
#include <cstdint>
#include <iostream>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/kernels/cuda/race_gpu_util.h"

namespace tokensel::racetest {
namespace {

namespace kc = kernels::cuda;
namespace cpu = kernels::cpu;

constexpr int kRuns = 60;

void FillRandom(Tensor& t, std::mt19937_64& rng) {
  for (uint8_t& b : t.bytes) b = static_cast<uint8_t>(rng());
}

// Rows of `n` indices in [0, s), unique within each row when `unique`.
void FillIndices(Tensor& t, int64_t n, int64_t s, bool unique, std::mt19937_64& rng) {
  std::vector<int64_t> perm(static_cast<size_t>(s));
  for (int64_t row = 0; row < t.Elements() / n; ++row) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = unique ? i + static_cast<int64_t>(rng() % (s - i)) : 0;
      if (unique) std::swap(perm[i], perm[j]);
      t.SetIndex(row * n + i, unique ? perm[i] : static_cast<int64_t>(rng() % s));
    }
  }
}

// The flip of run `run`: element `e` toggles between its value and a bad one
// (out of range, negative, or with `dup_ok` the value of another element of
// its row: a duplicate).
struct Flip {
  int64_t e;
  int64_t bad;
};
Flip PickFlip(const Tensor& idx, int64_t n, int run, bool dup_ok, std::mt19937_64& rng) {
  const int64_t e = static_cast<int64_t>(rng() % static_cast<uint64_t>(idx.Elements()));
  const int64_t value = idx.GetIndex(e);
  if (dup_ok && run % 3 == 2 && n > 1) {
    const int64_t pos = e % n;
    const int64_t other = e - pos + (pos + 1 + static_cast<int64_t>(rng() % (n - 1))) % n;
    return {e, idx.GetIndex(other)};
  }
  return {e, Corrupt(value, idx.dtype, run % 3 == 1)};
}

class RaceIndexGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { TOKENSEL_REQUIRE_GPU(); }
  void TearDown() override {
    if (!IsSkipped()) {
      std::cout << "runs OK " << ok_ << ", INVALID_ARGUMENT " << invalid_ << "\n";
      if (!HasFatalFailure()) ExpectRaceObserved(ok_, invalid_, /*expect_ok=*/true);
    }
  }
  std::mt19937_64 rng_{20240721};
  int ok_ = 0;
  int invalid_ = 0;
};

TEST_F(RaceIndexGpuTest, GatherTokens) {
  const int64_t b = 4, s = 512, r = 64, c = 40;
  for (DType index : {DType::kInt32, DType::kInt64}) {
    Tensor act(DType::kFloat32, {b, s, c});
    Tensor out(DType::kFloat32, {b, r, c}, 3);
    Tensor idx(index, {b, r}, 5);  // padded rows: the strided snapshot path
    FillRandom(act, rng_);
    FillRandom(out, rng_);
    FillIndices(idx, r, s, false, rng_);
    Tensor expected = out;
    Tensor host_idx = idx;
    ASSERT_TRUE(
        cpu::GatherTokens({act.Host(), host_idx.Host(), expected.Host(), true}, nullptr).ok());
    GuardedCopy d_act(act), d_out(out);
    MappedCopy m_idx(idx);
    const kernels::GatherTokensArgs args{d_act.view(), m_idx.view(), d_out.view(), true};
    for (int run = 0; run < kRuns && !HasFatalFailure(); ++run) {
      const Flip f = PickFlip(idx, r, run, false, rng_);
      absl::Status status;
      {
        Flipper flipper(m_idx.HostElement(f.e), index, idx.GetIndex(f.e), f.bad);
        status = RunCuda(args, kc::GatherTokensWorkspaceBytes, kc::GatherTokensAsync,
                         kc::GatherTokensFinish);
      }
      ExpectOutcome(status, "indices", {{&d_out, out.bytes, expected.bytes}}, &ok_, &invalid_);
      if (status.ok()) {  // restore the poison for the next run
        TOKENSEL_EXPECT_CUDA(cudaMemcpy(d_out.view().data, out.bytes.data(), out.bytes.size(),
                                        cudaMemcpyHostToDevice));
      }
    }
  }
}

TEST_F(RaceIndexGpuTest, ScatterTokens) {
  const int64_t b = 3, s = 300, r = 100, c = 24;
  for (DType index : {DType::kInt32, DType::kInt64}) {
    for (bool bf : {true, false}) {
      Tensor all(DType::kBFloat16,
                 bf ? std::vector<int64_t>{b, s, c} : std::vector<int64_t>{s, b, c});
      Tensor layer(DType::kBFloat16,
                   bf ? std::vector<int64_t>{b, r, c} : std::vector<int64_t>{r, b, c});
      Tensor idx(index, {b, r}, 2);
      FillRandom(all, rng_);
      FillRandom(layer, rng_);
      FillIndices(idx, r, s, true, rng_);
      Tensor expected = all;
      Tensor host_idx = idx;
      ASSERT_TRUE(
          cpu::ScatterTokens({expected.Host(), layer.Host(), host_idx.Host(), bf}, nullptr).ok());
      GuardedCopy d_all(all), d_layer(layer);
      MappedCopy m_idx(idx);
      const kernels::ScatterTokensArgs args{d_all.view(), d_layer.view(), m_idx.view(), bf};
      for (int run = 0; run < kRuns && !HasFatalFailure(); ++run) {
        const Flip f = PickFlip(idx, r, run, true, rng_);
        absl::Status status;
        {
          Flipper flipper(m_idx.HostElement(f.e), index, idx.GetIndex(f.e), f.bad);
          status = RunCuda(args, kc::ScatterTokensWorkspaceBytes, kc::ScatterTokensAsync,
                           kc::ScatterTokensFinish);
        }
        ExpectOutcome(status, "indices", {{&d_all, all.bytes, expected.bytes}}, &ok_, &invalid_);
        if (status.ok()) {
          TOKENSEL_EXPECT_CUDA(cudaMemcpy(d_all.view().data, all.bytes.data(), all.bytes.size(),
                                          cudaMemcpyHostToDevice));
        }
      }
    }
  }
}

TEST_F(RaceIndexGpuTest, GatherBertMask) {
  const int64_t l = 2, b = 2, h = 2, s = 200, r = 48;
  for (DType index : {DType::kInt32, DType::kInt64}) {
    for (int64_t sq : {int64_t{1}, s}) {
      Tensor mask(DType::kFloat16, {b, h, sq, s});
      Tensor out(DType::kFloat16, {l, b, h, r, r});
      Tensor idx(index, {l, b, r}, 1);
      FillRandom(mask, rng_);
      FillRandom(out, rng_);
      FillIndices(idx, r, s, false, rng_);
      Tensor expected = out;
      Tensor host_idx = idx;
      ASSERT_TRUE(
          cpu::GatherBertMask({mask.Host(), host_idx.Host(), expected.Host()}, nullptr).ok());
      GuardedCopy d_mask(mask), d_out(out);
      MappedCopy m_idx(idx);
      const kernels::GatherBertMaskArgs args{d_mask.view(), m_idx.view(), d_out.view()};
      for (int run = 0; run < kRuns && !HasFatalFailure(); ++run) {
        const Flip f = PickFlip(idx, r, run, false, rng_);
        absl::Status status;
        {
          Flipper flipper(m_idx.HostElement(f.e), index, idx.GetIndex(f.e), f.bad);
          status = RunCuda(args, kc::GatherBertMaskWorkspaceBytes, kc::GatherBertMaskAsync,
                           kc::GatherBertMaskFinish);
        }
        ExpectOutcome(status, "indices", {{&d_out, out.bytes, expected.bytes}}, &ok_, &invalid_);
        if (status.ok()) {
          TOKENSEL_EXPECT_CUDA(cudaMemcpy(d_out.view().data, out.bytes.data(), out.bytes.size(),
                                          cudaMemcpyHostToDevice));
        }
      }
    }
  }
}

TEST_F(RaceIndexGpuTest, SortTokens) {
  const int64_t rows = 6, s = 70000, r = 700;  // two bitmap chunks per row
  for (DType index : {DType::kInt32, DType::kInt64}) {
    Tensor ids(index, {rows, r}, 1);
    Tensor out(index, {rows, r});
    Tensor inverse(DType::kInt32, {rows, s});
    FillIndices(ids, r, s, true, rng_);
    FillRandom(out, rng_);
    FillRandom(inverse, rng_);
    Tensor expected_out = out;
    Tensor expected_inv = inverse;
    Tensor host_ids = ids;
    kernels::SortTokensArgs host;
    host.ids = host_ids.Host();
    host.original_tokens = s;
    host.out = expected_out.Host();
    host.inverse = expected_inv.Host();
    ASSERT_TRUE(cpu::SortTokens(host, nullptr).ok());
    GuardedCopy d_out(out), d_inv(inverse);
    MappedCopy m_ids(ids);
    kernels::SortTokensArgs args;
    args.ids = m_ids.view();
    args.original_tokens = s;
    args.out = d_out.view();
    args.inverse = d_inv.view();
    for (int run = 0; run < kRuns && !HasFatalFailure(); ++run) {
      const Flip f = PickFlip(ids, r, run, true, rng_);
      absl::Status status;
      {
        Flipper flipper(m_ids.HostElement(f.e), index, ids.GetIndex(f.e), f.bad);
        status =
            RunCuda(args, kc::SortTokensWorkspaceBytes, kc::SortTokensAsync, kc::SortTokensFinish);
      }
      ExpectOutcome(
          status, "ids",
          {{&d_out, out.bytes, expected_out.bytes}, {&d_inv, inverse.bytes, expected_inv.bytes}},
          &ok_, &invalid_);
      if (status.ok()) {
        TOKENSEL_EXPECT_CUDA(cudaMemcpy(d_out.view().data, out.bytes.data(), out.bytes.size(),
                                        cudaMemcpyHostToDevice));
        TOKENSEL_EXPECT_CUDA(cudaMemcpy(d_inv.view().data, inverse.bytes.data(),
                                        inverse.bytes.size(), cudaMemcpyHostToDevice));
      }
    }
  }
}

}  // namespace
}  // namespace tokensel::racetest
