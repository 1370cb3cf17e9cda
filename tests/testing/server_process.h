// ServerProcess: runs `tokensel-server` as a real child process for
// integration tests and benchmarks.
//
//   ASSIGN_OR_RETURN(auto server, ServerProcess::Start({.extra_args = {"--max_buffers=2"}}));
//   auto channel = server->UnixChannel();      // or TcpChannel()
//   ... RPCs ...
//   server->Signal(SIGTERM);
//   absl::StatusOr<int> code = server->WaitForExit(absl::Seconds(10));  // exit code
//
// Start() creates a private temp directory holding the unix socket, runs the
// server with
//   --listen=unix://<dir>/tokensel.sock --listen=127.0.0.1:0 --insecure_tcp
//   --metrics_address=127.0.0.1:0 --shm_prefix=<prefix> (+ extra_args)
// (--insecure_tcp only with options.tcp and options.insecure_tcp: tests of
// TLS and tokens turn it off and pass --tls_cert etc. in extra_args)
// reads its stdout/stderr (merged into one pipe, drained by a reader thread
// for the process' whole life) for the lines announcing the resolved TCP and
// metrics ports, and waits until grpc.health.v1.Health/Check says SERVING.
// Every failure comes back as a Status carrying the server's output so far.
//
// The process is a tokensel::Subprocess (common/subprocess.h); the child gets
// PR_SET_PDEATHSIG=SIGKILL: it dies with the thread that started it, so call Start() from a thread
// that outlives the server (the test's main thread). The destructor SIGKILLs a still-running child,
// reaps it and removes the temp directory.
//
// The binary is TOKENSEL_SERVER_BINARY (a compile definition set by CMake to
// $<TARGET_FILE:tokensel-server>). Set TOKENSEL_TEST_SERVER_LOG=1 to echo the
// server's output to this process' stderr as it arrives.
//
// Thread-safety: Signal, Output and the channel factories may be called from
// any thread; Start/WaitForExit/destruction from one thread.
#ifndef TOKENSEL_TESTS_TESTING_SERVER_PROCESS_H_
#define TOKENSEL_TESTS_TESTING_SERVER_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "grpcpp/channel.h"

namespace tokensel::testing {

struct ServerOptions {
  // Appended after the standard flags (later flags win for scalar flags).
  std::vector<std::string> extra_args;
  // Also listen on 127.0.0.1:<ephemeral> (loopback only).
  bool tcp = true;
  // With `tcp`: pass --insecure_tcp (plaintext TCP, no token), which every
  // test that does not exercise TCP security relies on.
  bool insecure_tcp = true;
  // false: Start returns as soon as the process runs, without waiting for
  // its ports or SERVING (tcp_target() and metrics_port() stay empty); for
  // servers expected to refuse to start (see WaitForExit and Output).
  bool wait_for_startup = true;
  // Export metrics on 127.0.0.1:<ephemeral>.
  bool metrics = true;
  // Names passed to --shm_prefix; empty = DefaultShmPrefix().
  std::string shm_prefix;
  // Let other users in: the socket directory becomes <euid>:<group> 0750
  // and the server gets --unix_socket_group=<group> (members may connect).
  std::optional<gid_t> socket_group;
  absl::Duration startup_timeout = absl::Seconds(30);
  // RLIMIT_NOFILE (soft = hard) set in the child before exec; nullopt = inherit.
  std::optional<uint64_t> rlimit_nofile;
  // "NAME=value" set in the server's environment (run through /usr/bin/env),
  // e.g. CUDA_VISIBLE_DEVICES; empty = the test's environment as is.
  std::vector<std::string> env;
};

class ServerProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(ServerOptions options = {});
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  pid_t pid() const { return process_->pid(); }
  // "unix:///tmp/tokensel-it-XXXXXX/tokensel.sock".
  const std::string& unix_target() const { return unix_target_; }
  // Its fd channel: the socket path + ".fd".
  std::string fd_channel_path() const { return unix_target_.substr(7) + ".fd"; }
  // The private temp directory (mode 0700, removed by the destructor).
  const std::string& temp_dir() const { return temp_dir_; }
  // "127.0.0.1:<port>"; empty without options.tcp (or wait_for_startup).
  const std::string& tcp_target() const { return tcp_target_; }
  // 0 without options.metrics.
  int metrics_port() const { return metrics_port_; }
  const std::string& shm_prefix() const { return shm_prefix_; }

  // A fresh channel (its own connection) to the unix socket / the TCP port.
  // `max_message_bytes` raises the client's receive/send limits.
  std::shared_ptr<grpc::Channel> UnixChannel(int max_message_bytes = 64 << 20) const;
  std::shared_ptr<grpc::Channel> TcpChannel(int max_message_bytes = 64 << 20) const;

  // grpc.health.v1.Health/Check(service="") on the unix socket until SERVING.
  absl::Status WaitForServing(absl::Duration timeout) const;

  absl::Status Signal(int signo) const;
  // Waits for the child to exit. Returns its exit code, or INTERNAL naming
  // the signal that killed it; DEADLINE_EXCEEDED if still running.
  absl::StatusOr<int> WaitForExit(absl::Duration timeout);
  bool exited() const { return process_->reaped(); }

  // Everything the server printed so far (stdout and stderr merged).
  std::string Output() const;
  // Waits until Output() contains `text` (true) or the deadline passes or
  // the server's output ends without it (false).
  bool WaitForOutput(absl::string_view text, absl::Duration timeout) const;

 private:
  ServerProcess() = default;
  absl::Status WithOutput(absl::Status status) const;

  std::string temp_dir_;
  std::string unix_target_;
  std::string tcp_target_;
  int metrics_port_ = 0;
  std::string shm_prefix_;
  std::unique_ptr<Subprocess> process_;  // set by Start
};

// "/tokensel-it-<pid>-": unique per test process, so parallel tests never
// collide.
std::string DefaultShmPrefix();

// The value of `key` in a "key=value key2=value2" announcement line.
std::optional<std::string> FindField(absl::string_view line, absl::string_view key);

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_TESTING_SERVER_PROCESS_H_
