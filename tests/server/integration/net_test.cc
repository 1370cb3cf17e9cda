// The server's own listeners against real tokensel-server processes:
// recovery from a connection flood at RLIMIT_NOFILE 1024, the connection
// caps (one uid cannot take them all), peer identity as the kernel reports
// it, and the unix socket directory rules. Client processes of other uids
// are tokensel_net_client --as=UID:GID (needs root; skipped otherwise).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/server/integration/fixture.h"
#include "tests/testing/child_process.h"
#include "tests/testing/eventually.h"
#include "tests/testing/http_get.h"

#ifndef TOKENSEL_NET_CLIENT_BINARY
#error "TOKENSEL_NET_CLIENT_BINARY must be defined"
#endif

namespace tokensel::itest {
namespace {

using ::testing::HasSubstr;
using ::tokensel::testing::ChildProcess;

constexpr gid_t kGroup = 61000;  // the socket group of the multi-uid tests
constexpr uid_t kUidA = 61001;
constexpr uid_t kUidB = 61002;

std::string UnixPath(const ServerProcess& server) {
  return server.unix_target().substr(std::string("unix://").size());
}

// Raw connections (no HTTP/2): what a flood or a hung client looks like.
int ConnectUnix(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// From 127.0.0.<source_host> (so that the TCP peers are distinct principals).
int ConnectTcp(int port, int source_host) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr.s_addr = htonl(0x7f000000u | static_cast<uint32_t>(source_host));
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(static_cast<uint16_t>(port));
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the server closed `fd` (EOF or reset pending); drains data.
bool ClosedByServer(int fd) {
  for (;;) {
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK;
  }
}

int Alive(const std::vector<int>& fds) {  // not closed by the server
  return std::count_if(fds.begin(), fds.end(), [](int fd) { return !ClosedByServer(fd); });
}

int TcpPort(const ServerProcess& server) {
  return std::stoi(server.tcp_target().substr(server.tcp_target().rfind(':') + 1));
}

// Pings over a fresh channel until it works or `timeout` passes.
absl::Status PingWithin(const std::shared_ptr<grpc::Channel>& channel, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last;
  while (absl::Now() < deadline) {
    last = Client(channel, absl::Seconds(1)).Ping();
    if (last.ok()) return last;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return last;
}

void RaiseOwnFdLimit() {
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  limit.rlim_cur = limit.rlim_max;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &limit), 0);
  ASSERT_GE(limit.rlim_cur, 4096u) << "the test needs ~1500 descriptors";
}

absl::StatusOr<std::unique_ptr<ChildProcess>> NetClient(std::vector<std::string> args) {
  args.insert(args.begin(), TOKENSEL_NET_CLIENT_BINARY);
  return ChildProcess::Start(args);
}

std::string As(uid_t uid) { return absl::StrCat("--as=", uid, ":", kGroup); }

// One line of a net client run to completion.
std::string RunNetClient(std::vector<std::string> args, absl::string_view prefix) {
  auto child = NetClient(std::move(args));
  if (!child.ok()) return child.status().ToString();
  (*child)->CloseStdin();
  absl::StatusOr<std::string> line = (*child)->WaitForLine(prefix, absl::Now() + absl::Seconds(20));
  return line.ok() ? *line : line.status().ToString();
}

class NetTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure() && server_ != nullptr) {
      std::string out = server_->Output();
      if (out.size() > 6000) out = "..." + out.substr(out.size() - 6000);
      ADD_FAILURE() << "server output:\n" << out;
    }
  }
  // A server whose unix socket uid kUidA/kUidB (group kGroup) can reach.
  void StartSharedServer(std::vector<std::string> extra_args) {
    ServerOptions options;
    options.extra_args = std::move(extra_args);
    options.extra_args.push_back(absl::StrCat("--unix_socket_group=", kGroup));
    auto server = ServerProcess::Start(options);
    ASSERT_OK(server);
    server_ = *std::move(server);
    // The harness' temp dir is 0700; let the other uids through (not list).
    ASSERT_EQ(::chmod(server_->temp_dir().c_str(), 0711), 0);
  }
  static bool Root() { return ::geteuid() == 0; }

  std::unique_ptr<ServerProcess> server_;
};

// 1400 raw connections against a server limited to 1024 descriptors. Before
// the server accepted connections itself, gRPC's accept loop gave up on
// EMFILE and the server never served again; now it refuses beyond the caps
// (max_connections is lowered to fit the limit), stays up, and serves new
// clients as soon as the flood ends.
TEST_F(NetTest, ConnectionFloodAtFdLimitIsRefusedAndTheServerRecovers) {
  ASSERT_NO_FATAL_FAILURE(RaiseOwnFdLimit());
  ServerOptions options;
  options.rlimit_nofile = 1024;
  auto server = ServerProcess::Start(options);
  ASSERT_OK(server);
  server_ = *std::move(server);
  const int port = TcpPort(*server_);
  const std::string path = UnixPath(*server_);

  std::vector<int> unix_fds, tcp_fds;
  for (int i = 0; i < 300; ++i) {
    const int fd = ConnectUnix(path);
    if (fd >= 0) unix_fds.push_back(fd);
  }
  for (int i = 0; i < 1100; ++i) {
    const int fd = ConnectTcp(port, 1 + i % 5);  // 220 per source address
    if (fd >= 0) tcp_fds.push_back(fd);
  }
  // Per peer 256 (uid 0 on unix), in all 1024 - 128 (ConnectionCapForFdLimit); the rest closes.
  int unix_alive = 0, tcp_alive = 0;
  testing::Eventually([&] {
    unix_alive = Alive(unix_fds), tcp_alive = Alive(tcp_fds);
    return unix_alive <= 256 && unix_alive + tcp_alive <= 1024 - 128;
  });
  ASSERT_FALSE(server_->exited());
  EXPECT_LE(unix_alive, 256);
  EXPECT_LE(unix_alive + tcp_alive, 1024 - 128);
  EXPECT_GE(unix_alive + tcp_alive, 500) << "the server should still take connections";
  EXPECT_TRUE(server_->WaitForOutput("refused a", absl::Seconds(20)));

  for (int fd : unix_fds) ::close(fd);
  for (int fd : tcp_fds) ::close(fd);
  EXPECT_OK(PingWithin(server_->UnixChannel(), absl::Seconds(10)));
  EXPECT_OK(PingWithin(server_->TcpChannel(), absl::Seconds(10)));
  auto metrics = testing::HttpGet(server_->metrics_port(), "/metrics");
  ASSERT_OK(metrics);
  EXPECT_GE(testing::MetricSum(metrics->body, "tokensel_connections_refused_total"), 504);
  EXPECT_FALSE(server_->exited());
}

TEST_F(NetTest, OneUidCannotTakeEveryConnection) {
  if (!Root()) GTEST_SKIP() << "needs root to run clients as uids " << kUidA << "/" << kUidB;
  ASSERT_NO_FATAL_FAILURE(StartSharedServer({"--max_connections_per_peer=8"}));
  const std::string path = UnixPath(*server_);
  auto hog = NetClient({As(kUidA), "hold", path, "40"});
  ASSERT_OK(hog);
  auto opened = (*hog)->WaitForLine("HOLD open=", absl::Now() + absl::Seconds(20));
  ASSERT_OK(opened);
  EXPECT_EQ(*opened, "HOLD open=40");  // connect succeeds; the server closes 32 of them

  EXPECT_EQ(RunNetClient({As(kUidB), "ping", server_->unix_target()}, "PING"), "PING OK");
  EXPECT_THAT(RunNetClient({As(kUidA), "ping", server_->unix_target()}, "PING"),
              ::testing::Not("PING OK"))
      << "uid " << kUidA << " holds its 8 connections";
  EXPECT_TRUE(server_->WaitForOutput("max_connections_per_peer", absl::Seconds(5)));

  (*hog)->CloseStdin();
  auto alive = (*hog)->WaitForLine("HOLD alive=", absl::Now() + absl::Seconds(20));
  ASSERT_OK(alive);
  EXPECT_EQ(*alive, "HOLD alive=8");
  ASSERT_OK((*hog)->WaitForExit(absl::Now() + absl::Seconds(10)));
  // Its connections are gone: the sweep frees its quota within a second.
  std::string line;
  for (int i = 0; i < 50 && line != "PING OK"; ++i) {
    line = RunNetClient({As(kUidA), "ping", server_->unix_target()}, "PING");
  }
  EXPECT_EQ(line, "PING OK");
}

TEST_F(NetTest, TotalCapAppliesToEveryone) {
  ASSERT_NO_FATAL_FAILURE(RaiseOwnFdLimit());
  ServerOptions options;
  options.extra_args = {"--max_connections=6"};
  auto server = ServerProcess::Start(options);
  ASSERT_OK(server);
  server_ = *std::move(server);
  // The harness's start-up health check is a connection too: wait until it
  // is gone (slow under TSan), or it takes one of the six slots.
  ASSERT_TRUE(testing::Eventually([&] {
    const auto page = testing::HttpGet(server_->metrics_port(), "/metrics");
    return page.ok() && testing::MetricSum(page->body, "tokensel_connections") == 0;
  })) << "the start-up connections did not close";
  std::vector<int> fds;
  for (int i = 0; i < 10; ++i) fds.push_back(ConnectTcp(TcpPort(*server_), 1 + i));
  absl::StatusOr<testing::HttpResponse> metrics;
  int alive = 0;
  testing::Eventually([&] {
    metrics = testing::HttpGet(server_->metrics_port(), "/metrics");
    alive = Alive(fds);
    return alive <= 6 && metrics.ok() &&
           testing::MetricSum(metrics->body, "tokensel_connections_refused_total") >= 4;
  });
  ASSERT_OK(metrics);
  EXPECT_EQ(alive, 6);
  EXPECT_EQ(testing::MetricValue(metrics->body, "tokensel_connections{transport=\"tcp\"}"), 6);
  EXPECT_EQ(testing::MetricValue(metrics->body,
                                 "tokensel_connections_refused_total{reason=\"max_connections\"}"),
            4);
  EXPECT_THAT(Client(server_->UnixChannel(), absl::Seconds(2)).Ping(),
              ::testing::Not(::tokensel::testing::IsOk()));
  for (int fd : fds) ::close(fd);
  EXPECT_OK(PingWithin(server_->UnixChannel(), absl::Seconds(10)));
}

// A TCP connection that never sends the HTTP/2 preface is closed after the
// 10 s handshake bound, also now that the server accepts it itself.
TEST_F(NetTest, SilentTcpConnectionIsClosedAfterTheHandshakeTimeout) {
  auto server = ServerProcess::Start({});
  ASSERT_OK(server);
  server_ = *std::move(server);
  const int fd = ConnectTcp(TcpPort(*server_), 1);
  ASSERT_GE(fd, 0);
  const absl::Time start = absl::Now();
  bool closed = false;
  // By the server's 10 s timer, not gRPC's default 120 s (60 s tells them apart).
  while (!closed && absl::Now() - start < absl::Seconds(60)) {
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 100) > 0) closed = ClosedByServer(fd);
  }
  const absl::Duration took = absl::Now() - start;
  ::close(fd);
  EXPECT_TRUE(closed) << "open after " << took;
  EXPECT_GE(took, absl::Seconds(9));
}

TEST_F(NetTest, UnixPeersAreTheKernelsUids) {
  if (!Root()) GTEST_SKIP() << "needs root to run clients as uids " << kUidA << "/" << kUidB;
  ASSERT_NO_FATAL_FAILURE(StartSharedServer({"--log_level=debug"}));
  for (uid_t uid : {kUidA, kUidB}) {
    auto child = NetClient({As(uid), "ping", server_->unix_target()});
    ASSERT_OK(child);
    const pid_t pid = (*child)->pid();
    (*child)->CloseStdin();
    absl::StatusOr<std::string> line =
        (*child)->WaitForLine("PING", absl::Now() + absl::Seconds(20));
    ASSERT_OK(line);
    EXPECT_EQ(*line, "PING OK");
    // The accept loop's debug line: the identity SO_PEERCRED reported.
    EXPECT_TRUE(
        server_->WaitForOutput(absl::StrCat("from uid:", uid, " pid ", pid), absl::Seconds(5)))
        << "uid " << uid << " pid " << pid;
  }
}

class SocketDirectoryTest : public NetTest {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tokensel-net-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    NetTest::TearDown();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // Starts a server that also listens on `path`; expects it to refuse.
  std::string ExpectRefused(const std::string& path) {
    ServerOptions options;
    options.wait_for_startup = false;
    options.extra_args = {"--listen=unix://" + path};
    auto server = ServerProcess::Start(options);
    EXPECT_OK(server);
    if (!server.ok()) return "";
    absl::StatusOr<int> code = (*server)->WaitForExit(absl::Seconds(20));
    EXPECT_TRUE(code.ok() && *code == 1) << code.status() << "\n" << (*server)->Output();
    return (*server)->Output();
  }
  std::string dir_;
};

TEST_F(SocketDirectoryTest, WorldWritableDirectoryIsRefused) {
  ASSERT_EQ(::chmod(dir_.c_str(), 0777), 0);
  EXPECT_THAT(ExpectRefused(dir_ + "/s.sock"),
              HasSubstr("can be written by other users and is not sticky"));
  struct stat st;
  EXPECT_NE(::lstat((dir_ + "/s.sock").c_str(), &st), 0) << "nothing may be left behind";
}

TEST_F(SocketDirectoryTest, SquattedSocketInStickyDirectoryIsRefused) {
  if (!Root()) GTEST_SKIP() << "needs root to make a socket of another uid";
  ASSERT_EQ(::chmod(dir_.c_str(), 01777), 0);
  const std::string path = dir_ + "/s.sock";
  const int squatter = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(squatter, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(squatter);  // not even listening: a stale socket, but not ours
  ASSERT_EQ(::lchown(path.c_str(), kUidA, kGroup), 0);
  EXPECT_THAT(ExpectRefused(path), HasSubstr(absl::StrCat("belongs to uid ", kUidA)));
  struct stat st;
  ASSERT_EQ(::lstat(path.c_str(), &st), 0) << "another uid's entry must not be removed";
  EXPECT_EQ(st.st_uid, kUidA);
}

TEST_F(SocketDirectoryTest, StickyDirectoryWithoutSquatterServes) {
  ASSERT_EQ(::chmod(dir_.c_str(), 01777), 0);
  ServerOptions options;
  options.extra_args = {"--listen=unix://" + dir_ + "/s.sock"};
  auto server = ServerProcess::Start(options);
  ASSERT_OK(server);
  struct stat st;
  ASSERT_EQ(::lstat((dir_ + "/s.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_EQ(st.st_mode & 07777, 0660u);
}

TEST_F(SocketDirectoryTest, CreatesTheDirectory0750AndTheSocket0660WithTheGroup) {
  if (!Root()) GTEST_SKIP() << "needs root to chown to group " << kGroup;
  const std::string sub = dir_ + "/run";
  ServerOptions options;
  options.extra_args = {"--listen=unix://" + sub + "/tokensel.sock",
                        absl::StrCat("--unix_socket_group=", kGroup)};
  auto server = ServerProcess::Start(options);
  ASSERT_OK(server);
  struct stat st;
  ASSERT_EQ(::stat(sub.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_EQ(st.st_gid, kGroup);
  ASSERT_EQ(::lstat((sub + "/tokensel.sock").c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_gid, kGroup);
  // A client of that group (another uid) gets in.
  ASSERT_EQ(::chmod(dir_.c_str(), 0711), 0);
  EXPECT_EQ(RunNetClient({As(kUidA), "ping", "unix://" + sub + "/tokensel.sock"}, "PING"),
            "PING OK");
  // One not in the group does not.
  EXPECT_THAT(RunNetClient({absl::StrCat("--as=", kUidB, ":", kGroup + 5), "ping",
                            "unix://" + sub + "/tokensel.sock"},
                           "PING"),
              ::testing::Not("PING OK"));
}

TEST_F(SocketDirectoryTest, PathWithoutRoomForTheFdChannelIsRefused) {
  // 105 bytes: fits sun_path (107), its ".fd" twin does not.
  const std::string path = dir_ + "/" + std::string(105 - dir_.size() - 1, 'a');
  ASSERT_EQ(path.size(), 105u);
  EXPECT_THAT(ExpectRefused(path), HasSubstr("must fit"));
}

}  // namespace
}  // namespace tokensel::itest
