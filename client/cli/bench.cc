// `tokensel bench`: a load generator for local or remote tokensel servers.
//
// Workers (--concurrency threads, each with its own connection and
// Workload) cycle through the op mix. Closed loop: each worker sends its
// next request when the previous one answered. Open loop (--rate): worker w
// sends its k-th request at start + (k * concurrency + w) / rate and the
// latency is measured from that scheduled time (queueing included, so a
// server that falls behind shows it). --requests splits a total count over
// the workers; otherwise the phase lasts --duration. --baseline first runs
// the same phase with Ping only.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/bench_report.h"
#include "client/cli/bench_workload.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "client/cli/op_util.h"
#include "common/status_macros.h"

ABSL_DECLARE_FLAG(bool, json);
ABSL_FLAG(std::string, op, "gather",
          "op to run: ping gather scatter sort seqlens topk sample merge split packed");
ABSL_FLAG(std::string, mix, "", "weighted op mix, e.g. gather:3,sort:1 (overrides --op)");
ABSL_FLAG(int64_t, channels, 768, "C, channels per token (gather, scatter)");
ABSL_FLAG(std::string, dtype, "float16", "activation dtype (gather, scatter)");
ABSL_FLAG(int64_t, segments, 16, "NS, segments per row (seqlens)");
ABSL_FLAG(int32_t, concurrency, 4, "concurrent workers, each with its own connection");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(10), "length of the measured phase");
ABSL_FLAG(int64_t, requests, 0, "total measured requests (> 0 overrides --duration)");
ABSL_FLAG(double, rate, 0, "open loop: total requests per second (0 = closed loop)");
ABSL_FLAG(std::optional<bool>, by_reference, std::nullopt,
          "tensors in registered shm (true) or inline (false); default: true for unix:// "
          "targets, false for TCP");
ABSL_FLAG(int32_t, warmup, 5, "unmeasured requests per worker before each phase");
ABSL_FLAG(bool, baseline, false,
          "also run a Ping phase (same concurrency and length) and print op_p50 / ping_p50");

namespace tokensel::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Progress {
  std::atomic<int64_t> done{0};
  std::atomic<int64_t> errors{0};
};

// Runs one phase of `sequence` on every worker; returns the merged result.
absl::StatusOr<PhaseResult> RunPhase(const std::vector<client::Client>& clients,
                                     const std::vector<std::unique_ptr<Workload>>& workloads,
                                     const std::vector<BenchOp>& sequence, const std::string& label,
                                     bool show_progress) {
  const int n = static_cast<int>(clients.size());
  const int64_t requests = absl::GetFlag(FLAGS_requests);
  const double rate = absl::GetFlag(FLAGS_rate);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const auto duration = absl::ToChronoNanoseconds(absl::GetFlag(FLAGS_duration));

  // Warm up (connections, server paths) before the clock starts.
  for (int w = 0; w < n; ++w) {
    for (int i = 0; i < warmup; ++i)
      (void)workloads[w]->Run(sequence[i % sequence.size()], clients[w]);
  }
  std::vector<PhaseResult> per_worker(n);
  Progress progress;
  std::atomic<bool> finished{false};
  const Clock::time_point start = Clock::now();
  const Clock::time_point end = start + duration;
  std::vector<std::thread> threads;
  for (int w = 0; w < n; ++w) {
    threads.emplace_back([&, w] {
      const int64_t quota = requests > 0 ? requests / n + (w < requests % n ? 1 : 0) : -1;
      for (int64_t k = 0; quota < 0 || k < quota; ++k) {
        Clock::time_point sent = Clock::now();
        if (rate > 0) {
          const double at = (static_cast<double>(k) * n + w) / rate;
          sent = start +
                 std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at));
          if (quota < 0 && sent >= end) break;
          std::this_thread::sleep_until(sent);
        } else if (quota < 0 && sent >= end) {
          break;
        }
        const BenchOp op = sequence[static_cast<size_t>(k) % sequence.size()];
        const absl::Status s = workloads[w]->Run(op, clients[w]);
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - sent).count();
        OpResult& r = per_worker[w].ops[op];
        if (s.ok()) {
          r.latency_us.Add(us);
          r.bytes += workloads[w]->bytes(op);
        } else {
          ++r.errors[std::string(absl::StatusCodeToString(s.code()))];
          if (progress.errors.fetch_add(1) == 0) {
            std::fprintf(stderr, "\ntokensel bench: first error (%s): %s\n",
                         std::string(BenchOpName(op)).c_str(), s.ToString().c_str());
          }
        }
        progress.done.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  std::thread reporter;
  if (show_progress) {
    reporter = std::thread([&] {
      int64_t last = 0;
      int tick = 0;
      while (!finished.load()) {
        for (int i = 0; i < 20 && !finished.load(); ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (finished.load()) break;
        const int64_t done = progress.done.load();
        std::printf("\r\033[K[%s %3ds] %lld ops  %lld ops/s  %lld errors", label.c_str(), ++tick,
                    static_cast<long long>(done), static_cast<long long>(done - last),
                    static_cast<long long>(progress.errors.load()));
        std::fflush(stdout);
        last = done;
      }
    });
  }
  for (auto& t : threads) t.join();
  PhaseResult result;
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  finished.store(true);
  if (reporter.joinable()) {
    reporter.join();
    std::printf("\r\033[K");
    std::fflush(stdout);
  }
  for (const PhaseResult& p : per_worker) {
    for (const auto& [op, r] : p.ops) result.ops[op].Merge(r);
  }
  return result;
}

absl::Status Bench(int* exit_code) {
  BenchConfig config;
  config.target = TargetFlag();
  config.concurrency = absl::GetFlag(FLAGS_concurrency);
  config.rate = absl::GetFlag(FLAGS_rate);
  config.mix =
      absl::GetFlag(FLAGS_mix).empty() ? absl::GetFlag(FLAGS_op) : absl::GetFlag(FLAGS_mix);
  config.by_reference = absl::GetFlag(FLAGS_by_reference).value_or(IsUnixTarget(config.target));
  BenchShapes& sh = config.shapes;
  if (BatchFlag() > 0) sh.batch = BatchFlag();
  if (OriginalTokensFlag() > 0) sh.seq = OriginalTokensFlag();
  sh.retained = RetainedTokensFlag() > 0 ? RetainedTokensFlag() : sh.seq / 2;
  if (LayersFlag() > 0) sh.layers = LayersFlag();
  sh.channels = absl::GetFlag(FLAGS_channels);
  sh.segments = absl::GetFlag(FLAGS_segments);
  ASSIGN_OR_RETURN(sh.dtype, kernels::ParseDType(absl::GetFlag(FLAGS_dtype)));
  if (config.concurrency < 1 || config.concurrency > 1024) {
    return absl::InvalidArgumentError("--concurrency must be in [1, 1024]");
  }
  if (config.rate < 0) return absl::InvalidArgumentError("--rate must be >= 0");
  if (absl::GetFlag(FLAGS_requests) <= 0 && absl::GetFlag(FLAGS_duration) <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("give --requests > 0 or --duration > 0");
  }
  ASSIGN_OR_RETURN(std::vector<BenchOp> sequence, ParseMix(config.mix));

  ASSIGN_OR_RETURN(client::Client base, ConnectFromFlags());
  ASSIGN_OR_RETURN(v1::ServerInfo info, base.GetServerInfo());
  ASSIGN_OR_RETURN(std::unique_ptr<client::Session> session, OpenSession(base, "tokensel-bench"));
  std::vector<client::Client> clients;
  std::vector<std::unique_ptr<Workload>> workloads;
  for (int w = 0; w < config.concurrency; ++w) {
    ASSIGN_OR_RETURN(client::Client c, Connect(config.target, TimeoutFlag()));
    clients.push_back(c.WithSession(session->id()));
    ASSIGN_OR_RETURN(
        std::unique_ptr<Workload> workload,
        Workload::Create(sequence, sh, w, SeedFlag(), config.by_reference, session.get()));
    workloads.push_back(std::move(workload));
  }
  const bool json = absl::GetFlag(FLAGS_json);
  const bool progress = !json && isatty(STDOUT_FILENO) == 1;
  std::optional<PhaseResult> baseline;
  if (absl::GetFlag(FLAGS_baseline)) {
    ASSIGN_OR_RETURN(baseline, RunPhase(clients, workloads, {BenchOp::kPing}, "ping", progress));
  }
  ASSIGN_OR_RETURN(PhaseResult result, RunPhase(clients, workloads, sequence, "bench", progress));
  std::printf("%s\n", json ? FormatJson(config, result, baseline).c_str()
                           : FormatText(config, result, baseline).c_str());
  const bool errors = result.Total().error_count() > 0 ||
                      (baseline.has_value() && baseline->Total().error_count() > 0);
  *exit_code = errors ? kExitFailure : kExitOk;
  return absl::OkStatus();
}

int RunBench() {
  int exit_code = kExitOk;
  const absl::Status s = Bench(&exit_code);
  if (!s.ok()) return Fail("bench", s);
  return exit_code;
}

}  // namespace

const Command kBenchCommand = {
    "bench", "load generator: op mix, concurrency, open/closed loop, latency percentiles",
    "Runs requests against --server and reports per op: count, ops/s, latency\n"
    "p50/p90/p99/p999/max (us), MB/s of tensor data, errors by status code.\n"
    "Tensors live in registered shared memory (--by_reference, the default for unix\n"
    "sockets) or travel inline. Exit 1 if any request failed.\n"
    "  tokensel bench --mix=gather:3,sort:1 --concurrency=8 --duration=10s --baseline\n"
    "  tokensel bench --server=10.0.0.5:50051 --op=topk --rate=2000 --requests=20000 --json",
    ConnectionFlags({"json", "op", "mix", "batch", "original_tokens", "retained_tokens", "channels",
                     "dtype", "layers", "segments", "seed", "concurrency", "duration", "requests",
                     "rate", "by_reference", "warmup", "baseline"}),
    &RunBench};

}  // namespace tokensel::cli
