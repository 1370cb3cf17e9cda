// The CLI against a secured TCP listener: a real tokensel-server with TLS
// (a test CA and a certificate for 127.0.0.1/localhost made with the openssl
// CLI at test time) and a bearer token, on loopback. `tokensel info`,
// `health` and `bench` succeed with the right CA and token and fail with the
// named error otherwise: a wrong CA or server name is a TLS handshake
// failure (UNAVAILABLE), no token UNAUTHENTICATED, a wrong token
// PERMISSION_DENIED; no message contains the token.
//
// Without openssl the suite FAILS rather than skips (scripts/install-deps.sh
// installs it): a skipped security test in CI would hide a regression.
#include <sys/stat.h>

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/cli/cli_runner.h"
#include "tests/server/integration/test_pki.h"
#include "tests/testing/server_process.h"

namespace tokensel::cli::testing {
namespace {

using itest::TestPki;
using ::testing::HasSubstr;
using ::testing::Not;
using Fields = google::protobuf::Map<std::string, google::protobuf::Value>;

constexpr char kWrongToken[] = "not-the-tokensel-token-fedcba9876543210";

class CliTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto pki = TestPki::Create();
    ASSERT_TRUE(pki.ok()) << pki.status() << " (scripts/install-deps.sh installs openssl)";
    pki_ = std::move(pki).value().release();
    auto other = TestPki::Create();  // an unrelated CA: the "wrong CA"
    ASSERT_TRUE(other.ok()) << other.status();
    other_ = std::move(other).value().release();
    ASSERT_EQ(chmod(pki_->token_file().c_str(), 0600), 0);
    wrong_token_file_ = new std::string(pki_->WriteFile("wrong_token", kWrongToken));
    ASSERT_EQ(chmod(wrong_token_file_->c_str(), 0600), 0);
    ::tokensel::testing::ServerOptions options;
    options.insecure_tcp = false;
    options.extra_args = {"--tls_cert=" + pki_->server_cert(), "--tls_key=" + pki_->server_key(),
                          "--auth_token_file=" + pki_->token_file()};
    auto server = ::tokensel::testing::ServerProcess::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value().release();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete wrong_token_file_;
    delete other_;
    delete pki_;
    server_ = nullptr;
    wrong_token_file_ = nullptr;
    other_ = nullptr;
    pki_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr) << "suite setup failed"; }

  static std::string Ca() { return "--tls_ca=" + pki_->dir() + "/ca.pem"; }
  static std::string WrongCa() { return "--tls_ca=" + other_->dir() + "/ca.pem"; }
  static std::string Token() { return "--auth_token_file=" + pki_->token_file(); }
  static std::string Tcp() { return "--server=" + server_->tcp_target(); }

  // Runs `tokensel <args>` and checks that no output holds either token.
  static CliResult Run(const std::vector<std::string>& args,
                       const std::vector<std::string>& env = {}) {
    CliResult r = RunCli(args, 120, env);
    for (const std::string& s : {r.out, r.err}) {
      EXPECT_THAT(s, Not(HasSubstr(TestPki::kToken))) << "the token was printed";
      EXPECT_THAT(s, Not(HasSubstr(kWrongToken))) << "the token was printed";
    }
    return r;
  }

  static TestPki* pki_;
  static TestPki* other_;
  static std::string* wrong_token_file_;
  static ::tokensel::testing::ServerProcess* server_;
};

TestPki* CliTlsTest::pki_ = nullptr;
TestPki* CliTlsTest::other_ = nullptr;
std::string* CliTlsTest::wrong_token_file_ = nullptr;
::tokensel::testing::ServerProcess* CliTlsTest::server_ = nullptr;

TEST_F(CliTlsTest, InfoAndHealthSucceedWithTheRightCaAndToken) {
  CliResult r = Run({"info", Tcp(), Ca(), Token()});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_THAT(r.out, HasSubstr("backend:"));
  EXPECT_EQ(r.err, "");  // a 0600 token file: no warning
  r = Run({"health", Tcp(), Ca(), Token()});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(r.out, "SERVING\n");
}

TEST_F(CliTlsTest, BenchOverTlsReportsItsNumbers) {
  CliResult r =
      Run({"bench", Tcp(), Ca(), Token(), "--duration=2s", "--op=gather", "--concurrency=2",
           "--batch=2", "--original_tokens=64", "--channels=16", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  auto v = ParseJson(r.out);
  ASSERT_TRUE(v.ok()) << v.status() << r.Describe();
  const Fields& total = v->struct_value().fields().at("total").struct_value().fields();
  EXPECT_GT(total.at("count").number_value(), 0);
  EXPECT_EQ(total.at("error_count").number_value(), 0);
  EXPECT_GT(total.at("p50_us").number_value(), 0);
  EXPECT_GE(v->struct_value().fields().at("seconds").number_value(), 1.9);

  // The text table, as over a unix socket.
  r = Run({"bench", Tcp(), Ca(), Token(), "--duration=2s", "--op=ping", "--concurrency=1"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_THAT(r.out, HasSubstr("p999 us"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("\nping +[1-9][0-9]* "));
}

TEST_F(CliTlsTest, AWrongCaIsANamedTlsHandshakeFailure) {
  for (const char* command : {"info", "bench"}) {
    std::vector<std::string> args = {command, Tcp(), WrongCa(), Token()};
    if (command == std::string("bench")) args.push_back("--duration=2s");
    CliResult r = Run(args);
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    EXPECT_THAT(r.err,
                HasSubstr("UNAVAILABLE: TLS handshake with " + server_->tcp_target() + " failed"))
        << r.Describe();
    EXPECT_THAT(r.err, HasSubstr("--tls_ca=" + other_->dir())) << r.Describe();
  }
}

TEST_F(CliTlsTest, AServerNameTheCertificateLacksIsATlsHandshakeFailure) {
  CliResult r = Run({"info", Tcp(), Ca(), Token(), "--tls_server_name=not-tokensel.example"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE: TLS handshake with")) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("'not-tokensel.example'")) << r.Describe();
  // The name the certificate does carry (DNS:localhost), dialing the IP.
  r = Run({"info", Tcp(), Ca(), Token(), "--tls_server_name=localhost"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
}

TEST_F(CliTlsTest, AMissingTokenIsUnauthenticated) {
  for (const char* command : {"info", "bench"}) {
    std::vector<std::string> args = {command, Tcp(), Ca()};
    if (command == std::string("bench")) args.push_back("--duration=2s");
    CliResult r = Run(args);
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    EXPECT_THAT(r.err, HasSubstr("UNAUTHENTICATED: bearer token missing")) << r.Describe();
    EXPECT_THAT(r.err, HasSubstr("--auth_token_file")) << r.Describe();
  }
}

TEST_F(CliTlsTest, AWrongTokenIsPermissionDenied) {
  for (const char* command : {"info", "bench"}) {
    std::vector<std::string> args = {command, Tcp(), Ca(),
                                     "--auth_token_file=" + *wrong_token_file_};
    if (command == std::string("bench")) args.push_back("--duration=2s");
    CliResult r = Run(args);
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    EXPECT_THAT(r.err, HasSubstr("PERMISSION_DENIED: wrong bearer token")) << r.Describe();
    EXPECT_THAT(r.err, HasSubstr(*wrong_token_file_)) << r.Describe();
  }
}

TEST_F(CliTlsTest, TheTokenMayComeFromTheEnvironment) {
  CliResult r = Run({"info", Tcp(), Ca()}, {"TOKENSEL_AUTH_TOKEN_FILE=" + pki_->token_file()});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  r = Run({"info", Tcp(), Ca()}, {std::string("TOKENSEL_AUTH_TOKEN=") + TestPki::kToken});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  r = Run({"info", Tcp(), Ca()}, {std::string("TOKENSEL_AUTH_TOKEN=") + kWrongToken});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("PERMISSION_DENIED: wrong bearer token")) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("$TOKENSEL_AUTH_TOKEN")) << r.Describe();
  // The flag wins over the environment.
  r = Run({"info", Tcp(), Ca(), Token()}, {std::string("TOKENSEL_AUTH_TOKEN=") + kWrongToken});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  // An environment token is not sent to a unix socket (which wants none).
  r = Run({"info", "--server=" + server_->unix_target()},
          {std::string("TOKENSEL_AUTH_TOKEN=") + kWrongToken});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
}

TEST_F(CliTlsTest, AnHttpsTargetMeansTls) {
  CliResult r = Run({"info", "--server=https://" + server_->tcp_target(), Ca(), Token()});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
}

TEST_F(CliTlsTest, PlaintextToATlsPortSaysTlsIsNeeded) {
  CliResult r = Run({"info", Tcp()});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE: plaintext connection to")) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("--tls_ca")) << r.Describe();
}

TEST_F(CliTlsTest, ContradictingFlagsAreRefusedBeforeAnyCall) {
  CliResult r = Run({"info", Tcp(), Token(), "--tls=false"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("never sent in clear")) << r.Describe();
  r = Run({"info", "--server=http://" + server_->tcp_target(), Token()});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("never sent in clear")) << r.Describe();
  r = Run({"info", "--server=" + server_->unix_target(), Ca()});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("apply to TCP targets")) << r.Describe();
  r = Run({"info", Tcp(), "--tls_ca=" + pki_->token_file(), Token()});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("no PEM certificate")) << r.Describe();
}

TEST_F(CliTlsTest, ATokenFileOthersCanReadIsWarnedAbout) {
  const std::string open_file = pki_->WriteFile("open_token", TestPki::kToken);
  ASSERT_EQ(chmod(open_file.c_str(), 0644), 0);
  CliResult r = Run({"info", Tcp(), Ca(), "--auth_token_file=" + open_file});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("may be read by others (mode 0644)")) << r.Describe();
  // Once, though bench connects once per worker.
  r = Run({"bench", Tcp(), Ca(), "--auth_token_file=" + open_file, "--op=ping", "--requests=6",
           "--concurrency=3"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  const size_t first = r.err.find("may be read by others");
  ASSERT_NE(first, std::string::npos) << r.Describe();
  EXPECT_EQ(r.err.find("may be read by others", first + 1), std::string::npos) << r.Describe();
}

TEST_F(CliTlsTest, HelpListsTheSecurityFlags) {
  for (const char* command : {"info", "bench", "sort", "demo"}) {
    CliResult r = Run({command, "--help"});
    EXPECT_EQ(r.exit_code, 0) << r.Describe();
    for (const char* flag : {"--tls ", "--tls_ca", "--tls_server_name", "--auth_token_file"}) {
      EXPECT_THAT(r.out, HasSubstr(flag)) << command;
    }
    EXPECT_THAT(r.out, Not(HasSubstr("(plaintext)"))) << command;
  }
}

}  // namespace
}  // namespace tokensel::cli::testing
