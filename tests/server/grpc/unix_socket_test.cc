// ListenUnix's rules: the socket directory (created 0750, refused when
// others can write it unless sticky, refused when another uid owns it), the
// entry at the path (stale ours removed, another uid's or a live one
// refused), the final mode and group, and the message a non-root user gets
// for a directory it cannot create.
#include "server/grpc/unix_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::server {
namespace {

using ::testing::HasSubstr;
using ::tokensel::testing::StatusIs;
using Code = absl::StatusCode;

constexpr uid_t kOtherUid = 61001;
constexpr gid_t kSocketGroup = 61000;

class UnixSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tokensel-unix-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  static mode_t Mode(const std::string& path) {
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0;
  }
  static bool Exists(const std::string& path) {
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0;
  }
  // A socket bound at `path` (listening when `listen`); the descriptor.
  static int Bind(const std::string& path, bool listen) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    if (listen) {
      EXPECT_EQ(::listen(fd, 1), 0);
    }
    return fd;
  }
  static bool Root() { return ::geteuid() == 0; }
  std::string dir_;
};

TEST_F(UnixSocketTest, CreatesTheDirectory0750AndTheSocket0660WhateverTheUmask) {
  const mode_t old = ::umask(0);  // the most permissive umask
  const std::string path = dir_ + "/run/s.sock";
  absl::StatusOr<UniqueFd> fd = ListenUnix(path, {});
  ::umask(old);
  ASSERT_OK(fd);
  EXPECT_EQ(Mode(dir_ + "/run"), 0750u);
  EXPECT_EQ(Mode(path), 0660u);
  EXPECT_FALSE(Exists(FdChannelPath(path)));
}

TEST_F(UnixSocketTest, GroupAndModeAsAsked) {
  if (!Root()) GTEST_SKIP() << "needs root to chown to gid " << kSocketGroup;
  UnixListenOptions options;
  options.group = kSocketGroup;
  options.type = SOCK_SEQPACKET;
  const std::string path = dir_ + "/run/s.sock.fd";
  absl::StatusOr<UniqueFd> fd = ListenUnix(path, options);
  ASSERT_OK(fd);
  struct stat st;
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_gid, kSocketGroup);
  ASSERT_EQ(::stat((dir_ + "/run").c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, kSocketGroup) << "the group must be able to reach the socket";
  int type = 0;
  socklen_t len = sizeof(type);
  ASSERT_EQ(::getsockopt(fd->get(), SOL_SOCKET, SO_TYPE, &type, &len), 0);
  EXPECT_EQ(type, SOCK_SEQPACKET);
}

TEST_F(UnixSocketTest, DirectoryOthersCanWriteIsRefusedUnlessSticky) {
  for (mode_t mode : {0777, 0770, 0722}) {
    ASSERT_EQ(::chmod(dir_.c_str(), mode), 0);
    EXPECT_THAT(ListenUnix(dir_ + "/s.sock", {}),
                StatusIs(Code::kFailedPrecondition, "can be written by other users"))
        << std::oct << mode;
    EXPECT_FALSE(Exists(dir_ + "/s.sock"));
  }
  ASSERT_EQ(::chmod(dir_.c_str(), 01777), 0);
  EXPECT_OK(ListenUnix(dir_ + "/s.sock", {}));
}

TEST_F(UnixSocketTest, DirectoryOfAnotherUidIsRefusedEvenSticky) {
  if (!Root()) GTEST_SKIP() << "needs root to chown the directory";
  ASSERT_EQ(::chown(dir_.c_str(), kOtherUid, kSocketGroup), 0);
  ASSERT_EQ(::chmod(dir_.c_str(), 01755), 0);
  EXPECT_THAT(ListenUnix(dir_ + "/s.sock", {}),
              StatusIs(Code::kFailedPrecondition, absl::StrCat("belongs to uid ", kOtherUid)));
}

TEST_F(UnixSocketTest, SquattedEntryOfAnotherUidIsRefusedAndLeftAlone) {
  if (!Root()) GTEST_SKIP() << "needs root to make an entry of another uid";
  ASSERT_EQ(::chmod(dir_.c_str(), 01777), 0);
  const std::string path = dir_ + "/s.sock";
  ::close(Bind(path, /*listen=*/false));
  ASSERT_EQ(::lchown(path.c_str(), kOtherUid, kSocketGroup), 0);
  EXPECT_THAT(ListenUnix(path, {}),
              StatusIs(Code::kFailedPrecondition,
                       absl::StrCat("belongs to uid ", kOtherUid, ", not to this server")));
  EXPECT_TRUE(Exists(path));
}

TEST_F(UnixSocketTest, StaleSocketOfOursIsReplacedALiveOneIsNot) {
  const std::string path = dir_ + "/s.sock";
  ::close(Bind(path, /*listen=*/false));
  EXPECT_OK(ListenUnix(path, {}));
  const std::string live = dir_ + "/live.sock";
  const int fd = Bind(live, /*listen=*/true);
  EXPECT_THAT(ListenUnix(live, {}), StatusIs(Code::kFailedPrecondition, "another server"));
  ::close(fd);
  // A SOCK_SEQPACKET listener probed as SOCK_STREAM counts as live too.
  UnixListenOptions seqpacket;
  seqpacket.type = SOCK_SEQPACKET;
  const std::string fd_path = dir_ + "/x.fd";
  absl::StatusOr<UniqueFd> channel = ListenUnix(fd_path, seqpacket);
  ASSERT_OK(channel);
  EXPECT_THAT(RemoveStaleSocket(fd_path, SOCK_STREAM),
              StatusIs(Code::kFailedPrecondition, "another server"));
}

TEST_F(UnixSocketTest, NonRootWithoutTheDirectoryIsToldToUseXdgRuntimeDir) {
  if (!Root()) GTEST_SKIP() << "needs root to switch to another uid in a child";
  const std::string path = absl::StrCat("/run/tokensel-test-", ::getpid(), "/tokensel.sock");
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    if (::setresgid(kSocketGroup, kSocketGroup, kSocketGroup) != 0 ||
        ::setresuid(kOtherUid, kOtherUid, kOtherUid)) {
      ::_exit(3);
    }
    ::setenv("XDG_RUNTIME_DIR", "/run/user/61001", 1);
    const std::string message = ListenUnix(path, {}).status().ToString();
    (void)!::write(pipe_fds[1], message.data(), message.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string message;
  char buf[1024];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0) message.append(buf, n);
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_THAT(message, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_THAT(message, HasSubstr("cannot create the socket directory /run/tokensel-test-"));
  EXPECT_THAT(message, HasSubstr("pass --listen=unix:///run/user/61001/tokensel.sock"));
}

}  // namespace
}  // namespace tokensel::server
