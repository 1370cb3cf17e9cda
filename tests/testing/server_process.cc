#include "tests/testing/server_process.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

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
  char dir_template[] = "/tmp/tokensel-it-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return ErrnoError("mkdtemp");
  server->temp_dir_ = dir_template;
  server->unix_target_ = absl::StrCat("unix://", server->temp_dir_, "/tokensel.sock");
  if (options.socket_group.has_value()) {
    if (chown(dir_template, geteuid(), *options.socket_group) != 0) return ErrnoError("chown");
    if (chmod(dir_template, 0750) != 0) return ErrnoError("chmod");
  }
  server->shm_prefix_ = options.shm_prefix.empty() ? DefaultShmPrefix() : options.shm_prefix;

  std::vector<std::string> argv;
  if (!options.env.empty()) {  // env execs the server: same process, same pid
    argv.push_back("/usr/bin/env");
    for (const std::string& var : options.env) argv.push_back(var);
  }
  argv.push_back(TOKENSEL_SERVER_BINARY);
  argv.push_back(absl::StrCat("--listen=", server->unix_target_));
  if (options.tcp) argv.push_back("--listen=127.0.0.1:0");
  if (options.tcp && options.insecure_tcp) argv.push_back("--insecure_tcp");
  argv.push_back(absl::StrCat("--metrics_address=", options.metrics ? "127.0.0.1:0" : ""));
  argv.push_back(absl::StrCat("--shm_prefix=", server->shm_prefix_));
  if (options.socket_group.has_value()) {
    argv.push_back(absl::StrCat("--unix_socket_group=", *options.socket_group));
  }
  for (auto& arg : options.extra_args) argv.push_back(arg);
  const char* echo = std::getenv("TOKENSEL_TEST_SERVER_LOG");
  absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Spawn({
      .argv = std::move(argv),
      .name = "tokensel-server",
      .merge_stderr = true,
      .echo_output = echo != nullptr && echo[0] == '1',
      .rlimit_nofile = options.rlimit_nofile,
  });
  if (!process.ok()) return process.status();
  server->process_ = *std::move(process);
  if (!options.wait_for_startup) return server;

  const absl::Time deadline = absl::Now() + options.startup_timeout;
  // The server announces its resolved endpoints on stdout: the first line
  // with "127.0.0.1:<port>" that mentions "metrics" is the exporter, the
  // first other one the gRPC TCP listener.
  if (options.tcp || options.metrics) {
    ServerProcess* s = server.get();
    size_t seen = 0;
    const bool announced = s->process_->AwaitOutput(
        [&](const Subprocess::OutputView& out) {
          for (; seen < out.lines.size(); ++seen) {
            const std::string& line = out.lines[seen];
            const int port = LoopbackPort(line);
            if (port == 0) continue;
            if (line.find("metrics") != std::string::npos) {
              s->metrics_port_ = port;
            } else if (s->tcp_target_.empty()) {
              s->tcp_target_ = absl::StrCat("127.0.0.1:", port);
            }
          }
          return (!options.tcp || !s->tcp_target_.empty()) &&
                 (!options.metrics || s->metrics_port_ != 0);
        },
        deadline);
    if (!announced) {
      return server->WithOutput(
          server->process_->output_ended()
              ? absl::InternalError("tokensel-server exited during startup")
              : absl::DeadlineExceededError("tokensel-server did not announce its ports"));
    }
  }
  if (absl::Status s = server->WaitForServing(deadline - absl::Now()); !s.ok()) {
    return server->WithOutput(s);
  }
  return server;
}

ServerProcess::~ServerProcess() {
  process_.reset();  // SIGKILLs a running server and reaps it
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
    if (process_->output_ended()) {
      return absl::InternalError("tokensel-server exited before SERVING");
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("health never SERVING; last: ", last));
}

absl::Status ServerProcess::Signal(int signo) const {
  if (process_->reaped()) return absl::FailedPreconditionError("not running");
  return process_->Signal(signo);
}

absl::StatusOr<int> ServerProcess::WaitForExit(absl::Duration timeout) {
  absl::StatusOr<int> code = process_->WaitForExitCode(absl::Now() + timeout);
  if (process_->reaped()) {  // its output is complete once the pipe ends
    process_->AwaitOutput([](const Subprocess::OutputView& out) { return out.ended; },
                          absl::InfiniteFuture());
  }
  if (!code.ok()) return WithOutput(code.status());
  return code;
}

std::string ServerProcess::Output() const { return process_->Output(); }

bool ServerProcess::WaitForOutput(absl::string_view text, absl::Duration timeout) const {
  return process_->AwaitOutput(
      [text](const Subprocess::OutputView& out) {
        if (out.partial.find(text) != absl::string_view::npos) return true;
        for (const std::string& line : out.lines) {
          if (absl::string_view(line).find(text) != absl::string_view::npos) return true;
        }
        return false;
      },
      absl::Now() + timeout);
}

absl::Status ServerProcess::WithOutput(absl::Status status) const {
  return absl::Status(status.code(), absl::StrCat(status.message(), "\n--- server output ---\n",
                                                  Output(), "\n---"));
}

}  // namespace tokensel::testing
