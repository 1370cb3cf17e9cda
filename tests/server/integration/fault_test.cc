// Faults against a real tokensel-server (issue 7 item 4), one test each:
//  - a client process SIGKILLed mid-stream: its session and buffers are
//    released, by the stream's end (stream-scoped session) or by lease
//    expiry (leased session), and the gauges drop to 0;
//  - the server SIGKILLed under load: clients get UNAVAILABLE, and their
//    tokensel::client Sessions re-open and re-register by themselves once a
//    new server listens on the same socket;
//  - the owner unlinks a registered shm object: the server's mapping stays
//    valid (reads and writes, checked through the owner's own mapping) until
//    unregister; the name then no longer registers (NOT_FOUND).
// Unregister during in-flight ops and SIGTERM with 32 requests in flight are
// in fault_inflight_test.cc. Every op result is checked against the CPU
// oracle (kernels/cpu).
#include <sys/mman.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/integration/client_util.h"
#include "tests/server/integration/fault_util.h"
#include "tests/testing/child_process.h"
#include "tests/testing/server_process.h"
#include "tests/testing/shm_region.h"
#include "tests/testing/status_matchers.h"
#include "tokensel/client/client.h"
#include "tokensel/client/session.h"

#ifndef TOKENSEL_FAULT_CLIENT_BINARY
#error "TOKENSEL_FAULT_CLIENT_BINARY must be set by CMake"
#endif

namespace tokensel::itest {
namespace {

namespace tc = ::tokensel::client;
using Stub = v1::TokenSelect::Stub;
using Code = absl::StatusCode;
using ::tokensel::testing::MetricSum;
using ::tokensel::testing::ServerProcess;
using ::tokensel::testing::StatusIs;
using ::tokensel::testing::TestShm;

constexpr absl::Duration kLiveness = absl::Seconds(30);  // generous bound for "eventually"

class FaultTest : public FaultServerTest {
 protected:
  // A fresh session registers its own shm object and runs a gather checked
  // against the oracle, then closes: the server still serves correctly.
  void ExpectServes(const std::string& tag) {
    Client client(server_->UnixChannel());
    client.set_fd_channel(server_->fd_channel_path());
    ASSERT_OK(client.Open());
    const uint64_t bytes = GatherCase::RegionBytes(64, 32, 40, 1);
    const GatherCase g(bytes, 64, 32, 40, 1);
    auto shm = TestShm::Create(server_->shm_prefix() + tag, bytes);
    ASSERT_OK(shm);
    g.Fill(shm->data(), rng_);
    const std::vector<uint8_t> expect = g.Expected(shm->data());
    ASSERT_OK(client.Register("check", shm->name(), 0, shm->size()));
    v1::OpResponse resp;
    ASSERT_OK(client.Call(&Stub::GatherTokens, g.Request("check", 0), &resp));
    EXPECT_EQ(0, std::memcmp(expect.data(), shm->data() + g.outs[0].offset, expect.size()));
    v1::CloseSessionResponse closed;
    EXPECT_OK(client.Call(&Stub::CloseSession, v1::CloseSessionRequest(), &closed));
  }

  // Runs tokensel_fault_client in `mode` (see fault_client.cc), SIGKILLs it
  // mid-stream and waits for the server to release its session and buffers.
  void KillClientMidStream(const std::string& mode, bool released_by_lease) {
    auto shm = TestShm::Create(server_->shm_prefix() + "victim-" + mode, 1 << 20);
    ASSERT_OK(shm);
    auto child = ::tokensel::testing::ChildProcess::Start(
        {TOKENSEL_FAULT_CLIENT_BINARY, server_->unix_target(), mode, shm->name()});
    ASSERT_OK(child);
    ASSERT_OK((*child)->WaitForLine("READY", absl::Now() + kLiveness));
    std::string page = Scrape();
    EXPECT_EQ(Metric(page, "tokensel_sessions"), 1) << Gauges(page);
    EXPECT_EQ(Metric(page, "tokensel_registered_buffers"), 2) << Gauges(page);
    EXPECT_EQ(Metric(page, "tokensel_registered_bytes"), static_cast<double>(shm->size()));
    // Mid-stream: a Stream's series appears only once the stream finishes.
    EXPECT_EQ(MetricSum(page, "tokensel_requests_total", {"method=\"Stream\""}), 0);

    const absl::Time killed = absl::Now();
    ASSERT_OK((*child)->Signal(SIGKILL));
    EXPECT_THAT((*child)->WaitForExit(absl::Now() + kLiveness),
                StatusIs(absl::StatusCode::kInternal, absl::StrCat("killed by signal ", SIGKILL)));
    ASSERT_TRUE(PollMetrics(*server_, kLiveness, &page, [](absl::string_view p) {
      return MetricSum(p, "tokensel_requests_total", {"method=\"Stream\""}) == 1;
    })) << "the server never saw the stream end";
    if (released_by_lease && absl::Now() - killed < absl::Seconds(1)) {
      // The last renewal was at most one keep-alive interval (2 s / 3)
      // before the kill, so the 2 s lease cannot have run out yet: the
      // stream's end alone did not end the session.
      EXPECT_EQ(Metric(page, "tokensel_sessions"), 1) << Gauges(page);
      EXPECT_EQ(Metric(page, "tokensel_registered_buffers"), 2) << Gauges(page);
    }
    ASSERT_TRUE(PollMetrics(*server_, kLiveness, &page,
                            [](absl::string_view p) {
                              return Metric(p, "tokensel_sessions") == 0 &&
                                     Metric(p, "tokensel_registered_buffers") == 0 &&
                                     Metric(p, "tokensel_registered_bytes") == 0;
                            }))
        << "not released: " << Gauges(page);
    RecordProperty("release_ms", static_cast<int>(absl::ToInt64Milliseconds(absl::Now() - killed)));
    EXPECT_EQ(Metric(page, "tokensel_inflight_requests"), 0);
    if (released_by_lease) {
      EXPECT_TRUE(server_->WaitForOutput("expired 1 idle session", kLiveness));
    } else {
      EXPECT_EQ(server_->Output().find("idle session"), std::string::npos)
          << "a stream-scoped session must end with its stream, not by lease";
    }
    ExpectServes("after-" + mode);
  }
};

TEST_F(FaultTest, KilledStreamClientReleasesItsSessionAndBuffers) {
  StartServer({});  // --session_ttl 60 s: only the stream's end can release in time
  KillClientMidStream("stream", /*released_by_lease=*/false);
}

TEST_F(FaultTest, KilledLeasedClientIsReleasedByLeaseExpiry) {
  StartServer({"--session_ttl=2s"});
  KillClientMidStream("leased", /*released_by_lease=*/true);
}

// A unix socket path that outlives one server process.
class StableSocket {
 public:
  StableSocket() {
    char dir_template[] = "/tmp/tokensel-ft-XXXXXX";
    if (mkdtemp(dir_template) == nullptr) {
      ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
      return;
    }
    dir_ = dir_template;
  }
  ~StableSocket() {  // a SIGKILLed server leaves its socket file behind
    unlink((dir_ + "/stable.sock").c_str());
    rmdir(dir_.c_str());
  }
  std::string target() const { return "unix://" + dir_ + "/stable.sock"; }

 private:
  std::string dir_;
};

TEST_F(FaultTest, ServerKilledClientsGetUnavailableThenReopenByThemselves) {
  constexpr int kClients = 4;
  const StableSocket socket;
  const std::vector<std::string> args = {"--listen=" + socket.target()};
  StartServer(args);
  const uint64_t bytes = GatherCase::RegionBytes(128, 32, 64, 1);
  const GatherCase g(bytes, 128, 32, 64, 1);
  const Placed& out = g.outs[0];
  struct Worker {
    TestShm shm;
    std::vector<uint8_t> expect;
    std::unique_ptr<tc::Session> session;
    std::atomic<int> ok_before{0};
    absl::Status failure;
    absl::Status reopened = absl::UnknownError("not reached");
    int ok_after = 0;
    absl::Status after;
  };
  std::vector<Worker> workers(kClients);
  for (int i = 0; i < kClients; ++i) {
    Worker& w = workers[i];
    auto shm = TestShm::Create(server_->shm_prefix() + "w" + std::to_string(i), bytes);
    ASSERT_OK(shm);
    w.shm = std::move(shm).value();
    g.Fill(w.shm.data(), rng_);
    w.expect = g.Expected(w.shm.data());
    absl::StatusOr<tc::Client> client =
        tc::Client::Connect(socket.target(), {.deadline = absl::Seconds(20)});
    ASSERT_OK(client.status());
    auto session = tc::Session::Open(*client, {.client_name = "fault-" + std::to_string(i),
                                               .keep_alive_interval = absl::Milliseconds(100)});
    ASSERT_OK(session.status());
    w.session = std::move(session).value();
    v1::RegisterBufferRequest reg;
    reg.set_name("buf");
    reg.mutable_host_shm()->set_shm_name(w.shm.name());
    reg.mutable_host_shm()->set_size(bytes);
    ASSERT_OK(w.session->RegisterBuffer(reg).status());
  }

  std::atomic<bool> stop{false};
  std::atomic<int> failed{0};
  absl::Notification restarted;
  std::vector<std::thread> threads;
  struct JoinAll {  // also on an early ASSERT return
    ~JoinAll() {
      stop->store(true);
      if (!restarted->HasBeenNotified()) restarted->Notify();
      for (std::thread& t : *threads) t.join();
    }
    std::atomic<bool>* stop;
    absl::Notification* restarted;
    std::vector<std::thread>* threads;
  } join_all{&stop, &restarted, &threads};
  const v1::GatherTokensRequest req = g.Request("buf", 0);
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      Worker& w = workers[i];
      auto run = [&]() -> absl::Status {
        std::memset(w.shm.data() + out.offset, 0, out.extent_bytes);
        // wait_for_ready off: an unreachable server fails fast.
        absl::Status s = w.session->client().WithWaitForReady(false).GatherTokens(req).status();
        if (s.ok() && std::memcmp(w.shm.data() + out.offset, w.expect.data(), w.expect.size())) {
          s = absl::DataLossError("the output differs from the oracle");
        }
        return s;
      };
      while (!stop.load()) {
        absl::Status s = run();
        if (!s.ok()) {
          w.failure = s;
          break;
        }
        w.ok_before.fetch_add(1);
      }
      failed.fetch_add(1);
      restarted.WaitForNotification();
      if (stop.load()) return;
      w.reopened = w.session->WaitUntilOpen(kLiveness);  // no Reopen() call
      for (int k = 0; k < 5 && w.after.ok(); ++k) {
        w.after = run();
        if (w.after.ok()) ++w.ok_after;
      }
    });
  }
  // Traffic flows on every client, then the server dies without cleanup.
  const absl::Time deadline = absl::Now() + kLiveness;
  for (Worker& w : workers) {
    while (w.ok_before.load() < 3 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    ASSERT_GE(w.ok_before.load(), 3) << "no traffic before the kill";
  }
  ASSERT_OK(server_->Signal(SIGKILL));
  EXPECT_THAT(server_->WaitForExit(absl::Seconds(10)).status(),
              StatusIs(Code::kInternal, "signal 9"));
  // Every client's call fails (no hang) before a new server exists.
  while (failed.load() < kClients && absl::Now() < deadline + kLiveness) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(failed.load(), kClients) << "a client hung on the dead server";

  StartServer(args);
  restarted.Notify();
  for (std::thread& t : threads) t.join();
  threads.clear();
  for (int i = 0; i < kClients; ++i) {
    Worker& w = workers[i];
    EXPECT_THAT(w.failure, StatusIs(Code::kUnavailable)) << "client " << i;
    EXPECT_OK(w.reopened) << "client " << i;
    EXPECT_EQ(w.session->reopen_count(), 1) << "client " << i;
    EXPECT_OK(w.after) << "client " << i;
    EXPECT_EQ(w.ok_after, 5) << "client " << i;
  }
  const std::string page = Scrape();
  EXPECT_EQ(Metric(page, "tokensel_sessions"), kClients) << Gauges(page);
  EXPECT_EQ(Metric(page, "tokensel_registered_buffers"), kClients) << Gauges(page);
  EXPECT_EQ(Metric(page, "tokensel_registered_bytes"), static_cast<double>(kClients * bytes));
  for (Worker& w : workers) EXPECT_OK(w.session->Close());
}

TEST_F(FaultTest, UnlinkedShmStaysMappedUntilUnregister) {
  StartServer({});
  Client client(server_->UnixChannel());
  client.set_fd_channel(server_->fd_channel_path());
  ASSERT_OK(client.Open());
  const uint64_t bytes = GatherCase::RegionBytes(512, 64, 256, 1);
  const GatherCase g(bytes, 512, 64, 256, 1);
  const Placed& out = g.outs[0];
  auto shm = TestShm::Create(server_->shm_prefix() + "unlinked", bytes);
  ASSERT_OK(shm);
  ASSERT_OK(client.Register("buf", shm->name(), 0, shm->size()));
  ASSERT_EQ(0, shm_unlink(shm->name().c_str())) << std::strerror(errno);
  bool deleted = false;
  EXPECT_TRUE(MapsShm(server_->pid(), shm->name(), &deleted)) << "the server has no mapping";
  EXPECT_TRUE(deleted) << "the server's mapping should show the object as deleted";

  // After the unlink the owner writes new inputs through its own mapping; the
  // server reads them and writes the output, which the owner reads back.
  for (int round = 0; round < 3; ++round) {
    g.Fill(shm->data(), rng_);
    std::memset(shm->data() + out.offset, 0, out.extent_bytes);
    const std::vector<uint8_t> expect = g.Expected(shm->data());
    v1::OpResponse resp;
    ASSERT_OK(client.Call(&Stub::GatherTokens, g.Request("buf", 0), &resp));
    EXPECT_EQ(0, std::memcmp(expect.data(), shm->data() + out.offset, expect.size()))
        << "round " << round;
  }
  std::string page = Scrape();
  EXPECT_EQ(Metric(page, "tokensel_registered_buffers"), 1) << Gauges(page);

  ASSERT_OK(client.Unregister("buf"));
  EXPECT_FALSE(MapsShm(server_->pid(), shm->name())) << "unregister left the mapping";
  page = Scrape();
  EXPECT_EQ(Metric(page, "tokensel_registered_buffers"), 0) << Gauges(page);
  EXPECT_EQ(Metric(page, "tokensel_registered_bytes"), 0) << Gauges(page);
  // The name no longer resolves: the client cannot open it to register it.
  EXPECT_THAT(client.Register("buf", shm->name(), 0, shm->size()).status(),
              StatusIs(Code::kNotFound, "No such file or directory"));
  ExpectServes("after-unlink");
}

}  // namespace
}  // namespace tokensel::itest
