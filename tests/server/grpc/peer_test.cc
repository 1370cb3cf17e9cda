// Who a call comes from, end to end through gRPC 1.51: a grpc::Server fed by
// the AcceptLoop (GrpcConnectionSink), with a service that answers
// GetServerInfo with PeerOf(table, ctx) and ctx->peer(). Pins gRPC's peer
// strings ("fd:<n>" for AddInsecureChannelFromFd, "ipv4:a.b.c.d:port" for
// the external TCP acceptor) and checks that clients of two other uids each
// get their own uid. Then the whole tokensel Server with a fake FdReceiver:
// ServerInfo.fd_channel and an SCM_RIGHTS round trip from another uid.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "server/grpc/grpc_connection_sink.h"
#include "server/grpc/listeners.h"
#include "server/grpc/unix_socket.h"
#include "tests/server/grpc/grpc_test_util.h"
#include "tests/server/grpc/net_test_util.h"
#include "tests/testing/child_process.h"
#include "tests/testing/status_matchers.h"
#include "tokensel/v1/tokensel.grpc.pb.h"

#ifndef TOKENSEL_NET_CLIENT_BINARY
#error "TOKENSEL_NET_CLIENT_BINARY must be defined"
#endif

namespace tokensel::server {
namespace {

using ::testing::MatchesRegex;
using ::tokensel::testing::ChildProcess;

constexpr gid_t kGroup = 61000;
constexpr uid_t kUidA = 61001;
constexpr uid_t kUidB = 61002;

class PeerEchoService final : public v1::TokenSelect::CallbackService {
 public:
  explicit PeerEchoService(const ConnectionTable* table) : table_(table) {}
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* ctx,
                                          const v1::GetServerInfoRequest*,
                                          v1::ServerInfo* info) override {
    const core::Peer peer = PeerOf(table_, *ctx);
    info->set_version(absl::StrCat(peer.Principal(), " ", ctx->peer()));
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  const ConnectionTable* const table_;
};

// "INFO ..." from tokensel_net_client run as `uid`.
std::string InfoAs(uid_t uid, const std::string& target) {
  auto child = ChildProcess::Start(
      {TOKENSEL_NET_CLIENT_BINARY, absl::StrCat("--as=", uid, ":", kGroup), "info", target});
  if (!child.ok()) return child.status().ToString();
  (*child)->CloseStdin();
  auto line = (*child)->WaitForLine("INFO", absl::Now() + absl::Seconds(20));
  return line.ok() ? *line : line.status().ToString();
}

std::string GetInfo(const std::string& target) {
  auto stub =
      v1::TokenSelect::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ServerInfo info;
  const grpc::Status s = stub->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info);
  return s.ok() ? info.version() : absl::StrCat("error ", s.error_code(), " ", s.error_message());
}

class PeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tokensel-peer-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_EQ(::chmod(dir_.c_str(), 0711), 0);  // other uids may pass, not list
    table_ = std::make_unique<ConnectionTable>(100, 100, nullptr);
    loop_ = std::make_unique<AcceptLoop>(AcceptLoopOptions{}, table_.get(), nullptr);
    UnixListenOptions unix_options;
    if (::geteuid() == 0) unix_options.group = kGroup;
    path_ = dir_ + "/s.sock";
    absl::StatusOr<UniqueFd> unix_fd = ListenUnix(path_, unix_options);
    ASSERT_OK(unix_fd);
    loop_->AddListener(Transport::kUnix, *std::move(unix_fd));
    absl::StatusOr<ListenAddress> tcp_address = ParseListenAddress("127.0.0.1:0");
    ASSERT_OK(tcp_address);
    absl::StatusOr<TcpListener> tcp = ListenTcp(*tcp_address);
    ASSERT_OK(tcp);
    tcp_port_ = tcp->port;
    for (UniqueFd& fd : tcp->fds) loop_->AddListener(Transport::kTcp, std::move(fd));

    service_ = std::make_unique<PeerEchoService>(table_.get());
    grpc::ServerBuilder builder;
    acceptor_ = builder.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
        grpc::InsecureServerCredentials());
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    sink_ = std::make_unique<GrpcConnectionSink>(server_.get(), acceptor_.get());
    ASSERT_OK(loop_->Start(sink_.get(), nullptr));
  }
  void TearDown() override {
    if (loop_ != nullptr) loop_->Stop();
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string dir_, path_;
  int tcp_port_ = 0;
  std::unique_ptr<ConnectionTable> table_;
  std::unique_ptr<AcceptLoop> loop_;
  std::unique_ptr<PeerEchoService> service_;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<GrpcConnectionSink> sink_;
};

TEST_F(PeerTest, UnixCallsAreFdPeersWithTheKernelsUid) {
  EXPECT_THAT(GetInfo("unix://" + path_),
              MatchesRegex(absl::StrCat("uid:", ::geteuid(), " fd:[0-9]+")));
}

TEST_F(PeerTest, TcpCallsArePeersByAddress) {
  EXPECT_THAT(GetInfo(absl::StrCat("127.0.0.1:", tcp_port_)),
              MatchesRegex("tcp:127\\.0\\.0\\.1 ipv4:127\\.0\\.0\\.1:[0-9]+"));
}

TEST_F(PeerTest, ClientsOfTwoUidsEachSeeTheirOwnUid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run clients as other uids";
  for (uid_t uid : {kUidA, kUidB}) {
    EXPECT_THAT(InfoAs(uid, "unix://" + path_),
                MatchesRegex(absl::StrCat("INFO uid:", uid, " fd:[0-9]+")));
  }
}

// The whole Server with a fake receiver.
TEST(FdChannelServerTest, RoundTripFromAnotherUidAndServerInfo) {
  testing::FakeFdReceiver receiver;
  ServerOptions options;
  options.fd_receiver = &receiver;
  if (::geteuid() == 0) options.unix_socket_group = std::to_string(kGroup);
  auto s = testing::InProcessServer::Start(options);
  ASSERT_OK(s);
  grpc::ClientContext ctx;
  v1::ServerInfo info;
  ASSERT_TRUE((*s)->stub().GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info).ok());
  EXPECT_TRUE(info.fd_channel());

  const std::string path = (*s)->address().substr(std::string("unix://").size());
  const std::string fd_path = FdChannelPath(path);
  struct stat st;
  ASSERT_EQ(::lstat(fd_path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u);

  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run the client as another uid";
  EXPECT_EQ(st.st_gid, kGroup);
  const std::string dir = path.substr(0, path.rfind('/'));
  ASSERT_EQ(::chmod(dir.c_str(), 0711), 0);
  auto child =
      ChildProcess::Start({TOKENSEL_NET_CLIENT_BINARY, absl::StrCat("--as=", kUidA, ":", kGroup),
                           "fd", fd_path, "sess-1", "1"});
  ASSERT_OK(child);
  const pid_t pid = (*child)->pid();
  (*child)->CloseStdin();
  absl::StatusOr<std::string> line = (*child)->WaitForLine("FD", absl::Now() + absl::Seconds(20));
  ASSERT_OK(line);
  // "FD code=0 ino=<i> ticket=uid:61001 pid=<pid> session=sess-1 kind=0 ino=<i> size=4096 ..."
  const std::string ino = line->substr(
      line->find("ino=") + 4, line->find(' ', line->find("ino=")) - line->find("ino=") - 4);
  EXPECT_EQ(*line, absl::StrCat("FD code=0 ino=", ino, " ticket=uid:", kUidA, " pid=", pid,
                                " session=sess-1 kind=0 ino=", ino, " size=4096 message="));
  EXPECT_EQ(receiver.calls(), 1);
}

TEST(FdChannelServerTest, TheServerServesItsOwnFdChannelByDefault) {
  auto s = testing::InProcessServer::Start({});
  ASSERT_OK(s);
  grpc::ClientContext ctx;
  v1::ServerInfo info;
  ASSERT_TRUE((*s)->stub().GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info).ok());
  EXPECT_TRUE(info.fd_channel());
  const std::string path = (*s)->address().substr(std::string("unix://").size());
  struct stat st;
  ASSERT_EQ(::lstat(FdChannelPath(path).c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
}

}  // namespace
}  // namespace tokensel::server
