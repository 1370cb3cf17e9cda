// Stream-ordered staging on a real device (issue 12 item 2; label `gpu`,
// skips without a GPU, built only when this build has CUDA). Inline inputs
// are copied to the device and inline outputs zero-filled and copied back on
// the op's own non-blocking stream; staged anywhere else (the legacy stream,
// unsynchronized), a kernel could read an input before its copy landed or a
// fill could clear a result after the kernel wrote it. Many concurrent
// requests with large inline tensors, each compared with the CPU backend's
// answer, make such a race show; the pools must then be in a steady state.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "server/backends/cpu_backend.h"
#include "server/backends/cuda_backend.h"
#include "server/backends/cuda_devices.h"
#include "server/core/buffer_registry.h"
#include "server/core/executor.h"
#include "tests/server/core/fake_region_mapper.h"
#include "tests/testing/gpu_device.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {
namespace {

using kernels::DType;

// GatherTokens [B, S, C] fp32 with R random distinct indices per row, all
// inline; `seed` varies the data.
struct GatherCase {
  std::vector<float> acts;
  std::vector<int32_t> idx;
  core::GatherTokensRequest req;
};
GatherCase MakeCase(int64_t B, int64_t S, int64_t C, int64_t R, uint32_t seed) {
  GatherCase c;
  std::mt19937 rng(seed);
  c.acts.resize(static_cast<size_t>(B * S * C));
  for (float& v : c.acts) v = static_cast<float>(rng() % 100000);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int32_t> perm(static_cast<size_t>(S));
    for (int64_t s = 0; s < S; ++s) perm[s] = static_cast<int32_t>(s);
    std::shuffle(perm.begin(), perm.end(), rng);
    c.idx.insert(c.idx.end(), perm.begin(), perm.begin() + R);
  }
  c.req.activations.source = core::TensorSpec::Source::kInline;
  c.req.activations.dtype = DType::kFloat32;
  c.req.activations.shape = {B, S, C};
  c.req.activations.inline_data =
      absl::string_view(reinterpret_cast<const char*>(c.acts.data()), c.acts.size() * 4);
  c.req.indices.source = core::TensorSpec::Source::kInline;
  c.req.indices.dtype = DType::kInt32;
  c.req.indices.shape = {B, R};
  c.req.indices.inline_data =
      absl::string_view(reinterpret_cast<const char*>(c.idx.data()), c.idx.size() * 4);
  return c;
}

absl::StatusOr<std::unique_ptr<backends::CudaBackend>> FirstDevice() {
  const std::vector<core::DeviceDescription> devices = backends::ListCudaDevices();
  if (devices.empty())
    return absl::NotFoundError("the CUDA runtime sees a device, ListCudaDevices none");
  return backends::CudaBackend::Create(devices[0].uuid);
}

struct Node {
  FakeRegionMapper host;
  FakeRegionMapper device{core::MemoryKind::kCudaDevice};
  core::BufferRegistry registry{&host, &device, core::RegistryLimits(), nullptr};
};

TEST(CudaStagingGpuTest, ConcurrentInlineRequestsMatchTheCpu) {
  TOKENSEL_REQUIRE_GPU();
  absl::StatusOr<std::unique_ptr<backends::CudaBackend>> cuda = FirstDevice();
  ASSERT_OK(cuda);
  backends::CpuBackend cpu(2);
  Node node;
  core::ExecutorLimits limits;
  core::Executor on_gpu(cuda->get(), &node.registry, nullptr, limits);
  core::Executor on_cpu(&cpu, &node.registry, nullptr, limits);

  constexpr int kThreads = 8;
  constexpr int kRounds = 20;
  auto wave = [&](int threads_n, uint32_t base) {
    std::vector<std::thread> threads;
    for (int t = 0; t < threads_n; ++t) {
      threads.emplace_back([&, t] {
        for (int round = 0; round < kRounds; ++round) {
          // ~2 MiB of activations, 1 MiB of output: copies that take time.
          GatherCase c = MakeCase(4, 1024, 128, 512, base + t * 1000 + round);
          absl::StatusOr<core::OpResult> want = on_cpu.Run("s", c.req);
          absl::StatusOr<core::OpResult> got = on_gpu.Run("s", c.req);
          ASSERT_OK(want);
          ASSERT_OK(got);
          ASSERT_EQ(got->outputs.size(), 1u);
          ASSERT_EQ(got->outputs[0].data, want->outputs[0].data)
              << "thread " << t << " round " << round;
        }
      });
    }
    for (std::thread& th : threads) th.join();
  };
  wave(kThreads, 1);
  // The bound of wave 1 (each pool, pinned and device alike): a request
  // stages acts (2 MiB), idx (8 KiB) and out (1 MiB). An 8 KiB request
  // reuses only an 8 KiB block (the next size up, 1 MiB, is more than twice
  // it): at most kThreads of them. A 1 MiB out may reuse an idle 2 MiB block
  // (within twice its size), so a later acts request may find no idle 2 MiB
  // block: a 2 MiB block is allocated only when every one is in use, by at
  // most kThreads acts plus kThreads outs, so at most 2 * kThreads; a 1 MiB
  // block only when every 1 MiB one is in use, by outs only: at most
  // kThreads. Hence 4 * kThreads. Nothing is trimmed meanwhile: all those
  // blocks together are 8 * (8 KiB + 1 MiB + 4 MiB) < 41 MiB, below the
  // 64 MiB cap, so no block is freed and allocated again. How many are
  // reached depends on the interleaving, so this is a bound, not a count.
  const int64_t staging = (*cuda)->staging_pool().allocations();
  const int64_t pinned = (*cuda)->pinned_pool().allocations();
  const int64_t workspaces = (*cuda)->workspace_allocations();
  EXPECT_LE(staging, 4 * kThreads);
  EXPECT_LE(pinned, 4 * kThreads);
  static_assert(size_t{kThreads} * ((8 << 10) + (1 << 20) + (4 << 20)) <
                backends::CudaBackend::kMaxCachedStagingBytes);
  // Wave 2 on one thread: one request's three blocks in use at a time, and
  // wave 1 left idle (nothing trimmed) an 8 KiB block and at least two large
  // ones (some request held its acts and its out at once), one of them
  // 2 MiB (acts take only 2 MiB blocks; the other fits an out): it
  // allocates nothing, whatever wave 1's interleaving was.
  wave(1, 2);
  EXPECT_EQ((*cuda)->staging_pool().allocations(), staging);
  EXPECT_EQ((*cuda)->pinned_pool().allocations(), pinned);
  EXPECT_EQ((*cuda)->workspace_allocations(), workspaces);
  EXPECT_EQ((*cuda)->staging_pool().blocks_in_use(), 0u);
  EXPECT_EQ((*cuda)->pinned_pool().blocks_in_use(), 0u);
  EXPECT_LE((*cuda)->staging_pool().cached_bytes(), backends::CudaBackend::kMaxCachedStagingBytes);
}

// Bad-index and good requests mixed, concurrently, with inline staging, on
// every visible device (one CudaBackend each), each worker thread switching
// device every round (so a thread's CUDA current device changes between
// requests, and Finish's CPU-oracle path must set it). Good results must be
// the CPU backend's; a bad request gets exactly the CPU's error, writes no
// reply, and leaves every device in service with every block back.
TEST(CudaStagingGpuTest, MixedBadAndGoodRequestsOnEveryDeviceMatchTheCpu) {
  TOKENSEL_REQUIRE_GPU();
  const std::vector<core::DeviceDescription> devices = backends::ListCudaDevices();
  ASSERT_FALSE(devices.empty());
  std::vector<std::unique_ptr<backends::CudaBackend>> cuda;
  for (const core::DeviceDescription& d : devices) {
    absl::StatusOr<std::unique_ptr<backends::CudaBackend>> b =
        backends::CudaBackend::Create(d.uuid);
    ASSERT_OK(b);
    cuda.push_back(*std::move(b));
  }
  backends::CpuBackend cpu(2);
  Node node;
  core::ExecutorLimits limits;
  std::vector<std::unique_ptr<core::Executor>> on_gpu;
  for (auto& b : cuda) {
    on_gpu.push_back(std::make_unique<core::Executor>(b.get(), &node.registry, nullptr, limits));
  }
  core::Executor on_cpu(&cpu, &node.registry, nullptr, limits);

  constexpr int kThreads = 8;
  constexpr int kRounds = 24;
  constexpr int64_t kS = 512;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1234 + t);
      for (int round = 0; round < kRounds; ++round) {
        const size_t device = static_cast<size_t>(t + round) % on_gpu.size();
        GatherCase c = MakeCase(3, kS, 64, 100, 77 + t * 1000 + round);
        // One bad index in every third request: past the end, or negative.
        const bool bad = round % 3 == 1;
        if (bad) {
          c.idx[rng() % c.idx.size()] = round % 2 == 0 ? -1 - static_cast<int32_t>(rng() % 5)
                                                       : static_cast<int32_t>(kS + rng() % 5);
        }
        absl::StatusOr<core::OpResult> want = on_cpu.Run("s", c.req);
        absl::StatusOr<core::OpResult> got = on_gpu[device]->Run("s", c.req);
        if (bad) {
          ASSERT_EQ(want.status().code(), absl::StatusCode::kInvalidArgument) << want.status();
          ASSERT_EQ(got.status().code(), want.status().code())
              << got.status() << " thread " << t << " round " << round << " device " << device;
          EXPECT_EQ(got.status().message(), want.status().message());
          continue;
        }
        ASSERT_OK(want);
        ASSERT_OK(got) << "thread " << t << " round " << round << " device " << device;
        ASSERT_EQ(got->outputs.size(), 1u);
        ASSERT_EQ(got->outputs[0].data, want->outputs[0].data)
            << "thread " << t << " round " << round << " device " << device;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (const auto& b : cuda) {
    EXPECT_TRUE(b->healthy()) << "bad data must not take a device out of service";
    EXPECT_EQ(b->staging_pool().blocks_in_use(), 0u);
    EXPECT_EQ(b->pinned_pool().blocks_in_use(), 0u);
  }
}

TEST(CudaStagingGpuTest, InPlaceInlineIdsComeBackSorted) {
  TOKENSEL_REQUIRE_GPU();
  absl::StatusOr<std::unique_ptr<backends::CudaBackend>> cuda = FirstDevice();
  ASSERT_OK(cuda);
  Node node;
  core::Executor on_gpu(cuda->get(), &node.registry, nullptr, core::ExecutorLimits());
  for (const int64_t R : {1, 7, 4096}) {
    std::vector<int32_t> ids(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) ids[r] = static_cast<int32_t>(2 * (R - 1 - r));
    core::SortTokensRequest req;
    req.ids.source = core::TensorSpec::Source::kInline;
    req.ids.dtype = DType::kInt32;
    req.ids.shape = {1, R};
    req.ids.inline_data =
        absl::string_view(reinterpret_cast<const char*>(ids.data()), ids.size() * 4);
    req.original_tokens = 2 * R;
    absl::StatusOr<core::OpResult> got = on_gpu.Run("s", req);
    ASSERT_OK(got);
    ASSERT_EQ(got->outputs.size(), 1u);
    std::vector<int32_t> out(static_cast<size_t>(R));
    ASSERT_EQ(got->outputs[0].data.size(), out.size() * 4);
    std::memcpy(out.data(), got->outputs[0].data.data(), out.size() * 4);
    for (int64_t r = 0; r < R; ++r) EXPECT_EQ(out[r], 2 * r) << "R " << R;
  }
}

}  // namespace
}  // namespace tokensel::testing
