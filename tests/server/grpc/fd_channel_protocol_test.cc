// The fd channel's wire protocol over a SOCK_SEQPACKET socketpair: the
// round trip, every malformed packet (each answered, every descriptor
// closed), end of stream, and a peer that does not read its replies.
#include "server/grpc/fd_channel_protocol.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/grpc/net_test_util.h"

namespace tokensel::server {
namespace {

using testing::FakeFdReceiver;
using ::testing::HasSubstr;

class FdChannelProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    client_.reset(sv[0]);
    server_.reset(sv[1]);
    ASSERT_EQ(::fcntl(server_.get(), F_SETFL, O_NONBLOCK), 0);
  }

  // Sends `bytes` with `count` fresh memfds (closed here after sending), has
  // the server side read and handle it, and checks that no descriptor
  // stayed open.
  v1::FdChannelReply Exchange(const std::string& bytes, int count) {
    const int before = testing::OpenFdCount();
    std::vector<int> fds;
    for (int i = 0; i < count; ++i) fds.push_back(testing::MakeMemfd());
    if (!fds.empty()) first_ino_ = testing::Inode(fds[0]);
    EXPECT_GE(testing::SendPacket(client_.get(), bytes, fds), 0) << std::strerror(errno);
    for (int fd : fds) ::close(fd);
    FdChannelPacket packet;
    EXPECT_EQ(ReadFdChannelPacket(server_.get(), &packet), FdChannelRead::kPacket);
    v1::FdChannelReply reply = HandleFdChannelPacket(std::move(packet), peer_, receiver_);
    EXPECT_EQ(testing::OpenFdCount(), before) << "a received descriptor was left open";
    return reply;
  }

  UniqueFd client_, server_;
  core::Peer peer_ = core::Peer::Unix(61001, 61000, 4242);
  FakeFdReceiver receiver_;
  ino_t first_ino_ = 0;
};

TEST_F(FdChannelProtocolTest, OneDescriptorReachesTheReceiverWithThePeer) {
  const v1::FdChannelReply reply = Exchange(testing::Request("s1"), 1);
  EXPECT_EQ(reply.code(), 0) << reply.message();
  EXPECT_EQ(reply.ticket(),
            absl::StrCat("uid:61001 pid=4242 session=s1 kind=0 ino=", first_ino_, " size=4096"));
  EXPECT_EQ(reply.object_size(), 4096u);
  EXPECT_EQ(receiver_.calls(), 1);
  const v1::FdChannelReply vmm = Exchange(testing::Request("s2", v1::FD_KIND_CUDA_VMM), 1);
  EXPECT_THAT(vmm.ticket(), HasSubstr("session=s2 kind=1"));
}

TEST_F(FdChannelProtocolTest, MalformedPacketsAreAnsweredInvalidArgument) {
  struct Case {
    std::string bytes;
    int fds;
    std::string message;
  };
  const std::vector<Case> cases = {
      {testing::Request("s"), 0, "no file descriptor attached"},
      {testing::Request("s"), 2, "2 file descriptors attached; send exactly one"},
      {testing::Request("s"), 20, "control message truncated"},
      {std::string("\xff\xff\xff\xff", 4), 1, "not a serialized tokensel.v1.FdChannelRequest"},
      {testing::Request("s") + std::string(5000, 'x'), 1, "larger than 4096 bytes"},
      {testing::Request(""), 1, "session_id is empty"},
      {testing::Request("s", v1::FD_KIND_UNSPECIFIED), 1, "kind 0 is not FD_KIND_HOST_MEMORY"},
      {testing::Request("s", static_cast<v1::FdKind>(7)), 1, "kind 7"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    const v1::FdChannelReply reply = Exchange(c.bytes, c.fds);
    EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(reply.message(), HasSubstr(c.message));
    EXPECT_TRUE(reply.ticket().empty());
  }
  EXPECT_EQ(receiver_.calls(), 0);
}

TEST_F(FdChannelProtocolTest, ReceiverErrorsKeepTheirCode) {
  v1::FdChannelReply reply = Exchange(testing::Request("missing"), 1);
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_THAT(reply.message(), HasSubstr("not found"));
  reply = Exchange(testing::Request("other"), 1);
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
}

TEST_F(FdChannelProtocolTest, NothingToReadThenEndOfStream) {
  FdChannelPacket packet;
  EXPECT_EQ(ReadFdChannelPacket(server_.get(), &packet), FdChannelRead::kWouldBlock);
  client_.reset();
  EXPECT_EQ(ReadFdChannelPacket(server_.get(), &packet), FdChannelRead::kClosed);
}

TEST_F(FdChannelProtocolTest, AnEmptyPacketWithADescriptorIsARequest) {
  const v1::FdChannelReply reply = Exchange("", 1);  // an all-default request
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(reply.message(), HasSubstr("session_id is empty"));
}

TEST_F(FdChannelProtocolTest, ReplyToAPeerThatDoesNotReadFailsInsteadOfBlocking) {
  v1::FdChannelReply reply;
  reply.set_ticket(std::string(1000, 't'));
  int sent = 0;
  while (SendFdChannelReply(server_.get(), reply)) {
    ASSERT_LT(++sent, 100000) << "the socket never filled up";
  }
  EXPECT_GT(sent, 0);
}

}  // namespace
}  // namespace tokensel::server
