// tokensel_rpc_bench: RPC latency of a real tokensel-server (spawned with
// tests/testing/server_process.h). For the unix socket and loopback TCP, with
// 1 and 8 concurrent clients (each its own channel), measures p50/p99 of
//   null:   Ping (no session work, no op)
//   gather: GatherTokens B=1, S=128, R=16, C=64, fp32; on the unix socket by
//           buffer reference (a registered memfd), over TCP inline (32 KiB in,
//           4 KiB out: a TCP session cannot be handed memory, so remote
//           clients always send tensors inline)
// with a fixed request count per config, and prints a table plus the ratio
// gather_p50 / null_p50 (target <= 1.3 by reference). Not a test: it asserts
// nothing.
//
//   tokensel_rpc_bench [--requests=N] [--warmup=N] [server flags after "--"]
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "tests/server/integration/client_util.h"
#include "tests/testing/server_process.h"
#include "tests/testing/shm_region.h"

namespace tokensel::itest {
namespace {

using Stub = v1::TokenSelect::Stub;

constexpr int64_t kB = 1, kS = 128, kR = 16, kC = 64;
constexpr int kMaxClients = 8;

struct Config {
  std::string transport;
  int clients;
};

struct Result {
  double p50_us = 0, p99_us = 0;
  int errors = 0;
};

double Percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(k), v.end());
  return v[k];
}

// Runs `requests` calls per client thread (after `warmup` unmeasured ones)
// and returns the latency percentiles over all threads' calls.
Result Run(const testing::ServerProcess& server, const Config& config, bool gather,
           const std::string& session, const std::vector<v1::GatherTokensRequest>& gathers,
           int requests, int warmup) {
  std::vector<std::vector<double>> lat(config.clients);
  std::vector<int> errors(config.clients, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < config.clients; ++t) {
    threads.emplace_back([&, t] {
      Client client(config.transport == "unix" ? server.UnixChannel() : server.TcpChannel());
      client.set_session(session);
      lat[t].reserve(requests);
      v1::PingRequest ping;
      v1::PingResponse pong;
      v1::OpResponse resp;
      for (int i = 0; i < warmup + requests; ++i) {
        const absl::Time start = absl::Now();
        const absl::Status s = gather ? client.Call(&Stub::GatherTokens, gathers[t], &resp)
                                      : client.Call(&Stub::Ping, ping, &pong);
        const double us = absl::ToDoubleMicroseconds(absl::Now() - start);
        if (!s.ok()) {
          if (errors[t]++ == 0) std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
          continue;
        }
        if (i >= warmup) lat[t].push_back(us);
      }
    });
  }
  for (auto& th : threads) th.join();
  std::vector<double> all;
  Result r;
  for (int t = 0; t < config.clients; ++t) {
    all.insert(all.end(), lat[t].begin(), lat[t].end());
    r.errors += errors[t];
  }
  r.p50_us = Percentile(all, 0.50);
  r.p99_us = Percentile(all, 0.99);
  return r;
}

int Main(int argc, char** argv) {
  int requests = 5000;
  int warmup = 500;
  testing::ServerOptions options;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") {
      for (++i; i < argc; ++i) options.extra_args.emplace_back(argv[i]);
    } else if (absl::ConsumePrefix(&arg, "--requests=")) {
      if (!absl::SimpleAtoi(arg, &requests) || requests <= 0) return 2;
    } else if (absl::ConsumePrefix(&arg, "--warmup=")) {
      if (!absl::SimpleAtoi(arg, &warmup) || warmup < 0) return 2;
    } else {
      std::fprintf(stderr, "usage: %s [--requests=N] [--warmup=N] [-- server flags]\n", argv[0]);
      return 2;
    }
  }
  options.extra_args.push_back("--log_level=warning");
  auto server = testing::ServerProcess::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  const uint64_t shm_bytes = 1 << 20;
  auto shm = testing::TestShm::Create((*server)->shm_prefix() + "bench", shm_bytes);
  if (!shm.ok()) {
    std::fprintf(stderr, "%s\n", shm.status().ToString().c_str());
    return 1;
  }
  std::mt19937_64 rng(1);
  FillBytes(shm->data(), shm->size(), rng);
  Client setup((*server)->UnixChannel());
  setup.set_fd_channel((*server)->fd_channel_path());
  if (absl::Status s = setup.Open(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  if (auto r = setup.Register("bench", shm->name(), 0, shm->size()); !r.ok()) {
    std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
    return 1;
  }
  Arena arena(shm_bytes);
  const Placed act = arena.Place(DType::kFloat32, {kB, kS, kC});
  const Placed idx = arena.Place(DType::kInt32, {kB, kR});
  FillIndices(idx.View(shm->data()), kS, false, rng);
  std::vector<v1::GatherTokensRequest> gathers(kMaxClients);
  for (int t = 0; t < kMaxClients; ++t) {  // each client its own output rows
    const Placed out = arena.Place(DType::kFloat32, {kB, kR, kC});
    *gathers[t].mutable_activations() = act.Ref("bench");
    *gathers[t].mutable_indices() = idx.Ref("bench");
    *gathers[t].mutable_out() = out.Ref("bench");
    gathers[t].set_batch_first(true);
  }
  // Over TCP: its own session, tensors inline.
  Client tcp_setup((*server)->TcpChannel());
  if (absl::Status s = tcp_setup.Open(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  v1::GatherTokensRequest inline_gather;
  *inline_gather.mutable_activations() =
      InlineTensor(DType::kFloat32, {kB, kS, kC}, act.PackedBytes(shm->data()));
  *inline_gather.mutable_indices() =
      InlineTensor(DType::kInt32, {kB, kR}, idx.PackedBytes(shm->data()));
  inline_gather.set_batch_first(true);
  const std::vector<v1::GatherTokensRequest> inline_gathers(kMaxClients, inline_gather);

  std::printf(
      "tokensel_rpc_bench: %d requests per config (split over its clients), %d warmup "
      "per client; GatherTokens B=%lld S=%lld R=%lld C=%lld fp32 by buffer reference "
      "(unix), inline (tcp); %u hardware threads\n",
      requests, warmup, static_cast<long long>(kB), static_cast<long long>(kS),
      static_cast<long long>(kR), static_cast<long long>(kC), std::thread::hardware_concurrency());
  std::printf("%-9s %7s %-7s %10s %10s %7s\n", "transport", "clients", "rpc", "p50 us", "p99 us",
              "errors");
  struct Ratio {
    Config config;
    double ratio;
  };
  std::vector<Ratio> ratios;
  int total_errors = 0;
  for (const Config& config :
       {Config{"unix", 1}, Config{"unix", 8}, Config{"tcp", 1}, Config{"tcp", 8}}) {
    const int per_client = std::max(1, requests / config.clients);
    const bool tcp = config.transport == "tcp";
    const std::string& session = tcp ? tcp_setup.session() : setup.session();
    const auto& requests_of = tcp ? inline_gathers : gathers;
    const Result null_rpc = Run(**server, config, false, session, requests_of, per_client, warmup);
    const Result gather = Run(**server, config, true, session, requests_of, per_client, warmup);
    for (const auto& [name, r] : {std::pair<const char*, Result>{"null", null_rpc},
                                  std::pair<const char*, Result>{"gather", gather}}) {
      std::printf("%-9s %7d %-7s %10.1f %10.1f %7d\n", config.transport.c_str(), config.clients,
                  name, r.p50_us, r.p99_us, r.errors);
      total_errors += r.errors;
    }
    ratios.push_back({config, null_rpc.p50_us > 0 ? gather.p50_us / null_rpc.p50_us : 0});
  }
  std::printf("\ngather_p50 / null_p50 (target <= 1.3 by reference)\n");
  for (const Ratio& r : ratios) {
    const bool by_reference = r.config.transport == "unix";
    std::printf("%-9s %7d %8.2f %s\n", r.config.transport.c_str(), r.config.clients, r.ratio,
                !by_reference    ? "(inline)"
                : r.ratio <= 1.3 ? "ok"
                                 : "ABOVE TARGET");
  }
  (*server)->Signal(SIGTERM).IgnoreError();
  (void)(*server)->WaitForExit(absl::Seconds(15));
  return total_errors == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tokensel::itest

int main(int argc, char** argv) { return tokensel::itest::Main(argc, argv); }
