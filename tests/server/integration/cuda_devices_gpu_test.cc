// A real tokensel-server on two devices numbered differently from the
// client (label `gpu`; skips without a GPU and with fewer than two). The
// server runs with CUDA_VISIBLE_DEVICES listing the client's device 1
// first (by UUID, so it holds whatever the test's own environment makes
// visible): the server's ordinal 0 is then the client's ordinal 1. The
// test (the client) allocates every tensor on its device 1, registers them
// by CUDA IPC naming that device's UUID, and runs GatherTokens:
//  - the server's GetServerInfo lists the devices in its own numbering,
//    and their UUIDs are the client's (UUIDs, not ordinals, are what
//    client and server agree on);
//  - the output equals the CPU formula out[b,r,:] = acts[b, idx[b,r], :]
//    on random inputs of odd sizes;
//  - the op metric counts the GatherTokens on the server's device of that
//    UUID (cuda:0), none on the other: it ran on the buffers' device. An op
//    run on the other device would fault on memory it cannot reach (no
//    peer access) or show there.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "server/backends/cuda_devices.h"
#include "tests/server/integration/client_util.h"
#include "tests/testing/gpu_device.h"
#include "tests/testing/http_get.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::itest {
namespace {

using ::tokensel::testing::ServerOptions;
using ::tokensel::testing::ServerProcess;

// cudaMalloc'd bytes on the client's device `ordinal`, exported by IPC.
class DeviceBuffer {
 public:
  DeviceBuffer(int ordinal, const void* host, size_t bytes) : ordinal_(ordinal), bytes_(bytes) {
    EXPECT_EQ(cudaSetDevice(ordinal), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&data_, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaIpcMemHandle_t h;
    EXPECT_EQ(cudaIpcGetMemHandle(&h, data_), cudaSuccess);
    handle_.assign(reinterpret_cast<const char*>(&h), sizeof(h));
  }
  ~DeviceBuffer() {
    cudaSetDevice(ordinal_);
    cudaFree(data_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  std::vector<T> Read() const {
    std::vector<T> host(bytes_ / sizeof(T));
    EXPECT_EQ(cudaSetDevice(ordinal_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  const std::string& handle() const { return handle_; }
  size_t bytes() const { return bytes_; }

 private:
  int ordinal_;
  size_t bytes_;
  void* data_ = nullptr;
  std::string handle_;
};

v1::Tensor Ref(const std::string& buffer, v1::DType dtype, std::vector<int64_t> shape) {
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  t.mutable_buffer()->set_buffer(buffer);
  return t;
}

// The value of the sample of `metric` whose labels contain all of `labels`
// in the Prometheus text `page`; -1 if there is none.
double Sample(const std::string& page, const std::string& metric,
              const std::vector<std::string>& labels) {
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (!absl::StartsWith(line, metric + "{")) continue;
    bool all = true;
    for (const std::string& l : labels) all = all && absl::StrContains(line, l);
    double v = -1;
    if (all && absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) return v;
  }
  return -1;
}

TEST(CudaDevicesGpuTest, AnOpOnDevice1RunsThereWhateverTheServersNumbering) {
  TOKENSEL_REQUIRE_GPU();
  const std::vector<core::DeviceDescription> devices = backends::ListCudaDevices();
  if (devices.size() < 2) GTEST_SKIP() << "needs two CUDA devices, found " << devices.size();
  const core::DeviceDescription& mine = devices[1];  // the client's device 1
  const core::DeviceDescription& other = devices[0];

  // Random inputs of odd sizes, on the client's device 1.
  constexpr int64_t kB = 3, kS = 7, kC = 5, kR = 3;
  std::mt19937 rng(20261127);
  std::vector<float> acts(kB * kS * kC);
  std::uniform_real_distribution<float> value(-8.f, 8.f);
  for (float& a : acts) a = value(rng);
  std::vector<int32_t> idx(kB * kR);
  std::uniform_int_distribution<int32_t> row(0, kS - 1);
  for (int32_t& i : idx) i = row(rng);
  const std::vector<float> zeros(kB * kR * kC, 0.f);
  DeviceBuffer acts_buf(mine.ordinal, acts.data(), acts.size() * 4);
  DeviceBuffer idx_buf(mine.ordinal, idx.data(), idx.size() * 4);
  DeviceBuffer out_buf(mine.ordinal, zeros.data(), zeros.size() * 4);

  ServerOptions options;
  options.extra_args = {"--backend=cuda"};
  options.env = {absl::StrCat("CUDA_VISIBLE_DEVICES=", mine.uuid, ",", other.uuid)};
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(options);
  ASSERT_OK(server);
  Client client((*server)->UnixChannel());
  ASSERT_OK(client.Open());

  v1::ServerInfo info;
  ASSERT_OK(client.Call(&v1::TokenSelect::Stub::GetServerInfo, v1::GetServerInfoRequest(), &info));
  ASSERT_EQ(info.devices_size(), 2) << info.DebugString();
  EXPECT_EQ(info.devices(0).ordinal(), 0);
  EXPECT_EQ(info.devices(0).uuid(), mine.uuid) << "the server's 0 is the client's 1";
  EXPECT_EQ(info.devices(1).uuid(), other.uuid);

  for (const auto& [name, buf] : {std::pair<const char*, const DeviceBuffer*>{"acts", &acts_buf},
                                  {"idx", &idx_buf},
                                  {"out", &out_buf}}) {
    v1::RegisterBufferRequest reg;
    reg.set_name(name);
    reg.mutable_cuda_ipc()->set_handle(buf->handle());
    reg.mutable_cuda_ipc()->set_device_uuid(mine.uuid);
    reg.mutable_cuda_ipc()->set_size(buf->bytes());
    v1::RegisterBufferResponse registered;
    ASSERT_OK(client.Call(&v1::TokenSelect::Stub::RegisterBuffer, reg, &registered)) << name;
  }
  v1::GatherTokensRequest req;
  *req.mutable_activations() = Ref("acts", v1::DTYPE_FLOAT32, {kB, kS, kC});
  *req.mutable_indices() = Ref("idx", v1::DTYPE_INT32, {kB, kR});
  *req.mutable_out() = Ref("out", v1::DTYPE_FLOAT32, {kB, kR, kC});
  v1::OpResponse resp;
  ASSERT_OK(client.Call(&v1::TokenSelect::Stub::GatherTokens, req, &resp));

  const std::vector<float> out = out_buf.Read<float>();
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t r = 0; r < kR; ++r) {
      for (int64_t c = 0; c < kC; ++c) {
        ASSERT_EQ(out[(b * kR + r) * kC + c], acts[(b * kS + idx[b * kR + r]) * kC + c])
            << "b=" << b << " r=" << r << " c=" << c;
      }
    }
  }
  absl::StatusOr<::tokensel::testing::HttpResponse> scraped =
      ::tokensel::testing::HttpGet((*server)->metrics_port(), "/metrics");
  ASSERT_OK(scraped);
  const std::string* page = &scraped->body;
  EXPECT_EQ(Sample(*page, "tokensel_op_duration_seconds_count",
                   {"op=\"GatherTokens\"", "device=\"cuda:0\""}),
            1)
      << "the op did not run on the server's cuda:0 (" << mine.uuid << ")\n"
      << *page;
  EXPECT_LE(Sample(*page, "tokensel_op_duration_seconds_count",
                   {"op=\"GatherTokens\"", "device=\"cuda:1\""}),
            0);
  server->reset();  // unmaps before the buffers are freed
}

}  // namespace
}  // namespace tokensel::itest
