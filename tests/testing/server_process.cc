#include "tests/testing/server_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "tests/server/integration/protos/health.grpc.pb.h"

#ifndef TOKENSEL_SERVER_BINARY
#error "TOKENSEL_SERVER_BINARY must be defined to the tokensel-server path"
#endif

namespace tokensel::testing {
namespace {

absl::Status ErrnoError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, int max_message_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  // Every channel its own connection: the benchmark and the concurrency
  // tests want independent transports.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

// The port in the first "127.0.0.1:<port>" of `line` (port != 0), or 0.
int LoopbackPort(absl::string_view line) {
  constexpr absl::string_view kHost = "127.0.0.1:";
  for (size_t pos = line.find(kHost); pos != absl::string_view::npos;
       pos = line.find(kHost, pos + 1)) {
    absl::string_view rest = line.substr(pos + kHost.size());
    size_t digits = 0;
    while (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9') ++digits;
    int port = 0;
    if (digits > 0 && absl::SimpleAtoi(rest.substr(0, digits), &port) && port > 0) return port;
  }
  return 0;
}

}  // namespace

std::string DefaultShmPrefix() { return absl::StrCat("/tokensel-it-", getpid(), "-"); }

std::optional<std::string> FindField(absl::string_view line, absl::string_view key) {
  for (absl::string_view token : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&token, key) && absl::ConsumePrefix(&token, "=")) {
      return std::string(token);
    }
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(ServerOptions options) {
  std::unique_ptr<ServerProcess> server(new ServerProcess());
  const char* echo = std::getenv("TOKENSEL_TEST_SERVER_LOG");
  server->echo_ = echo != nullptr && echo[0] == '1';
  char dir_template[] = "/tmp/tokensel-it-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return ErrnoError("mkdtemp");
  server->temp_dir_ = dir_template;
  server->unix_target_ = absl::StrCat("unix://", server->temp_dir_, "/tokensel.sock");
  if (options.socket_group.has_value()) {
    if (chown(dir_template, geteuid(), *options.socket_group) != 0) return ErrnoError("chown");
    if (chmod(dir_template, 0750) != 0) return ErrnoError("chmod");
  }
  server->shm_prefix_ = options.shm_prefix.empty() ? DefaultShmPrefix() : options.shm_prefix;

  std::vector<std::string> argv = {TOKENSEL_SERVER_BINARY,
                                   absl::StrCat("--listen=", server->unix_target_)};
  if (options.tcp) argv.push_back("--listen=127.0.0.1:0");
  if (options.tcp && options.insecure_tcp) argv.push_back("--insecure_tcp");
  argv.push_back(absl::StrCat("--metrics_address=", options.metrics ? "127.0.0.1:0" : ""));
  argv.push_back(absl::StrCat("--shm_prefix=", server->shm_prefix_));
  if (options.socket_group.has_value()) {
    argv.push_back(absl::StrCat("--unix_socket_group=", *options.socket_group));
  }
  for (auto& arg : options.extra_args) argv.push_back(arg);
  if (absl::Status s = server->Launch(argv, options.rlimit_nofile); !s.ok()) return s;
  if (!options.wait_for_startup) return server;

  const absl::Time deadline = absl::Now() + options.startup_timeout;
  // The server announces its resolved endpoints on stdout: the first line
  // with "127.0.0.1:<port>" that mentions "metrics" is the exporter, the
  // first other one the gRPC TCP listener.
  if (options.tcp || options.metrics) {
    // WithOutput takes mu_ itself, so a failure is decorated after unlocking.
    absl::Status announced = absl::OkStatus();
    {
      absl::MutexLock lock(&server->mu_);
      size_t seen = 0;
      while (true) {
        for (; seen < server->lines_.size(); ++seen) {
          const std::string& line = server->lines_[seen];
          const int port = LoopbackPort(line);
          if (port == 0) continue;
          if (line.find("metrics") != std::string::npos) {
            server->metrics_port_ = port;
          } else if (server->tcp_target_.empty()) {
            server->tcp_target_ = absl::StrCat("127.0.0.1:", port);
          }
        }
        const bool done = (!options.tcp || !server->tcp_target_.empty()) &&
                          (!options.metrics || server->metrics_port_ != 0);
        if (done) break;
        if (server->eof_) {
          announced = absl::InternalError("tokensel-server exited during startup");
          break;
        }
        struct Waiter {
          const ServerProcess* server;
          size_t seen;
          bool Ready() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return server->lines_.size() > seen || server->eof_;
          }
        } waiter{server.get(), seen};
        if (!server->mu_.AwaitWithDeadline(absl::Condition(&waiter, &Waiter::Ready), deadline)) {
          announced = absl::DeadlineExceededError("tokensel-server did not announce its ports");
          break;
        }
      }
    }
    if (!announced.ok()) return server->WithOutput(announced);
  }
  if (absl::Status s = server->WaitForServing(deadline - absl::Now()); !s.ok()) {
    return server->WithOutput(s);
  }
  return server;
}

absl::Status ServerProcess::Launch(const std::vector<std::string>& argv,
                                   std::optional<uint64_t> nofile) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return ErrnoError("pipe2");
  // Everything the child needs is prepared before fork: after it only
  // async-signal-safe calls.
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return ErrnoError("fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    if (nofile.has_value()) {
      const rlimit limit{static_cast<rlim_t>(*nofile), static_cast<rlim_t>(*nofile)};
      if (setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(126);
    }
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(fds[1]);
  pid_ = pid;
  const int read_fd = fds[0];
  reader_ = std::thread([this, read_fd] { ReadLoop(read_fd); });
  return absl::OkStatus();
}

void ServerProcess::ReadLoop(int fd) {
  char buf[4096];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (echo_) std::cerr.write(buf, n);
    absl::MutexLock lock(&mu_);
    partial_.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = partial_.find('\n')) != std::string::npos) {
      lines_.push_back(partial_.substr(0, nl));
      partial_.erase(0, nl + 1);
    }
  }
  close(fd);
  absl::MutexLock lock(&mu_);
  if (!partial_.empty()) lines_.push_back(std::move(partial_));
  partial_.clear();
  eof_ = true;
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !exit_status_.has_value()) {
    kill(pid_, SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (reader_.joinable()) reader_.join();
  if (!temp_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(temp_dir_, ec);
  }
}

std::shared_ptr<grpc::Channel> ServerProcess::UnixChannel(int max_message_bytes) const {
  return MakeChannel(unix_target_, max_message_bytes);
}

std::shared_ptr<grpc::Channel> ServerProcess::TcpChannel(int max_message_bytes) const {
  return MakeChannel(tcp_target_, max_message_bytes);
}

absl::Status ServerProcess::WaitForServing(absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  auto stub = grpc::health::v1::Health::NewStub(UnixChannel());
  std::string last = "no attempt";
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(2))));
    ctx.set_wait_for_ready(true);
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    const grpc::Status s = stub->Check(&ctx, request, &response);
    if (s.ok() && response.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return absl::OkStatus();
    }
    last = s.ok() ? absl::StrCat("status ", response.status())
                  : absl::StrCat("rpc error ", s.error_code(), ": ", s.error_message());
    {
      absl::MutexLock lock(&mu_);
      if (eof_) return absl::InternalError("tokensel-server exited before SERVING");
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("health never SERVING; last: ", last));
}

absl::Status ServerProcess::Signal(int signo) const {
  if (pid_ <= 0 || exit_status_.has_value()) return absl::FailedPreconditionError("not running");
  if (kill(pid_, signo) != 0) return ErrnoError("kill");
  return absl::OkStatus();
}

absl::StatusOr<int> ServerProcess::WaitForExit(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!exit_status_.has_value()) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_status_ = status;
      break;
    }
    if (r < 0 && errno != EINTR) return ErrnoError("waitpid");
    if (absl::Now() >= deadline) {
      return WithOutput(absl::DeadlineExceededError("tokensel-server still running"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (reader_.joinable()) reader_.join();
  const int status = *exit_status_;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WithOutput(
      absl::InternalError(absl::StrCat("tokensel-server killed by signal ", WTERMSIG(status))));
}

std::string ServerProcess::Output() const {
  absl::MutexLock lock(&mu_);
  std::string out = absl::StrJoin(lines_, "\n");
  if (!partial_.empty()) absl::StrAppend(&out, "\n", partial_);
  return out;
}

bool ServerProcess::WaitForOutput(absl::string_view text, absl::Duration timeout) const {
  struct Waiter {
    const ServerProcess* server;
    std::string text;
    bool Found() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
      if (server->partial_.find(text) != std::string::npos) return true;
      for (const std::string& line : server->lines_) {
        if (line.find(text) != std::string::npos) return true;
      }
      return false;
    }
    bool Ready() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return server->eof_ || Found(); }
  } waiter{this, std::string(text)};
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&waiter, &Waiter::Ready), timeout);
  return waiter.Found();
}

absl::Status ServerProcess::WithOutput(absl::Status status) const {
  return absl::Status(status.code(), absl::StrCat(status.message(), "\n--- server output ---\n",
                                                  Output(), "\n---"));
}

}  // namespace tokensel::testing
