// Execute's CUDA IPC events on a real device (issue 12 item 8; label `gpu`,
// skips without a GPU, built only when this build has CUDA). A client
// process (tokensel_cuda_event_client, cuda_event_client.cc) produces its
// inputs late on its own stream and records wait_event after them; the
// server side (the executor over a CudaBackend and the cuda_ipc mapper)
// runs GatherTokens asynchronously between wait_event and record_event;
// the client then waits on record_event and reads the output, which must
// equal the CPU's answer. A server that did not wait would read the
// client's garbage; one that recorded too early would let the client read
// zeros. No host in either process synchronizes with the other.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "server/backends/cuda_backend.h"
#include "server/core/async_requests.h"
#include "server/core/buffer_registry.h"
#include "server/core/executor.h"
#include "server/memory/cuda_ipc_mapper.h"
#include "tests/server/backends/stream_chain_test.h"
#include "tests/server/core/fake_region_mapper.h"
#include "tests/testing/gpu_device.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {
namespace {

constexpr int kReplyFd = 3;
constexpr int kGoFd = 4;
constexpr int64_t kB = 4, kS = 1024, kC = 256, kR = 512;  // as cuda_event_client.cc

// Starts the client and reads its handles; Go() lets it read the output.
class EventClient {
 public:
  bool Start() {
    int reply[2], go[2];
    if (pipe2(reply, O_CLOEXEC) != 0 || pipe2(go, O_CLOEXEC) != 0) return false;
    pid_ = fork();
    if (pid_ == 0) {
      const int reply_w = fcntl(reply[1], F_DUPFD_CLOEXEC, 10);
      const int go_r = fcntl(go[0], F_DUPFD_CLOEXEC, 10);
      dup2(reply_w, kReplyFd);
      dup2(go_r, kGoFd);
      char client[] = TOKENSEL_CUDA_EVENT_CLIENT_BINARY;
      char* argv[] = {client, nullptr};
      execv(client, argv);
      _exit(127);
    }
    close(reply[1]);
    close(go[0]);
    reply_ = reply[0];
    go_ = go[1];
    std::vector<std::string> parts =
        absl::StrSplit(ReadUntilNewline(), ' ', absl::SkipWhitespace());
    if (parts.size() != 6) return false;
    for (int i = 0; i < 5; ++i) handles_.push_back(absl::HexStringToBytes(parts[i]));
    uuid_ = parts[5];
    return true;
  }
  // The output bytes, read by the client after waiting on record_event.
  std::string Go() {
    const char c = 'g';
    if (write(go_, &c, 1) != 1) return "";
    return absl::HexStringToBytes(ReadUntilNewline());
  }
  int Stop() {
    if (go_ >= 0) close(go_);
    if (reply_ >= 0) close(reply_);
    go_ = reply_ = -1;
    int status = 0;
    if (pid_ > 0) waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ~EventClient() { Stop(); }
  const std::string& handle(int i) const { return handles_[i]; }  // acts idx out wait record
  const std::string& uuid() const { return uuid_; }

 private:
  std::string ReadUntilNewline() {
    std::string text;
    char c;
    while (read(reply_, &c, 1) == 1 && c != '\n') text.push_back(c);
    return text;
  }
  pid_t pid_ = -1;
  int reply_ = -1;
  int go_ = -1;
  std::vector<std::string> handles_;
  std::string uuid_;
};

TEST(CudaEventsGpuTest, OutputsAfterRecordEventMatchTheCpu) {
  TOKENSEL_REQUIRE_GPU();
  EventClient client;
  ASSERT_TRUE(client.Start()) << "the client process failed (see its stderr)";
  absl::StatusOr<std::unique_ptr<backends::CudaBackend>> cuda =
      backends::CudaBackend::Create(client.uuid());
  ASSERT_OK(cuda);
  (*cuda)->BeginSession("s");  // as the server's SessionManager: its events are cached
  core::AsyncRequests async(core::AsyncLimits{});
  FakeRegionMapper host;
  memory::CudaIpcMapperOptions ipc_options;
  for (const core::DeviceDescription& d : (*cuda)->devices()) {
    ipc_options.devices.push_back({d.ordinal, d.uuid});
  }
  memory::CudaIpcMapper ipc(std::move(ipc_options));
  {
    core::BufferRegistry registry(&host, &ipc, core::RegistryLimits(), nullptr);
    const uint64_t acts_bytes = kB * kS * kC * 4, idx_bytes = kB * kR * 4,
                   out_bytes = kB * kR * kC * 4;
    ASSERT_OK(registry.Register("s", "acts",
                                core::CudaIpcSpec{client.handle(0), client.uuid(), 0, acts_bytes}));
    ASSERT_OK(registry.Register("s", "idx",
                                core::CudaIpcSpec{client.handle(1), client.uuid(), 0, idx_bytes}));
    ASSERT_OK(registry.Register("s", "out",
                                core::CudaIpcSpec{client.handle(2), client.uuid(), 0, out_bytes}));
    core::Executor executor(cuda->get(), &registry, nullptr, core::ExecutorLimits(), nullptr);
    core::GatherTokensRequest req;
    req.activations = DeviceBuf("acts", kernels::DType::kFloat32, {kB, kS, kC});
    req.indices = DeviceBuf("idx", kernels::DType::kInt32, {kB, kR});
    req.out = DeviceBuf("out", kernels::DType::kFloat32, {kB, kR, kC});
    const core::IpcEvents events{client.handle(3), client.handle(4)};
    core::RunOptions options;
    options.events = &events;
    options.async = &async;
    const std::vector<core::OpRequest> ops = {req};
    ASSERT_OK(executor.RunAll("s", ops, options));

    const std::string out = client.Go();
    ASSERT_EQ(out.size(), out_bytes);
    std::vector<float> got(kB * kR * kC);
    std::memcpy(got.data(), out.data(), out.size());
    for (int64_t b = 0; b < kB; ++b) {
      for (int64_t r = 0; r < kR; ++r) {
        const int64_t s = (37 * r + b) % kS;
        for (int64_t c = 0; c < kC; ++c) {
          const float want = static_cast<float>(((b * kS + s) * kC + c) % 9973);
          ASSERT_EQ(got[(b * kR + r) * kC + c], want) << "b " << b << " r " << r << " c " << c;
        }
      }
    }
    EXPECT_TRUE(async.WaitAll(absl::Seconds(60)));
    EXPECT_OK(async.TakeDeferred("s"));
    registry.UnregisterAll("s");
  }
  (*cuda)->EndSession("s");
  EXPECT_TRUE((*cuda)->healthy());
  EXPECT_EQ(client.Stop(), 0);
}

TEST(CudaEventsGpuTest, AGarbageEventHandleIsInvalidArgumentAndTheDeviceServesOn) {
  TOKENSEL_REQUIRE_GPU();
  absl::StatusOr<std::unique_ptr<backends::CudaBackend>> cuda = backends::CudaBackend::Create("");
  ASSERT_OK(cuda);
  FakeRegionMapper host;
  FakeRegionMapper device(core::MemoryKind::kCudaDevice);
  core::BufferRegistry registry(&host, &device, core::RegistryLimits(), nullptr);
  core::Executor executor(cuda->get(), &registry, nullptr, core::ExecutorLimits(), nullptr);
  core::AsyncRequests async(core::AsyncLimits{});
  std::mt19937 rng(7);
  std::string garbage(64, '\0');
  for (char& c : garbage) c = static_cast<char>(rng());
  for (const bool wait : {true, false}) {
    const core::IpcEvents events{wait ? garbage : "", wait ? "" : garbage};
    core::RunOptions options;
    options.events = &events;
    options.async = &async;
    absl::StatusOr<std::vector<core::OpResult>> r = executor.RunAll("s", {}, options);
    EXPECT_THAT(r.status(),
                StatusIs(absl::StatusCode::kInvalidArgument, wait ? "wait_event" : "record_event"));
  }
  EXPECT_TRUE((*cuda)->healthy());
  EXPECT_EQ(async.inflight(), 0u);
  // The device still serves an evented request without events to open.
  const core::IpcEvents none;
  core::RunOptions options;
  options.events = &none;
  EXPECT_OK(executor.RunAll("s", {}, options));
}

}  // namespace
}  // namespace tokensel::testing
