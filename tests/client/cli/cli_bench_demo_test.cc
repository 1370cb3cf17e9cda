// `tokensel bench` (JSON report, by reference and inline, baseline) and
// `tokensel demo` (its own server; and --server).
#include "tests/client/cli/cli_fixture.h"

namespace tokensel::cli::testing {
namespace {

using ::testing::HasSubstr;
using Fields = google::protobuf::Map<std::string, google::protobuf::Value>;

const Fields& Obj(const google::protobuf::Value& v, const std::string& key) {
  return v.struct_value().fields().at(key).struct_value().fields();
}

TEST_F(CliServerTest, BenchMixByReferenceJson) {
  CliResult r = Run("bench", {"--mix=gather:2,sort,seqlens,topk,sample,scatter,merge,split,packed",
                              "--requests=100", "--concurrency=2", "--batch=2",
                              "--original_tokens=64", "--channels=32", "--json", "--baseline"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  auto v = ParseJson(r.out);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(Obj(*v, "config").at("by_reference").bool_value());  // unix socket default
  const Fields& total = Obj(*v, "total");
  EXPECT_EQ(total.at("count").number_value(), 100);
  EXPECT_EQ(total.at("error_count").number_value(), 0);
  EXPECT_GT(total.at("ops_per_s").number_value(), 0);
  EXPECT_GT(total.at("bytes_per_s").number_value(), 0);
  EXPECT_LE(total.at("p50_us").number_value(), total.at("p99_us").number_value());
  const Fields& ops = Obj(*v, "ops");
  for (const char* op :
       {"gather", "sort", "seqlens", "topk", "sample", "scatter", "merge", "split", "packed"}) {
    ASSERT_TRUE(ops.contains(op)) << op;
    EXPECT_EQ(ops.at(op).struct_value().fields().at("count").number_value(),
              op == std::string("gather") ? 20 : 10)
        << op;
  }
  const Fields& baseline = Obj(*v, "baseline");
  EXPECT_EQ(baseline.at("ping").struct_value().fields().at("count").number_value(), 100);
  EXPECT_GT(baseline.at("ratio_p50").struct_value().fields().at("gather").number_value(), 0);
}

TEST_F(CliServerTest, BenchInlineOpenLoopOverTcp) {
  CliResult r = RunCli({"bench", "--server=" + server_->tcp_target(), "--op=gather",
                        "--requests=20", "--rate=400", "--concurrency=2", "--batch=2",
                        "--original_tokens=64", "--channels=16", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  auto v = ParseJson(r.out);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(Obj(*v, "config").at("by_reference").bool_value());  // TCP default
  EXPECT_EQ(Obj(*v, "total").at("count").number_value(), 20);
  EXPECT_EQ(Obj(*v, "total").at("error_count").number_value(), 0);
  // 20 requests at 400/s are scheduled over >= 47.5 ms.
  EXPECT_GE(v->struct_value().fields().at("seconds").number_value(), 0.045);
}

TEST_F(CliServerTest, BenchTextTable) {
  CliResult r = Run("bench", {"--op=ping", "--requests=10", "--concurrency=1"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_THAT(r.out, HasSubstr("closed loop"));
  EXPECT_THAT(r.out, HasSubstr("p999 us"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("\nping +10 "));
}

TEST_F(CliServerTest, DemoAgainstServer) {
  CliResult r = Run("demo", {"--layers=2", "--steps=1"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_THAT(r.out, HasSubstr("retained tokens per layer: 512 256"));
  EXPECT_THAT(r.out, HasSubstr("bert layer in: Sample+Gather"));
  EXPECT_THAT(r.out, HasSubstr("thd layer in: SamplePacked+Gather"));
  // 2 models x 2 layers x 2 checks + SegmentSeqlens + the packed layer's 2.
  EXPECT_THAT(r.out, HasSubstr("all 11 checks against the CPU oracle passed"));
}

TEST(CliDemoTest, DemoStartsItsOwnServer) {
  // No --server: the demo finds tokensel-server in the build tree
  // (build/<dir>/client/cli/tokensel -> build/<dir>/server/tokensel-server).
  CliResult r = RunCli({"demo", "--layers=3", "--steps=2"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_THAT(r.out, HasSubstr("retained tokens per layer: 512 384 256"));
  for (const char* row : {"bert layer in: Sample+Gather", "gpt layer in: Sample+Gather",
                          "layer out: Scatter", "thd: SegmentSeqlens packed",
                          "thd layer in: SamplePacked+Gather", "thd layer out: Scatter"}) {
    EXPECT_THAT(r.out, HasSubstr(row));
  }
  // 2 steps x (2 models x 3 layers x 2 checks + 1 thd + 2 packed layer) = 30.
  EXPECT_THAT(r.out, HasSubstr("all 30 checks against the CPU oracle passed"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("metrics: http://127\\.0\\.0\\.1:[0-9]+/metrics"));
}

// A server that dies at startup is reported with its output, exit 1. (The
// launcher used to build that message while holding its own lock: absl's
// deadlock detector aborted the CLI with SIGABRT.)
TEST(CliDemoTest, ServerThatExitsAtStartupIsAnErrorNotAnAbort) {
  for (const char* metrics : {"--metrics_address=127.0.0.1:0", "--metrics_address="}) {
    CliResult r = RunCli({"demo", "--server_binary=/bin/false", metrics});
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    EXPECT_THAT(r.err, HasSubstr("tokensel-server exited during startup")) << r.Describe();
  }
}

}  // namespace
}  // namespace tokensel::cli::testing
