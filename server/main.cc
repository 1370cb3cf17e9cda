// tokensel-server: the token-selection sidecar. See docs and --help.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "server/app/server.h"

ABSL_FLAG(std::vector<std::string>, listen, {"unix:///run/tokensel/tokensel.sock"},
          "Address to serve gRPC on; repeat the flag (or separate with commas) for several. "
          "unix:///absolute/path for co-located workers: the directory is created (0750) if "
          "missing and must not be writable by others unless sticky; the socket gets mode "
          "0660 and --unix_socket_group; a stale socket of this user is replaced (non-root: "
          "use unix://$XDG_RUNTIME_DIR/tokensel.sock). host:port for TCP (needs --tls_cert, "
          "--tls_key and --auth_token_file, or --insecure_tcp; port 0 picks a free port, "
          "printed at startup).");
ABSL_FLAG(uint32_t, max_connections, 4096,
          "Most connections open at once (gRPC on every listener plus fd channel); a new one "
          "beyond it is closed at once. Lowered to what RLIMIT_NOFILE leaves room for (the "
          "soft limit is raised to the hard one at startup).");
ABSL_FLAG(uint32_t, max_connections_per_peer, 256,
          "Most connections one peer may hold open (a unix uid, a TCP client address); a new "
          "one beyond it is closed at once.");
ABSL_FLAG(std::string, metrics_address, "0.0.0.0:9464",
          "host:port of the Prometheus /metrics endpoint; empty disables it.");
ABSL_FLAG(std::string, backend, "auto",
          "Where operators run: auto (cuda when a GPU and the CUDA backend exist, else cpu), "
          "cpu, or cuda.");
ABSL_FLAG(int, threads, 0,
          "Op worker threads and CPU backend parallelism; 0 = hardware concurrency.");
ABSL_FLAG(uint64_t, max_message_bytes, uint64_t{64} << 20,
          "Largest gRPC message accepted or sent, in bytes (inline tensors count here); also "
          "bounds one op's inline outputs.");
ABSL_FLAG(absl::Duration, session_ttl, absl::Seconds(60),
          "Session lease when OpenSession asks for 0; idle sessions expire after their lease "
          "and their buffers are unregistered.");
ABSL_FLAG(std::string, shm_prefix, "/tokensel",
          "Name prefix GetServerInfo suggests for the shm objects clients create. Not a "
          "security boundary: memory is registered by file descriptor, so the server maps only "
          "what the caller could map itself.");
ABSL_FLAG(std::vector<std::string>, trusted_uids, {},
          "Deprecated and ignored (memory is registered by file descriptor; registration by "
          "shm name is refused).");
ABSL_FLAG(uint32_t, max_buffers, 1024, "Most buffers one session may register.");
ABSL_FLAG(uint32_t, max_buffers_total, 0,
          "Most buffers registered across all sessions (each is a memory map of the server); "
          "0 = min(16384, vm.max_map_count / 4).");
ABSL_FLAG(uint32_t, max_sessions_per_peer, 256,
          "Most open sessions of one peer (a unix uid, or a TCP address), so that no caller can "
          "take every --max_sessions slot.");
ABSL_FLAG(uint32_t, max_waits_per_session, 8,
          "Most Executes with a wait_event outstanding in one session: waiting on their event, "
          "or stuck (left waiting after the request gave up: each holds its stream, its memory "
          "within the budget, and keeps its device's deferred frees waiting until the event "
          "completes); beyond it such an Execute is RESOURCE_EXHAUSTED. 0 < this <= "
          "--max_waits_per_peer.");
ABSL_FLAG(uint32_t, max_waits_per_peer, 64,
          "The same, all the sessions of one peer (a unix uid, or a TCP address) together: the "
          "workers of one job usually share a uid. <= --max_waits. A peer's stuck Executes may "
          "hold this x --max_request_memory_bytes of the memory budget until their events "
          "complete: keep it below --memory_budget_bytes when peers distrust each other.");
ABSL_FLAG(uint32_t, max_waits, 256, "The same, in the whole server.");
ABSL_FLAG(uint64_t, memory_budget_bytes, 0,
          "Server memory that requests in flight may hold together (inline staging, kernel "
          "scratch, results); beyond it requests fail with RESOURCE_EXHAUSTED. 0 = a quarter of "
          "physical memory.");
ABSL_FLAG(uint64_t, max_request_memory_bytes, 0,
          "Server memory one request may hold (same accounting); 0 = min(memory budget, 1 GiB).");
ABSL_FLAG(uint32_t, max_inflight, 256,
          "Most requests in flight at once; beyond it requests fail fast with "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(uint32_t, max_sessions, 1024, "Most concurrent sessions (RESOURCE_EXHAUSTED beyond).");
ABSL_FLAG(uint64_t, max_op_elements, uint64_t{1} << 27,
          "Most work one op may ask for, in elements it reads or writes (core::EstimateOpWork: "
          "copies count what they copy, SampleTokens L*B*S, ...); beyond it RESOURCE_EXHAUSTED "
          "before anything runs. The default, 2^27, is about one second of the heaviest ops "
          "(SampleTokens, TopKTokens) on one core of a 2-core EPYC; raise it for larger ops on "
          "faster machines. 0 = no limit.");
ABSL_FLAG(std::string, unix_socket_group, "",
          "Group (name or gid) given to the unix socket files, whose mode is 0660: its members "
          "may connect. Empty = the server's group.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) for TLS on TCP listeners; needs --tls_key.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the bearer token TCP clients must send as 'authorization: Bearer "
          "<token>' (surrounding whitespace trimmed, >= 16 printable characters); needs TLS. "
          "Missing or malformed -> UNAUTHENTICATED, wrong -> PERMISSION_DENIED. Unix socket "
          "callers need no token (the socket's mode and group admit them).");
ABSL_FLAG(bool, insecure_tcp, false,
          "Allow TCP listeners without TLS and/or without a bearer token (logs a WARNING). "
          "Without it a TCP listener lacking --tls_cert/--tls_key/--auth_token_file refuses "
          "to start.");
ABSL_FLAG(std::string, log_level, "info",
          "Least severe log level shown: debug|info|warning|error.");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(10),
          "On SIGTERM/SIGINT: how long in-flight requests may take before they are cancelled.");

namespace {

// absl flags keep only the last occurrence of a flag; --listen is meant to
// repeat, so its occurrences are merged into one comma-separated value.
std::vector<std::string> MergeListenFlags(int argc, char** argv) {
  std::vector<std::string> args;
  std::vector<std::string> listen;
  for (int i = 0; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (i > 0 && (arg == "--listen" || arg == "-listen") && i + 1 < argc) {
      listen.emplace_back(argv[++i]);
    } else if (i > 0 && (absl::StartsWith(arg, "--listen=") || absl::StartsWith(arg, "-listen="))) {
      listen.emplace_back(arg.substr(arg.find('=') + 1));
    } else if (arg == "--") {
      for (; i < argc; ++i) args.emplace_back(argv[i]);
    } else {
      args.emplace_back(arg);
    }
  }
  if (!listen.empty()) args.push_back(absl::StrCat("--listen=", absl::StrJoin(listen, ",")));
  return args;
}

int Fail(const absl::Status& status) {
  TS_LOG(ERROR) << "tokensel-server: " << status;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "server/main.cc");
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  // "Flags from server/main.cc", not from the absolute path of the build's
  // source tree.
  usage_config.normalize_filename = [](absl::string_view path) {
    const size_t at = path.rfind("server/");
    return std::string(at == absl::string_view::npos ? path : path.substr(at));
  };
  absl::SetFlagsUsageConfig(usage_config);
  absl::SetProgramUsageMessage(
      "token selection (sort, gather, scatter, masks, THD seqlens) as a "
      "node-local gRPC service.\nUsage: tokensel-server "
      "[--listen=unix:///run/tokensel/tokensel.sock] "
      "[--listen=0.0.0.0:50051] [flags]");
  std::vector<std::string> merged = MergeListenFlags(argc, argv);
  std::vector<char*> merged_argv;
  merged_argv.reserve(merged.size());
  for (std::string& arg : merged) merged_argv.push_back(arg.data());
  absl::ParseCommandLine(static_cast<int>(merged_argv.size()), merged_argv.data());

  absl::StatusOr<tokensel::log::Level> level =
      tokensel::log::ParseLevel(absl::GetFlag(FLAGS_log_level));
  if (!level.ok()) return Fail(level.status());
  tokensel::log::SetMinLevel(*level);

  tokensel::server::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  options.backend = absl::GetFlag(FLAGS_backend);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.session_ttl = absl::GetFlag(FLAGS_session_ttl);
  options.shm_prefix = absl::GetFlag(FLAGS_shm_prefix);
  if (!absl::GetFlag(FLAGS_trusted_uids).empty()) {
    TS_LOG(WARNING) << "--trusted_uids is deprecated and ignored: clients register memory by "
                       "file descriptor, which proves their access";
  }
  options.unix_socket_group = absl::GetFlag(FLAGS_unix_socket_group);
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  options.insecure_tcp = absl::GetFlag(FLAGS_insecure_tcp);
  options.max_buffers = absl::GetFlag(FLAGS_max_buffers);
  options.max_buffers_total = absl::GetFlag(FLAGS_max_buffers_total);
  options.max_sessions_per_peer = absl::GetFlag(FLAGS_max_sessions_per_peer);
  options.max_waits_per_session = absl::GetFlag(FLAGS_max_waits_per_session);
  options.max_waits_per_peer = absl::GetFlag(FLAGS_max_waits_per_peer);
  options.max_waits = absl::GetFlag(FLAGS_max_waits);
  options.memory_budget_bytes = absl::GetFlag(FLAGS_memory_budget_bytes);
  options.max_request_memory_bytes = absl::GetFlag(FLAGS_max_request_memory_bytes);
  options.max_inflight = absl::GetFlag(FLAGS_max_inflight);
  options.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.max_op_elements = absl::GetFlag(FLAGS_max_op_elements);
  options.max_connections = absl::GetFlag(FLAGS_max_connections);
  options.max_connections_per_peer = absl::GetFlag(FLAGS_max_connections_per_peer);
  if (options.threads < 0) return Fail(absl::InvalidArgumentError("threads must be >= 0"));
  if (options.session_ttl <= absl::ZeroDuration()) {
    return Fail(absl::InvalidArgumentError("session_ttl must be positive"));
  }

  // Block the shutdown signals in every thread (the server's threads inherit
  // the mask) and take them synchronously below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  absl::StatusOr<std::unique_ptr<tokensel::server::Server>> server =
      tokensel::server::Server::Start(options);
  if (!server.ok()) return Fail(server.status());
  for (const std::string& address : (*server)->listen_addresses()) {
    std::printf("tokensel-server listening on %s (backend %s)\n", address.c_str(),
                std::string((*server)->backend_name()).c_str());
  }
  if (!(*server)->metrics_address().empty()) {
    std::printf("metrics on http://%s/metrics\n", (*server)->metrics_address().c_str());
  }
  std::fflush(stdout);

  int signal_number = 0;
  while (sigwait(&signals, &signal_number) != 0) {
  }
  TS_LOG(INFO) << "received signal " << signal_number << ", shutting down";
  (*server)->Shutdown(absl::GetFlag(FLAGS_shutdown_grace));
  server->reset();
  TS_LOG(INFO) << "tokensel-server stopped";
  return 0;
}
