// info, health, buffers and the command-line surface (help, usage errors).
#include "tests/client/cli/cli_fixture.h"

namespace tokensel::cli::testing {
namespace {

using ::testing::HasSubstr;

TEST_F(CliServerTest, InfoTextAndJson) {
  CliResult text = Run("info");
  ASSERT_EQ(text.exit_code, 0) << text.Describe();
  EXPECT_THAT(text.out, HasSubstr("backend:       cpu"));
  EXPECT_THAT(text.out, HasSubstr("shm_prefix:    " + server_->shm_prefix()));
  EXPECT_THAT(text.out, HasSubstr("max_inflight=256"));

  CliResult json = Run("info", {"--json"});
  ASSERT_EQ(json.exit_code, 0) << json.Describe();
  auto value = ParseJson(json.out);
  ASSERT_TRUE(value.ok()) << value.status();
  const auto& fields = value->struct_value().fields();
  EXPECT_EQ(fields.at("backend").string_value(), "cpu");
  EXPECT_EQ(fields.at("shm_prefix").string_value(), server_->shm_prefix());
  EXPECT_FALSE(fields.at("version").string_value().empty());
  EXPECT_EQ(fields.at("limits").struct_value().fields().at("max_rank").number_value(), 6);
}

TEST_F(CliServerTest, HealthServing) {
  CliResult text = Run("health");
  ASSERT_EQ(text.exit_code, 0) << text.Describe();
  EXPECT_EQ(text.out, "SERVING\n");
  CliResult json = Run("health", {"--json"});
  ASSERT_EQ(json.exit_code, 0) << json.Describe();
  auto value = ParseJson(json.out);
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(value->struct_value().fields().at("status").string_value(), "SERVING");
}

TEST(CliTest, HealthOfAMissingServerFails) {
  CliResult r = RunCli({"health", "--server=unix:///nonexistent/tokensel.sock", "--timeout=2s"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE"));
}

TEST_F(CliServerTest, BuffersOfAFreshSessionAreEmptyAndUnknownSessionFails) {
  CliResult r = Run("buffers", {"--json"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  auto value = ParseJson(r.out);
  ASSERT_TRUE(value.ok()) << value.status();
  const auto& fields = value->struct_value().fields();
  EXPECT_EQ(fields.at("buffers").list_value().values_size(), 0);

  CliResult unknown = Run("buffers", {"--session=no-such-session"});
  EXPECT_EQ(unknown.exit_code, 1) << unknown.Describe();
  EXPECT_THAT(unknown.err, HasSubstr("NOT_FOUND"));
}

TEST(CliTest, HelpListsCommandsAndPerCommandFlags) {
  CliResult help = RunCli({"help"});
  ASSERT_EQ(help.exit_code, 0) << help.Describe();
  for (const char* cmd : {"info", "health", "buffers", "sort", "gather", "scatter", "seqlens",
                          "topk", "sample", "bench", "demo"}) {
    EXPECT_THAT(help.out, HasSubstr(std::string("  ") + cmd + " ")) << cmd;
  }
  CliResult gather = RunCli({"gather", "--help"});
  ASSERT_EQ(gather.exit_code, 0) << gather.Describe();
  EXPECT_THAT(gather.out, HasSubstr("--activations"));
  EXPECT_THAT(gather.out, HasSubstr("--seq_first"));
  EXPECT_THAT(gather.out, ::testing::Not(HasSubstr("--concurrency")));
  CliResult bench = RunCli({"help", "bench"});
  ASSERT_EQ(bench.exit_code, 0) << bench.Describe();
  EXPECT_THAT(bench.out, HasSubstr("--baseline"));
}

TEST(CliTest, UsageErrorsExitTwo) {
  CliResult unknown = RunCli({"frobnicate"});
  EXPECT_EQ(unknown.exit_code, 2) << unknown.Describe();
  EXPECT_THAT(unknown.err, HasSubstr("unknown command 'frobnicate'"));
  // A flag of another subcommand.
  CliResult foreign = RunCli({"info", "--concurrency=3"});
  EXPECT_EQ(foreign.exit_code, 2) << foreign.Describe();
  EXPECT_THAT(foreign.err, HasSubstr("unknown flag --concurrency"));
  CliResult positional = RunCli({"info", "extra"});
  EXPECT_EQ(positional.exit_code, 2) << positional.Describe();
  CliResult none = RunCli({});
  EXPECT_EQ(none.exit_code, 2) << none.Describe();
}

}  // namespace
}  // namespace tokensel::cli::testing
