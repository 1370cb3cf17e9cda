// `tokensel demo`: the main job. Starts a tokensel-server on the embedded
// default (or connects to --server) and plays a training worker
// (demo_model.h), checking every result against the CPU oracle.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "client/cli/demo_model.h"
#include "client/cli/op_util.h"
#include "client/cli/server_launcher.h"
#include "common/status_macros.h"

ABSL_FLAG(int64_t, steps, 3, "training steps per model (demo)");
ABSL_FLAG(std::string, server_binary, "",
          "tokensel-server to start (demo); default: next to this binary or in ../../server");
ABSL_FLAG(std::string, metrics_address, "127.0.0.1:0",
          "--metrics_address of the server the demo starts (empty = no metrics)");

namespace tokensel::cli {
namespace {

absl::Status Demo() {
  DemoShapes shapes;
  if (LayersFlag() > 0) shapes.layers = LayersFlag();
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  if (steps < 1) return absl::InvalidArgumentError("--steps must be >= 1");
  const uint64_t seed = SeedFlag() == 0 ? 20240611 : SeedFlag();

  std::unique_ptr<LaunchedServer> server;
  std::string target = TargetFlag();
  std::string metrics = "(not known for --server: the server prints it when it starts)";
  if (!FlagGiven("server")) {
    ASSIGN_OR_RETURN(std::string binary, FindServerBinary(absl::GetFlag(FLAGS_server_binary)));
    LaunchOptions options;
    options.binary = binary;
    options.metrics_address = absl::GetFlag(FLAGS_metrics_address);
    options.shm_prefix = absl::StrCat("/tokensel-demo-", getpid(), "-");
    ASSIGN_OR_RETURN(server, LaunchedServer::Start(options));
    target = server->target();
    metrics = server->metrics_url().empty() ? "(disabled)" : server->metrics_url();
    std::printf("started %s\n", binary.c_str());
  }
  ASSIGN_OR_RETURN(client::Client client, Connect(target, TimeoutFlag()));
  ASSIGN_OR_RETURN(v1::ServerInfo info, client.GetServerInfo());
  std::printf("server %s: tokensel %s, backend %s\n", target.c_str(), info.version().c_str(),
              info.backend().c_str());
  ASSIGN_OR_RETURN(std::unique_ptr<client::Session> session, OpenSession(client, "tokensel-demo"));
  ASSIGN_OR_RETURN(std::unique_ptr<DemoWorker> worker,
                   DemoWorker::Create(session.get(), shapes, seed));
  std::vector<int64_t> schedule;
  for (int64_t l = 0; l < shapes.layers; ++l)
    schedule.push_back(RetainedTokens(l, shapes.layers, shapes.seq));
  std::printf(
      "models: BERT-style (bert_mask) and GPT-style (gpt_mask), %lld layers, B=%lld S=%lld "
      "C=%lld float16 in shared memory, %lld step(s), seed %llu\n"
      "retained tokens per layer: %s\n"
      "thd batch: B=%lld T=%lld, 1..%lld segments per row, SegmentSeqlens causal packed; "
      "packed Random-LTD layer (SamplePackedTokens keep 1/2) on its cu_seqlens\n",
      static_cast<long long>(shapes.layers), static_cast<long long>(shapes.batch),
      static_cast<long long>(shapes.seq), static_cast<long long>(shapes.channels),
      static_cast<long long>(steps), static_cast<unsigned long long>(seed),
      absl::StrJoin(schedule, " ").c_str(), static_cast<long long>(shapes.thd_batch),
      static_cast<long long>(shapes.thd_tokens), static_cast<long long>(shapes.thd_segments));
  for (int64_t step = 0; step < steps; ++step) {
    RETURN_IF_ERROR(worker->ModelStep(/*gpt=*/false, static_cast<uint64_t>(step)));
    RETURN_IF_ERROR(worker->ModelStep(/*gpt=*/true, static_cast<uint64_t>(step)));
    RETURN_IF_ERROR(worker->ThdBatch(static_cast<uint64_t>(step)));
    std::printf("step %lld: bert %lld layers ok, gpt %lld layers ok, thd ok\n",
                static_cast<long long>(step), static_cast<long long>(shapes.layers),
                static_cast<long long>(shapes.layers));
  }
  std::printf("\n%-32s %7s %10s %10s\n", "round trip (shm, by reference)", "count", "p50 us",
              "p99 us");
  for (const auto& [name, stats] : worker->latencies()) {
    std::printf("%-32s %7lld %10.1f %10.1f\n", name.c_str(), static_cast<long long>(stats.count()),
                stats.Percentile(0.5), stats.Percentile(0.99));
  }
  std::printf("\nall %lld checks against the CPU oracle passed\n",
              static_cast<long long>(worker->checks()));
  std::printf("metrics: %s%s\n", metrics.c_str(),
              server != nullptr && !server->metrics_url().empty()
                  ? " (the demo's server, stopped on exit)"
                  : "");
  worker.reset();
  RETURN_IF_ERROR(session->Close());
  if (server != nullptr) RETURN_IF_ERROR(server->Stop());
  return absl::OkStatus();
}

int RunDemo() {
  const absl::Status s = Demo();
  if (!s.ok()) return Fail("demo", s);
  return kExitOk;
}

}  // namespace

const Command kDemoCommand = {
    "demo", "play a Random-LTD training worker against a server, checked against the CPU",
    "Starts tokensel-server on a private unix socket (metrics on --metrics_address),\n"
    "or uses --server, and plays a training worker on shared-memory buffers:\n"
    "BERT-style and GPT-style model steps (B=8, S=512, C=768 fp16; retained tokens\n"
    "R_l = S - l*(S/2)/(L-1) rounded to a multiple of 16: 100% -> 50%), each layer\n"
    "= Execute[SampleTokens + mask, GatherTokens], a stand-in layer (+1 on every\n"
    "gathered element), Execute[ScatterTokens]; then SegmentSeqlens (packed) of a\n"
    "THD batch (B=4, T=4096) and a packed Random-LTD layer on its cu_seqlens:\n"
    "Execute[SamplePackedTokens keep 1/2 + fused gather], the stand-in layer,\n"
    "Execute[ScatterTokens]. Every result is compared with kernels::cpu on a copy.\n"
    "Prints per-round-trip latency (count, p50, p99) and the metrics URL; exit 1 if\n"
    "any check fails.\n"
    "  tokensel demo\n"
    "  tokensel demo --layers=2 --steps=1",
    ConnectionFlags({"layers", "steps", "seed", "server_binary", "metrics_address"}), &RunDemo};

}  // namespace tokensel::cli
