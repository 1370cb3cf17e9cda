// Access control against real tokensel-server processes: TLS + bearer token
// on TCP (right, wrong, missing, malformed token; plaintext client against
// the TLS port), the unix socket without a token, the refusal to start an
// unprotected TCP listener, the --insecure_tcp warning, the socket's group
// and mode, and session isolation. Certificates come from the openssl CLI at
// test time (tests skip without it).
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "tests/server/integration/fixture.h"
#include "tests/server/integration/test_pki.h"

namespace tokensel::itest {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using Code = absl::StatusCode;
using Stub = v1::TokenSelect::Stub;

constexpr absl::Duration kExitTimeout = absl::Seconds(20);

std::shared_ptr<grpc::Channel> Channel(const std::string& target,
                                       std::shared_ptr<grpc::ChannelCredentials> creds) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, std::move(creds), args);
}

class SecurityTest : public ServerFixture {
 protected:
  static void SetUpTestSuite() {
    auto pki = TestPki::Create();
    if (pki.ok()) {
      pki_ = std::move(pki).value().release();
    } else {
      pki_status_ = new absl::Status(pki.status());
    }
  }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
    delete pki_status_;
    pki_status_ = nullptr;
  }

  void SetUp() override {
    if (pki_ == nullptr) {
      if (TestPki::OpensslMissing(*pki_status_)) GTEST_SKIP() << *pki_status_;
      FAIL() << *pki_status_;
    }
  }

  // Flags for TLS with the test certificate, and the token.
  static std::vector<std::string> SecureArgs() {
    return {"--tls_cert=" + pki_->server_cert(), "--tls_key=" + pki_->server_key(),
            "--auth_token_file=" + pki_->token_file()};
  }
  static ServerOptions SecureOptions() {
    ServerOptions options;
    options.insecure_tcp = false;
    options.extra_args = SecureArgs();
    return options;
  }

  // A TLS channel to the TCP port trusting the test CA, sending
  // "authorization: Bearer <token>" (gRPC's AccessTokenCredentials) unless
  // `token` is empty.
  std::shared_ptr<grpc::Channel> TlsChannel(const std::string& token) const {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = pki_->ca_pem();
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::SslCredentials(ssl);
    if (!token.empty()) {
      creds = grpc::CompositeChannelCredentials(creds, grpc::AccessTokenCredentials(token));
    }
    return Channel(server_->tcp_target(), std::move(creds));
  }

  // Starts a server expected to refuse to start; returns its output after
  // checking it exited with code 1.
  std::string ExpectRefusesToStart(ServerOptions options) {
    options.wait_for_startup = false;
    auto server = ServerProcess::Start(std::move(options));
    EXPECT_OK(server);
    if (!server.ok()) return "";
    absl::StatusOr<int> code = (*server)->WaitForExit(kExitTimeout);
    EXPECT_OK(code);
    EXPECT_EQ(code.value_or(-1), 1) << (*server)->Output();
    return (*server)->Output();
  }

  static TestPki* pki_;
  static absl::Status* pki_status_;
};

TestPki* SecurityTest::pki_ = nullptr;
absl::Status* SecurityTest::pki_status_ = nullptr;

TEST_F(SecurityTest, RightTokenOverTlsServesOpsAndHealth) {
  ASSERT_NO_FATAL_FAILURE(StartServer(SecureOptions()));
  EXPECT_THAT(server_->Output(), HasSubstr("TLS, bearer token required"));
  Client tls(TlsChannel(TestPki::kToken));
  ASSERT_OK(tls.Ping());
  ASSERT_OK(tls.Open());
  v1::ListBuffersResponse listed;
  ASSERT_OK(tls.Call(&Stub::ListBuffers, v1::ListBuffersRequest(), &listed));
  EXPECT_EQ(listed.buffers_size(), 0);
  // An op over TLS in its own session (inline: a TCP session cannot be handed
  // memory, and the unix client's session is not the TLS peer's to use).
  v1::SortTokensRequest sort;
  sort.set_original_tokens(4);
  *sort.mutable_ids() =
      InlineTensor(DType::kInt32, {1, 4}, std::string("\3\0\0\0\1\0\0\0\2\0\0\0\0\0\0\0", 16));
  v1::OpResponse sorted;
  ASSERT_OK(tls.Call(&Stub::SortTokens, sort, &sorted));
  ASSERT_EQ(sorted.outputs_size(), 1);
  EXPECT_EQ(sorted.outputs(0).tensor().inline_data(),
            std::string("\0\0\0\0\1\0\0\0\2\0\0\0\3\0\0\0", 16));
  tls.set_session(client_->session());
  EXPECT_THAT(tls.Call(&Stub::SortTokens, sort, &sorted),
              StatusIs(Code::kPermissionDenied, "belongs to another peer"));

  auto health = grpc::health::v1::Health::NewStub(TlsChannel(TestPki::kToken));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_OK(ToAbsl(health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &response)));
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(SecurityTest, WrongTokenIsPermissionDenied) {
  ASSERT_NO_FATAL_FAILURE(StartServer(SecureOptions()));
  Client tls(TlsChannel("tokensel-test-token-0123456789abcdeX"));  // last char differs
  EXPECT_THAT(tls.Ping(), StatusIs(Code::kPermissionDenied, "invalid bearer token"));
  EXPECT_THAT(tls.Open(), StatusIs(Code::kPermissionDenied));
  Client shorter(TlsChannel("tokensel-test-token"));  // a prefix of the right one
  EXPECT_THAT(shorter.Ping(), StatusIs(Code::kPermissionDenied, "invalid bearer token"));
  ExpectStillServes();
}

TEST_F(SecurityTest, MissingOrMalformedTokenIsUnauthenticated) {
  ASSERT_NO_FATAL_FAILURE(StartServer(SecureOptions()));
  Client no_token(TlsChannel(""));
  EXPECT_THAT(no_token.Ping(), StatusIs(Code::kUnauthenticated, "missing authorization metadata"));
  // Even health needs the token on TCP.
  auto health = grpc::health::v1::Health::NewStub(TlsChannel(""));
  grpc::ClientContext health_ctx;
  health_ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::health::v1::HealthCheckResponse response;
  EXPECT_THAT(ToAbsl(health->Check(&health_ctx, grpc::health::v1::HealthCheckRequest(), &response)),
              StatusIs(Code::kUnauthenticated));

  for (const std::string& value :
       {std::string("Basic ") + TestPki::kToken, std::string("Bearer"), std::string("Bearer ")}) {
    auto ctx = no_token.Context();
    ctx->AddMetadata("authorization", value);
    v1::PingResponse pong;
    EXPECT_THAT(ToAbsl(no_token.stub().Ping(ctx.get(), v1::PingRequest(), &pong)),
                StatusIs(Code::kUnauthenticated, "malformed authorization metadata"))
        << "authorization: " << value;
  }
  ExpectStillServes();
}

TEST_F(SecurityTest, PlaintextClientAgainstTlsPortIsUnavailable) {
  ASSERT_NO_FATAL_FAILURE(StartServer(SecureOptions()));
  Client plain(server_->TcpChannel());  // insecure credentials
  EXPECT_THAT(plain.Ping(), StatusIs(Code::kUnavailable));
  ExpectStillServes();
}

TEST_F(SecurityTest, UnixSocketNeedsNoToken) {
  // StartServer opened a session and registered a buffer over the socket.
  ASSERT_NO_FATAL_FAILURE(StartServer(SecureOptions()));
  Client unix_client(server_->UnixChannel());
  unix_client.set_fd_channel(server_->fd_channel_path());
  ASSERT_OK(unix_client.Ping());
  ASSERT_OK(unix_client.Open());
  ExpectStillServes();
}

TEST_F(SecurityTest, UnprotectedTcpListenerRefusesToStart) {
  ServerOptions plain;
  plain.insecure_tcp = false;
  std::string out = ExpectRefusesToStart(plain);
  EXPECT_THAT(out, AllOf(HasSubstr("TCP listener 127.0.0.1:0 requires TLS and a bearer token"),
                         HasSubstr("--tls_cert and --tls_key and --auth_token_file"),
                         HasSubstr("--insecure_tcp")));

  ServerOptions tls_only = plain;
  tls_only.extra_args = {"--tls_cert=" + pki_->server_cert(), "--tls_key=" + pki_->server_key()};
  out = ExpectRefusesToStart(tls_only);
  EXPECT_THAT(out, AllOf(HasSubstr("requires TLS and a bearer token: set --auth_token_file"),
                         Not(HasSubstr("set --tls_cert"))));
}

TEST_F(SecurityTest, BadSecurityFlagsRefuseToStart) {
  ServerOptions options;
  options.insecure_tcp = false;
  options.extra_args = {"--auth_token_file=" + pki_->token_file()};
  EXPECT_THAT(ExpectRefusesToStart(options), HasSubstr("must not cross the network in plaintext"));

  options.extra_args = {"--tls_cert=" + pki_->server_cert()};
  EXPECT_THAT(ExpectRefusesToStart(options), HasSubstr("only --tls_cert was set"));

  options.extra_args = SecureArgs();
  options.extra_args.push_back("--auth_token_file=" + pki_->WriteFile("short", "abc\n"));
  EXPECT_THAT(ExpectRefusesToStart(options), HasSubstr("token has 3 characters"));

  options.extra_args = SecureArgs();
  options.extra_args.push_back("--tls_cert=" + pki_->server_key());  // a key, not a cert
  EXPECT_THAT(ExpectRefusesToStart(options), HasSubstr("not a PEM certificate"));

  options.extra_args = SecureArgs();
  options.extra_args.push_back("--tls_key=" + pki_->other_key());  // not the cert's key
  EXPECT_THAT(ExpectRefusesToStart(options),
              HasSubstr("are --tls_cert and --tls_key a matching PEM certificate"));
}

TEST_F(SecurityTest, InsecureTcpLogsWarningAndServesPlaintext) {
  ASSERT_NO_FATAL_FAILURE(StartServer());  // the harness default: --insecure_tcp
  EXPECT_THAT(server_->Output(),
              AllOf(HasSubstr("--insecure_tcp: TCP listener 127.0.0.1:0 serves plaintext gRPC "
                              "without authentication"),
                    HasSubstr("plaintext, no token (--insecure_tcp)")));
  const std::string out = server_->Output();
  const size_t warning = out.find("--insecure_tcp: TCP listener");
  ASSERT_NE(warning, std::string::npos);
  EXPECT_EQ(out[out.rfind('\n', warning) + 1], 'W') << "not a WARNING line: " << out;
  Client plain(server_->TcpChannel());
  ASSERT_OK(plain.Ping());
}

TEST_F(SecurityTest, InsecureTcpWithTlsServesTlsWithoutToken) {
  ServerOptions options;
  options.insecure_tcp = true;
  options.extra_args = {"--tls_cert=" + pki_->server_cert(), "--tls_key=" + pki_->server_key()};
  ASSERT_NO_FATAL_FAILURE(StartServer(options));
  EXPECT_THAT(server_->Output(), HasSubstr("uses TLS but requires no bearer token"));
  Client tls(TlsChannel(""));
  ASSERT_OK(tls.Ping());
  Client plain(server_->TcpChannel());
  EXPECT_THAT(plain.Ping(), StatusIs(Code::kUnavailable));
}

TEST_F(SecurityTest, UnixSocketGetsGroupAndMode0660) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to chown the socket to another group";
  struct group* nogroup = getgrnam("nogroup");
  if (nogroup == nullptr) GTEST_SKIP() << "no group 'nogroup' on this machine";
  const gid_t gid = nogroup->gr_gid;
  for (const std::string& group : {std::string("nogroup"), std::to_string(gid)}) {
    ServerOptions options;
    options.extra_args = {"--unix_socket_group=" + group};
    auto server = ServerProcess::Start(options);
    ASSERT_OK(server);
    const std::string path = (*server)->unix_target().substr(std::string("unix://").size());
    struct stat st;
    ASSERT_EQ(::stat(path.c_str(), &st), 0) << path;
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_gid, gid) << "--unix_socket_group=" << group;
    EXPECT_EQ(st.st_mode & 07777, 0660u);
    EXPECT_OK(Client((*server)->UnixChannel()).Ping());
  }
  ServerOptions unknown;
  unknown.extra_args = {"--unix_socket_group=tokensel-no-such-group"};
  EXPECT_THAT(ExpectRefusesToStart(unknown), HasSubstr("no group named 'tokensel-no-such-group'"));
}

TEST_F(SecurityTest, SessionsAreIsolated) {
  ASSERT_NO_FATAL_FAILURE(StartServer(SecureOptions()));
  // client_ (unix) owns "arena"; `other` comes over TLS + token.
  Client other(TlsChannel(TestPki::kToken));
  ASSERT_OK(other.Open());
  v1::ListBuffersResponse mine;
  ASSERT_OK(client_->Call(&Stub::ListBuffers, v1::ListBuffersRequest(), &mine));
  ASSERT_EQ(mine.buffers_size(), 1);
  EXPECT_EQ(mine.buffers(0).name(), "arena");
  v1::ListBuffersResponse theirs;
  ASSERT_OK(other.Call(&Stub::ListBuffers, v1::ListBuffersRequest(), &theirs));
  EXPECT_EQ(theirs.buffers_size(), 0);

  // Using another session's buffer: PERMISSION_DENIED.
  v1::SortTokensRequest sort;
  sort.set_original_tokens(16);
  *sort.mutable_ids() = Placed{DType::kInt32, {4}, {1}, 0, 16}.Ref("arena");
  v1::OpResponse resp;
  EXPECT_THAT(other.Call(&Stub::SortTokens, sort, &resp),
              StatusIs(Code::kPermissionDenied, "belongs to another session"));
  // Nor can it unregister it: the buffer stays, the owner still uses it.
  EXPECT_THAT(other.Unregister("arena"), StatusIs(Code::kNotFound, "in this session"));
  // A TCP session cannot receive descriptors: whoever sends one on the fd
  // channel is a unix uid, not the TCP peer that owns the session.
  other.set_fd_channel(server_->fd_channel_path());
  EXPECT_THAT(other.Register("theirs", shm_.name(), 0, 65536),
              StatusIs(Code::kPermissionDenied, "another peer"));
  ExpectStillServes();
}

}  // namespace
}  // namespace tokensel::itest
