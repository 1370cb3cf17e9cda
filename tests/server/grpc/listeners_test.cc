#include "server/grpc/listeners.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "server/grpc/unix_socket.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::server {
namespace {

using ::tokensel::testing::StatusIs;

TEST(ParseListenAddressTest, UnixAndTcpForms) {
  absl::StatusOr<ListenAddress> a = ParseListenAddress("unix:///tmp/x.sock");
  ASSERT_OK(a);
  EXPECT_EQ(a->address, "unix:///tmp/x.sock");
  EXPECT_EQ(a->unix_path, "/tmp/x.sock");

  absl::StatusOr<ListenAddress> rel = ParseListenAddress("unix:rel.sock");
  ASSERT_OK(rel);
  EXPECT_EQ(rel->unix_path, "rel.sock");

  absl::StatusOr<ListenAddress> tcp = ParseListenAddress("127.0.0.1:0");
  ASSERT_OK(tcp);
  EXPECT_FALSE(tcp->unix_path.has_value());
  ASSERT_OK(ParseListenAddress("[::1]:50051"));
}

TEST(ParseListenAddressTest, RejectsMalformed) {
  EXPECT_THAT(ParseListenAddress(""), StatusIs(absl::StatusCode::kInvalidArgument, "empty"));
  EXPECT_THAT(ParseListenAddress("unix://"),
              StatusIs(absl::StatusCode::kInvalidArgument, "empty socket path"));
  EXPECT_THAT(ParseListenAddress("unix:///" + std::string(200, 'a')),
              StatusIs(absl::StatusCode::kInvalidArgument, "longer than"));
  EXPECT_THAT(ParseListenAddress("localhost"),
              StatusIs(absl::StatusCode::kInvalidArgument, "host:port"));
  EXPECT_THAT(ParseListenAddress("localhost:http"),
              StatusIs(absl::StatusCode::kInvalidArgument, "host:port"));
  EXPECT_THAT(ParseListenAddress("localhost:70000"),
              StatusIs(absl::StatusCode::kInvalidArgument, "host:port"));
}

TEST(WithPortTest, ReplacesThePort) {
  EXPECT_EQ(WithPort("0.0.0.0:0", 4321), "0.0.0.0:4321");
  EXPECT_EQ(WithPort("[::1]:0", 5), "[::1]:5");
}

class RemoveStaleSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tokensel-listen-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/s.sock";
  }
  void TearDown() override {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  // Binds a unix socket at path_; listens when `listen`. Returns the fd.
  int Bind(bool listen) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    if (listen) {
      EXPECT_EQ(::listen(fd, 1), 0);
    }
    return fd;
  }
  bool Exists() const {
    struct stat st;
    return ::lstat(path_.c_str(), &st) == 0;
  }
  std::string dir_, path_;
};

TEST_F(RemoveStaleSocketTest, NothingThereIsFine) { EXPECT_OK(RemoveStaleSocket(path_)); }

TEST_F(RemoveStaleSocketTest, RemovesASocketNobodyAcceptsOn) {
  ::close(Bind(/*listen=*/false));
  ASSERT_TRUE(Exists());
  EXPECT_OK(RemoveStaleSocket(path_));
  EXPECT_FALSE(Exists());
}

TEST_F(RemoveStaleSocketTest, RefusesALiveServer) {
  const int fd = Bind(/*listen=*/true);
  EXPECT_THAT(RemoveStaleSocket(path_),
              StatusIs(absl::StatusCode::kFailedPrecondition, "another server"));
  EXPECT_TRUE(Exists());
  ::close(fd);
}

TEST_F(RemoveStaleSocketTest, RefusesARegularFile) {
  std::ofstream(path_) << "not a socket";
  EXPECT_THAT(RemoveStaleSocket(path_),
              StatusIs(absl::StatusCode::kFailedPrecondition, "not a socket"));
  EXPECT_TRUE(Exists());
}

TEST(ResolveGroupTest, NamesAndNumericGids) {
  absl::StatusOr<gid_t> root = ResolveGroup("root");
  ASSERT_OK(root);
  EXPECT_EQ(*root, 0u);
  absl::StatusOr<gid_t> numeric = ResolveGroup("4242");  // need not exist
  ASSERT_OK(numeric);
  EXPECT_EQ(*numeric, 4242u);
  EXPECT_THAT(ResolveGroup(""), StatusIs(absl::StatusCode::kInvalidArgument, "empty group"));
  EXPECT_THAT(
      ResolveGroup("tokensel-no-such-group"),
      StatusIs(absl::StatusCode::kInvalidArgument, "no group named 'tokensel-no-such-group'"));
}

}  // namespace
}  // namespace tokensel::server
