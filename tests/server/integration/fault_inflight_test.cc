// Faults with requests in flight against a real tokensel-server (issue 7
// item 4; the process-level faults are in fault_test.cc):
//  - unregister while several large ops on the buffer are running: the name
//    goes (and the registered_buffers gauge drops) at once, the mapping stays
//    until the last of them finishes, and every op completes with the
//    oracle's result. Stronger than BadInputTest.UnregisterWhileInUseIsDeferred
//    (one op, in flight by the admission gauge): here every op is seen
//    writing its output before the unregister, and the server's mapping is
//    read from /proc/<pid>/maps while they still run;
//  - SIGTERM with exactly 32 requests in flight (seen on the
//    tokensel_inflight_requests gauge before and after the signal): all 32
//    complete OK with the oracle's result, a request during the drain is
//    refused UNAVAILABLE, and the server exits 0. The precise version of
//    ShutdownTest.SigtermWhileLargeGathersAreInFlight.
#include <atomic>
#include <csignal>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/server/integration/client_util.h"
#include "tests/server/integration/fault_util.h"
#include "tests/testing/server_process.h"
#include "tests/testing/shm_region.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::itest {
namespace {

using Stub = v1::TokenSelect::Stub;
using Code = absl::StatusCode;
using ::tokensel::testing::ServerProcess;
using ::tokensel::testing::StatusIs;
using ::tokensel::testing::TestShm;
namespace health = ::grpc::health::v1;

constexpr absl::Duration kInFlightLiveness = absl::Seconds(60);  // generous bound for "eventually"

class InFlightFaultTest : public FaultServerTest {
 protected:
  bool PollInflight(double want, const std::atomic<int>& done, std::string* page) const {
    return PollMetrics(*server_, kInFlightLiveness, page,
                       [&](absl::string_view p) {
                         return Metric(p, "tokensel_inflight_requests") == want || done.load() > 0;
                       }) &&
           done.load() == 0;
  }
};

TEST_F(InFlightFaultTest, UnregisterDuringManyInFlightOpsIsDeferred) {
  constexpr int kOps = 4;                             // = --threads: every admitted op runs at once
  constexpr int64_t kS = 4096, kC = 2048, kR = 8192;  // 32 MiB in, 64 MiB out per op
  StartServer({"--threads=4", "--max_inflight=64"});
  const uint64_t bytes = GatherCase::RegionBytes(kS, kC, kR, kOps);
  const GatherCase g(bytes, kS, kC, kR, kOps);
  auto big = TestShm::Create(server_->shm_prefix() + "big", bytes);
  ASSERT_OK(big);
  g.Fill(big->data(), rng_);
  const std::vector<uint8_t> expect = g.Expected(big->data());
  ASSERT_EQ(expect.size(), g.outs[0].extent_bytes);
  const uint64_t row_bytes = kC * sizeof(float);
  Client client(server_->UnixChannel());
  client.set_fd_channel(server_->fd_channel_path());
  ASSERT_OK(client.Open());
  // One connection per op, connected up front so that the ops start together.
  std::vector<std::unique_ptr<Client>> op_clients;
  for (int k = 0; k < kOps; ++k) {
    op_clients.push_back(std::make_unique<Client>(server_->UnixChannel(), kInFlightLiveness));
    op_clients.back()->set_session(client.session());
    ASSERT_OK(op_clients.back()->Ping());
  }

  int conclusive = 0;
  for (int attempt = 0; attempt < 5 && conclusive == 0; ++attempt) {
    for (const Placed& out : g.outs) std::memset(big->data() + out.offset, 0, out.extent_bytes);
    ASSERT_OK(client.Register("big", big->name(), 0, big->size()));
    std::vector<absl::Status> status(kOps);
    std::vector<std::thread> ops;
    for (int k = 0; k < kOps; ++k) {
      ops.emplace_back([&, k] {
        v1::OpResponse resp;
        status[k] = op_clients[k]->Call(&Stub::GatherTokens, g.Request("big", k), &resp);
      });
    }
    // Every op has leased the buffer once it writes its first output row.
    const absl::Time deadline = absl::Now() + kInFlightLiveness;
    auto all_writing = [&] {
      for (const Placed& out : g.outs) {
        if (std::memcmp(big->data() + out.offset, expect.data(), row_bytes) != 0) return false;
      }
      return true;
    };
    while (!all_writing() && absl::Now() < deadline) absl::SleepFor(absl::Microseconds(200));
    const bool writing = all_writing();
    const absl::Status unregistered = client.Unregister("big");
    const bool mapped = MapsShm(server_->pid(), big->name());
    // An output whose last row (written last: rows run in order, chunks are
    // claimed in order) is still missing now was being written when the maps
    // were read, after the unregister returned: its op held the mapping.
    int running = 0;
    for (const Placed& out : g.outs) {
      const uint64_t last = out.extent_bytes - row_bytes;
      running += std::memcmp(big->data() + out.offset + last, expect.data() + last, row_bytes) != 0;
    }
    const std::string page = Scrape();
    for (std::thread& t : ops) t.join();
    ASSERT_TRUE(writing) << "the ops never started writing";
    ASSERT_OK(unregistered);
    EXPECT_EQ(Metric(page, "tokensel_registered_buffers"), 0) << Gauges(page);
    for (int k = 0; k < kOps; ++k) {
      ASSERT_OK(status[k]) << "op " << k << " failed after its buffer was unregistered";
      EXPECT_EQ(0, std::memcmp(expect.data(), big->data() + g.outs[k].offset, expect.size()))
          << "op " << k;
    }
    // The last lease is gone, so is the mapping.
    const absl::Time unmap_deadline = absl::Now() + kInFlightLiveness;
    while (MapsShm(server_->pid(), big->name()) && absl::Now() < unmap_deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_FALSE(MapsShm(server_->pid(), big->name())) << "the mapping outlived every op";
    std::fprintf(stderr, "attempt %d: %d of %d ops still writing after unregister; mapped: %d\n",
                 attempt, running, kOps, mapped ? 1 : 0);
    if (running == 0) continue;  // every op finished first: inconclusive
    EXPECT_TRUE(mapped) << "the mapping vanished while ops were writing through it";
    ++conclusive;
    RecordProperty("writing_after_unregister", running);
  }
  EXPECT_EQ(conclusive, 1) << "never unregistered while the ops were running";
  v1::OpResponse resp;
  EXPECT_THAT(client.Call(&Stub::GatherTokens, g.Request("big", 0), &resp),
              StatusIs(Code::kNotFound, "big"));
}

TEST_F(InFlightFaultTest, SigtermWithExactly32RequestsInFlight) {
  constexpr int kRequests = 32;
  // One worker: the requests queue behind request 0, an Execute of
  // kBlockerOps gathers, while the other 31 arrive.
  constexpr int kBlockerOps = 150;
  constexpr int64_t kS = 2048, kC = 1024, kR = 2048;  // 8 MiB in, 8 MiB out per gather
  StartServer({"--threads=1", "--max_inflight=64", "--shutdown_grace=120s"});
  const uint64_t bytes = GatherCase::RegionBytes(kS, kC, kR, kRequests);
  const GatherCase g(bytes, kS, kC, kR, kRequests);
  auto big = TestShm::Create(server_->shm_prefix() + "big", bytes);
  ASSERT_OK(big);
  g.Fill(big->data(), rng_);
  const std::vector<uint8_t> expect = g.Expected(big->data());
  Client owner(server_->UnixChannel(), kInFlightLiveness);
  owner.set_fd_channel(server_->fd_channel_path());
  ASSERT_OK(owner.Open());
  ASSERT_OK(owner.Register("big", big->name(), 0, big->size()));
  // One connection per request, connected before anything starts.
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.push_back(std::make_unique<Client>(server_->UnixChannel(), kInFlightLiveness));
    clients.back()->set_session(owner.session());
    ASSERT_OK(clients.back()->Ping());
  }
  v1::ExecuteRequest blocker;
  for (int j = 0; j < kBlockerOps; ++j) {
    *blocker.add_ops()->mutable_gather_tokens() = g.Request("big", 0);
  }

  bool sigterm_sent = false;
  std::vector<absl::Status> status(kRequests);
  std::atomic<int> done{0};
  for (int attempt = 0; attempt < 3 && !sigterm_sent; ++attempt) {
    for (const Placed& out : g.outs) std::memset(big->data() + out.offset, 0, out.extent_bytes);
    done = 0;
    absl::Notification go;
    std::vector<std::thread> threads;
    for (int i = 0; i < kRequests; ++i) {
      threads.emplace_back([&, i] {
        if (i == 0) {
          v1::ExecuteResponse resp;
          status[i] = clients[i]->Call(&Stub::Execute, blocker, &resp);
        } else {
          go.WaitForNotification();
          v1::OpResponse resp;
          status[i] = clients[i]->Call(&Stub::GatherTokens, g.Request("big", i), &resp);
        }
        done.fetch_add(1);
      });
    }
    std::string page;
    const bool blocker_running = PollInflight(1, done, &page);
    go.Notify();
    const bool all_in = blocker_running && PollInflight(kRequests, done, &page);
    if (all_in) {
      const absl::Status signalled = server_->Signal(SIGTERM);
      EXPECT_OK(signalled);
      sigterm_sent = signalled.ok();
      // The gauge cannot rise during the drain: 32 now means 32 when SIGTERM
      // was sent.
      const std::string after = Scrape();
      EXPECT_EQ(Metric(after, "tokensel_inflight_requests"), kRequests) << Gauges(after);
      // Health turns NOT_SERVING before the drain starts; then a new request
      // is refused.
      auto health_stub = health::Health::NewStub(server_->UnixChannel());
      const absl::Time deadline = absl::Now() + kInFlightLiveness;
      health::HealthCheckResponse hc;
      do {
        grpc::ClientContext ctx;
        ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
        hc.Clear();
        if (!health_stub->Check(&ctx, health::HealthCheckRequest(), &hc).ok()) break;
      } while (hc.status() != health::HealthCheckResponse::NOT_SERVING && absl::Now() < deadline);
      EXPECT_EQ(hc.status(), health::HealthCheckResponse::NOT_SERVING);
      Client probe(server_->UnixChannel());
      probe.set_fd_channel(server_->fd_channel_path());
      probe.set_session(owner.session());
      v1::ListBuffersResponse listed;
      absl::Status refused = absl::OkStatus();
      int admitted_probes = 0;  // sent before the drain began (a window of microseconds)
      while (refused.ok() && admitted_probes < 100) {
        refused = probe.Call(&Stub::ListBuffers, v1::ListBuffersRequest(), &listed);
        if (refused.ok()) ++admitted_probes;
      }
      // Outputs still incomplete now were being written at the refusal.
      int running = 0;
      for (const Placed& out : g.outs) {
        running += std::memcmp(big->data() + out.offset, expect.data(), expect.size()) != 0;
      }
      EXPECT_THAT(refused, StatusIs(Code::kUnavailable));
      RecordProperty("admitted_probes", admitted_probes);
      RecordProperty("writing_at_refusal", running);
      RecordProperty("refusal", std::string(refused.message()));
    }
    for (std::thread& t : threads) t.join();
    std::fprintf(stderr, "attempt %d: blocker seen %d, %d in flight seen %d, SIGTERM %d\n", attempt,
                 blocker_running ? 1 : 0, kRequests, all_in ? 1 : 0, sigterm_sent ? 1 : 0);
    for (int i = 0; i < kRequests; ++i) {
      EXPECT_OK(status[i]) << "request " << i;
      EXPECT_EQ(0, std::memcmp(expect.data(), big->data() + g.outs[i].offset, expect.size()))
          << "request " << i;
    }
  }
  ASSERT_TRUE(sigterm_sent) << "32 requests were never seen in flight at once";
  auto code = server_->WaitForExit(kInFlightLiveness);
  ASSERT_OK(code);
  EXPECT_EQ(*code, 0);
  v1::ListBuffersResponse listed;
  EXPECT_THAT(owner.Call(&Stub::ListBuffers, v1::ListBuffersRequest(), &listed),
              StatusIs(Code::kUnavailable));
}

}  // namespace
}  // namespace tokensel::itest
