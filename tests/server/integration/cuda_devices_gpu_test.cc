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
// And an Execute with CUDA IPC events created on the client's device 1 (the
// buffers' device): the server's stream waits on wait_event, which the
// client records after zeroing the output late on its own stream, runs the
// GatherTokens, and records record_event; the client's stream waits on
// record_event and reads the output, which must equal the CPU formula. The
// server cannot check an event's device (docs/gpu.md, "Fourth review"):
// this is the case the contract says must work, on the non-zero device.
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
  void* data() const { return data_; }
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

constexpr int64_t kB = 3, kS = 7, kC = 5, kR = 3;

// Random inputs of odd sizes on the client's device 1, a server that sees
// that device first, a session with the three buffers registered.
struct TwoDeviceSetup {
  core::DeviceDescription mine;   // the client's device 1
  core::DeviceDescription other;  // its device 0
  std::vector<float> acts;
  std::vector<int32_t> idx;
  std::unique_ptr<DeviceBuffer> acts_buf, idx_buf, out_buf;
  std::unique_ptr<ServerProcess> server;
  std::unique_ptr<Client> client;

  // False (and a skip or a failure recorded) when it cannot run.
  bool Start() {
    const std::vector<core::DeviceDescription> devices = backends::ListCudaDevices();
    if (devices.size() < 2) return false;
    mine = devices[1];
    other = devices[0];
    std::mt19937 rng(20261127);
    acts.resize(kB * kS * kC);
    std::uniform_real_distribution<float> value(-8.f, 8.f);
    for (float& a : acts) a = value(rng);
    idx.resize(kB * kR);
    std::uniform_int_distribution<int32_t> row(0, kS - 1);
    for (int32_t& i : idx) i = row(rng);
    const std::vector<float> zeros(kB * kR * kC, 0.f);
    acts_buf = std::make_unique<DeviceBuffer>(mine.ordinal, acts.data(), acts.size() * 4);
    idx_buf = std::make_unique<DeviceBuffer>(mine.ordinal, idx.data(), idx.size() * 4);
    out_buf = std::make_unique<DeviceBuffer>(mine.ordinal, zeros.data(), zeros.size() * 4);
    ServerOptions options;
    options.extra_args = {"--backend=cuda"};
    options.env = {absl::StrCat("CUDA_VISIBLE_DEVICES=", mine.uuid, ",", other.uuid)};
    absl::StatusOr<std::unique_ptr<ServerProcess>> started = ServerProcess::Start(options);
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return false;
    server = *std::move(started);
    client = std::make_unique<Client>(server->UnixChannel());
    const absl::Status opened = client->Open();
    EXPECT_TRUE(opened.ok()) << opened;
    if (!opened.ok()) return false;
    for (const auto& [name, buf] :
         {std::pair<const char*, const DeviceBuffer*>{"acts", acts_buf.get()},
          {"idx", idx_buf.get()},
          {"out", out_buf.get()}}) {
      v1::RegisterBufferRequest reg;
      reg.set_name(name);
      reg.mutable_cuda_ipc()->set_handle(buf->handle());
      reg.mutable_cuda_ipc()->set_device_uuid(mine.uuid);
      reg.mutable_cuda_ipc()->set_size(buf->bytes());
      v1::RegisterBufferResponse registered;
      const absl::Status st =
          client->Call(&v1::TokenSelect::Stub::RegisterBuffer, reg, &registered);
      EXPECT_TRUE(st.ok()) << name << ": " << st;
      if (!st.ok()) return false;
    }
    return true;
  }
  v1::GatherTokensRequest Gather() const {
    v1::GatherTokensRequest req;
    *req.mutable_activations() = Ref("acts", v1::DTYPE_FLOAT32, {kB, kS, kC});
    *req.mutable_indices() = Ref("idx", v1::DTYPE_INT32, {kB, kR});
    *req.mutable_out() = Ref("out", v1::DTYPE_FLOAT32, {kB, kR, kC});
    return req;
  }
  // `out` against the CPU formula out[b,r,:] = acts[b, idx[b,r], :].
  void ExpectGathered(const std::vector<float>& out) const {
    ASSERT_EQ(out.size(), static_cast<size_t>(kB * kR * kC));
    for (int64_t b = 0; b < kB; ++b) {
      for (int64_t r = 0; r < kR; ++r) {
        for (int64_t c = 0; c < kC; ++c) {
          ASSERT_EQ(out[(b * kR + r) * kC + c], acts[(b * kS + idx[b * kR + r]) * kC + c])
              << "b=" << b << " r=" << r << " c=" << c;
        }
      }
    }
  }
  ~TwoDeviceSetup() { server.reset(); }  // unmaps before the buffers are freed
};

TEST(CudaDevicesGpuTest, AnOpOnDevice1RunsThereWhateverTheServersNumbering) {
  TOKENSEL_REQUIRE_GPU();
  TwoDeviceSetup t;
  if (backends::ListCudaDevices().size() < 2) GTEST_SKIP() << "needs two CUDA devices";
  ASSERT_TRUE(t.Start());
  Client& client = *t.client;

  v1::ServerInfo info;
  ASSERT_OK(client.Call(&v1::TokenSelect::Stub::GetServerInfo, v1::GetServerInfoRequest(), &info));
  ASSERT_EQ(info.devices_size(), 2) << info.DebugString();
  EXPECT_EQ(info.devices(0).ordinal(), 0);
  EXPECT_EQ(info.devices(0).uuid(), t.mine.uuid) << "the server's 0 is the client's 1";
  EXPECT_EQ(info.devices(1).uuid(), t.other.uuid);

  v1::OpResponse resp;
  ASSERT_OK(client.Call(&v1::TokenSelect::Stub::GatherTokens, t.Gather(), &resp));
  t.ExpectGathered(t.out_buf->Read<float>());
  absl::StatusOr<::tokensel::testing::HttpResponse> scraped =
      ::tokensel::testing::HttpGet(t.server->metrics_port(), "/metrics");
  ASSERT_OK(scraped);
  const std::string* page = &scraped->body;
  EXPECT_EQ(Sample(*page, "tokensel_op_duration_seconds_count",
                   {"op=\"GatherTokens\"", "device=\"cuda:0\""}),
            1)
      << "the op did not run on the server's cuda:0 (" << t.mine.uuid << ")\n"
      << *page;
  EXPECT_LE(Sample(*page, "tokensel_op_duration_seconds_count",
                   {"op=\"GatherTokens\"", "device=\"cuda:1\""}),
            0);
}

TEST(CudaDevicesGpuTest, AnEventedExecuteOnDevice1WaitsAndRecordsTheClientsEvents) {
  TOKENSEL_REQUIRE_GPU();
  TwoDeviceSetup t;
  if (backends::ListCudaDevices().size() < 2) GTEST_SKIP() << "needs two CUDA devices";
  ASSERT_TRUE(t.Start());
  // The client's events and stream, on its device 1 (the buffers').
  ASSERT_EQ(cudaSetDevice(t.mine.ordinal), cudaSuccess);
  cudaEvent_t wait_event = nullptr;
  cudaEvent_t record_event = nullptr;
  cudaStream_t stream = nullptr;
  const unsigned flags = cudaEventInterprocess | cudaEventDisableTiming;
  ASSERT_EQ(cudaEventCreateWithFlags(&wait_event, flags), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&record_event, flags), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  // The client's last write before the request, then wait_event after it.
  std::vector<float> garbage(kB * kR * kC, -1.f);
  ASSERT_EQ(cudaMemcpyAsync(t.out_buf->data(), garbage.data(), garbage.size() * 4,
                            cudaMemcpyHostToDevice, stream),
            cudaSuccess);
  ASSERT_EQ(cudaEventRecord(wait_event, stream), cudaSuccess);
  cudaIpcEventHandle_t handles[2];
  ASSERT_EQ(cudaIpcGetEventHandle(&handles[0], wait_event), cudaSuccess);
  ASSERT_EQ(cudaIpcGetEventHandle(&handles[1], record_event), cudaSuccess);

  v1::ExecuteRequest req;
  *req.add_ops()->mutable_gather_tokens() = t.Gather();
  req.set_wait_event(std::string(reinterpret_cast<const char*>(handles[0].reserved), 64));
  req.set_record_event(std::string(reinterpret_cast<const char*>(handles[1].reserved), 64));
  v1::ExecuteResponse resp;
  ASSERT_OK(t.client->Call(&v1::TokenSelect::Stub::Execute, req, &resp));
  // After the reply: the client's reads wait on record_event.
  std::vector<float> out(kB * kR * kC);
  ASSERT_EQ(cudaSetDevice(t.mine.ordinal), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(stream, record_event, 0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(out.data(), t.out_buf->data(), out.size() * 4, cudaMemcpyDeviceToHost,
                            stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  t.ExpectGathered(out);
  // The device stays healthy; the next barrier reports no deferred error.
  v1::ExecuteResponse barrier;
  EXPECT_OK(t.client->Call(&v1::TokenSelect::Stub::Execute, v1::ExecuteRequest(), &barrier));
  t.server.reset();  // its streams and opened events go before ours
  cudaStreamDestroy(stream);
  cudaEventDestroy(wait_event);
  cudaEventDestroy(record_event);
}

}  // namespace
}  // namespace tokensel::itest
