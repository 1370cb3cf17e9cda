// ConnectionTable: the caps, the sweep that notices closed descriptors,
// descriptor reuse, and the peer of a gRPC peer string.
#include "server/grpc/connection_table.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tokensel::server {
namespace {

// A connected socket (as the accept loop would hold); the other end is
// kept in `ends`.
int Socket(std::vector<int>* ends) {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  ends->push_back(sv[1]);
  return sv[0];
}

class ConnectionTableTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (int fd : fds_) ::close(fd);
    for (int fd : ends_) ::close(fd);
  }
  int NewSocket() {
    fds_.push_back(Socket(&ends_));
    return fds_.back();
  }
  std::vector<int> fds_, ends_;
};

TEST_F(ConnectionTableTest, PerPeerCapLeavesRoomForOtherPeers) {
  ConnectionTable table(/*max_connections=*/10, /*max_connections_per_peer=*/2, nullptr);
  const core::Peer a = core::Peer::Unix(61001, 1, 1);
  const core::Peer b = core::Peer::Unix(61002, 1, 1);
  EXPECT_EQ(table.Add(NewSocket(), Transport::kUnix, a), std::nullopt);
  EXPECT_EQ(table.Add(NewSocket(), Transport::kFdChannel, a), std::nullopt);  // counts too
  EXPECT_EQ(table.Add(NewSocket(), Transport::kUnix, a), RefuseReason::kMaxConnectionsPerPeer);
  EXPECT_EQ(table.Add(NewSocket(), Transport::kUnix, b), std::nullopt);
  EXPECT_EQ(table.count_for("uid:61001"), 2u);
  EXPECT_EQ(table.count_for("uid:61002"), 1u);
  EXPECT_EQ(table.size(), 3u);
  EXPECT_EQ(table.count(Transport::kUnix), 2u);
  EXPECT_EQ(table.count(Transport::kFdChannel), 1u);
}

TEST_F(ConnectionTableTest, TotalCapAndTcpPrincipalsByAddress) {
  ConnectionTable table(3, 2, nullptr);
  EXPECT_EQ(table.Add(NewSocket(), Transport::kTcp, core::Peer::Tcp("10.0.0.1")), std::nullopt);
  EXPECT_EQ(table.Add(NewSocket(), Transport::kTcp, core::Peer::Tcp("10.0.0.1")), std::nullopt);
  EXPECT_EQ(table.Add(NewSocket(), Transport::kTcp, core::Peer::Tcp("10.0.0.1")),
            RefuseReason::kMaxConnectionsPerPeer);
  EXPECT_EQ(table.Add(NewSocket(), Transport::kTcp, core::Peer::Tcp("10.0.0.2")), std::nullopt);
  EXPECT_EQ(table.Add(NewSocket(), Transport::kTcp, core::Peer::Tcp("10.0.0.3")),
            RefuseReason::kMaxConnections);
}

TEST_F(ConnectionTableTest, ClosedConnectionsLeaveAtTheSweepAndBeforeARefusal) {
  ConnectionTable table(2, 2, nullptr);
  const core::Peer a = core::Peer::Unix(61001, 1, 1);
  const int first = NewSocket();
  const int second = NewSocket();
  ASSERT_EQ(table.Add(first, Transport::kUnix, a), std::nullopt);
  ASSERT_EQ(table.Add(second, Transport::kUnix, a), std::nullopt);
  EXPECT_EQ(table.Sweep(), 0);
  // gRPC closes `first` without telling anyone; something else takes the
  // number (so the next connection gets another one).
  ::close(first);
  fds_.erase(fds_.begin());
  const int placeholder = ::dup(ends_[0]);
  ASSERT_EQ(placeholder, first);
  fds_.push_back(placeholder);
  EXPECT_EQ(table.size(), 2u);
  // A new connection over the cap: the table sweeps before refusing.
  absl::SleepFor(absl::Milliseconds(60));  // past the sweep rate limit
  EXPECT_EQ(table.Add(NewSocket(), Transport::kUnix, a), std::nullopt);
  EXPECT_EQ(table.size(), 2u);
  ::close(second);
  fds_.erase(std::find(fds_.begin(), fds_.end(), second));
  EXPECT_EQ(table.Sweep(), 1);
  EXPECT_EQ(table.size(), 1u);
}

TEST_F(ConnectionTableTest, AReusedNumberNamingAnotherFileIsSwept) {
  ConnectionTable table(10, 10, nullptr);
  const int fd = NewSocket();
  ASSERT_EQ(table.Add(fd, Transport::kUnix, core::Peer::Unix(61001, 1, 1)), std::nullopt);
  // The connection is closed and its number now names another socket.
  const int other = Socket(&ends_);
  ASSERT_EQ(::dup2(other, fd), fd);
  ::close(other);
  EXPECT_EQ(table.Sweep(), 1);
  EXPECT_EQ(table.PeerOf(absl::StrCat("fd:", fd)).kind, core::Peer::Kind::kUnknown);
  EXPECT_EQ(table.size(), 0u);
}

TEST_F(ConnectionTableTest, ANewConnectionWithAReusedNumberReplacesTheOldEntry) {
  ConnectionTable table(10, 1, nullptr);
  const int fd = NewSocket();
  ASSERT_EQ(table.Add(fd, Transport::kUnix, core::Peer::Unix(61001, 1, 1)), std::nullopt);
  const int other = Socket(&ends_);
  ASSERT_EQ(::dup2(other, fd), fd);
  ::close(other);
  ASSERT_EQ(table.Add(fd, Transport::kUnix, core::Peer::Unix(61002, 1, 7)), std::nullopt);
  const core::Peer peer = table.PeerOf(absl::StrCat("fd:", fd));
  EXPECT_EQ(peer.Principal(), "uid:61002");
  EXPECT_EQ(peer.pid, 7);
  EXPECT_EQ(table.count_for("uid:61001"), 0u);
  EXPECT_EQ(table.size(), 1u);
}

TEST_F(ConnectionTableTest, PeerOfGrpcPeerStrings) {
  ConnectionTable table(10, 10, nullptr);
  const int fd = NewSocket();
  ASSERT_EQ(table.Add(fd, Transport::kUnix, core::Peer::Unix(61001, 61000, 99)), std::nullopt);
  const core::Peer unix_peer = table.PeerOf(absl::StrCat("fd:", fd));
  EXPECT_EQ(unix_peer.kind, core::Peer::Kind::kUnix);
  EXPECT_EQ(unix_peer.uid, 61001u);
  EXPECT_EQ(unix_peer.gid, 61000u);
  EXPECT_EQ(unix_peer.pid, 99);
  EXPECT_EQ(table.PeerOf("fd:99999").kind, core::Peer::Kind::kUnknown);
  EXPECT_EQ(table.PeerOf("fd:x").kind, core::Peer::Kind::kUnknown);
  EXPECT_EQ(table.PeerOf("ipv4:10.1.2.3:5000").Principal(), "tcp:10.1.2.3");
  EXPECT_EQ(table.PeerOf("ipv6:[::1]:5000").Principal(), "tcp:::1");
  EXPECT_EQ(table.PeerOf("ipv6:%5B::1%5D:5000").Principal(), "tcp:::1");
  EXPECT_EQ(table.PeerOf("ipv6:%5Bfe80::1%5D:1").Principal(), "tcp:fe80::1");
  EXPECT_EQ(table.PeerOf("unix:/tmp/x.sock").kind, core::Peer::Kind::kUnknown);
  EXPECT_EQ(table.PeerOf("").Principal(), "unknown");
  EXPECT_EQ(table.PeerOf("ipv4:").kind, core::Peer::Kind::kUnknown);
  // A TCP fd entry is not a unix peer.
  const int tcp = NewSocket();
  ASSERT_EQ(table.Add(tcp, Transport::kTcp, core::Peer::Tcp("10.0.0.1")), std::nullopt);
  EXPECT_EQ(table.PeerOf(absl::StrCat("fd:", tcp)).kind, core::Peer::Kind::kUnknown);
}

}  // namespace
}  // namespace tokensel::server
