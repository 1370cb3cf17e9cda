// LaunchedServer: `tokensel demo` runs its own tokensel-server child on a
// private unix socket (the embedded default: --backend=auto).
//
//   ASSIGN_OR_RETURN(auto server, LaunchedServer::Start({.binary = path}));
//   Connect(server->target(), ...);   server->metrics_url();
//   RETURN_IF_ERROR(server->Stop());  // SIGTERM, expects exit code 0
//
// Start() makes a temp directory for the socket, runs
//   <binary> --listen=unix://<dir>/tokensel.sock --metrics_address=<metrics_address>
//            --shm_prefix=<shm_prefix>
// as a tokensel::Subprocess (common/subprocess.h) with stdout/stderr on one
// pipe (the last lines kept for error reports), waits for the
// "metrics on http://..." announcement (when metrics are on) and for
// grpc.health.v1 SERVING, all within `startup_timeout`. The child gets
// PR_SET_PDEATHSIG=SIGKILL, so it never outlives the CLI. The destructor
// stops a still-running child (SIGTERM, then SIGKILL after 10 s) and removes
// the directory.
#ifndef TOKENSEL_CLIENT_CLI_SERVER_LAUNCHER_H_
#define TOKENSEL_CLIENT_CLI_SERVER_LAUNCHER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/subprocess.h"

namespace tokensel::cli {

struct LaunchOptions {
  std::string binary;
  std::string metrics_address = "127.0.0.1:0";  // empty = no metrics
  std::string shm_prefix;                       // required
  absl::Duration startup_timeout = absl::Seconds(30);
};

// The tokensel-server to run: `flag_value` if set; else "tokensel-server"
// next to this executable, or in ../../server/ (the build tree layout:
// build/<preset>/client/cli/tokensel). NOT_FOUND listing the places tried.
absl::StatusOr<std::string> FindServerBinary(const std::string& flag_value);

class LaunchedServer {
 public:
  static absl::StatusOr<std::unique_ptr<LaunchedServer>> Start(const LaunchOptions& options);
  ~LaunchedServer();
  LaunchedServer(const LaunchedServer&) = delete;
  LaunchedServer& operator=(const LaunchedServer&) = delete;

  // "unix:///tmp/tokensel-demo-XXXXXX/tokensel.sock".
  const std::string& target() const { return target_; }
  // "http://127.0.0.1:<port>/metrics", or "" without metrics.
  const std::string& metrics_url() const { return metrics_url_; }
  // SIGTERM and wait (10 s); INTERNAL with the output tail unless exit 0.
  absl::Status Stop();
  // The last `max_lines` lines the server printed.
  std::string OutputTail(size_t max_lines = 20) const;

 private:
  LaunchedServer() = default;
  absl::Status WithOutput(const absl::Status& status) const;

  std::string dir_;
  std::string target_;
  std::string metrics_url_;
  std::unique_ptr<Subprocess> process_;
};

}  // namespace tokensel::cli

#endif  // TOKENSEL_CLIENT_CLI_SERVER_LAUNCHER_H_
