#include "server/grpc/tcp_security.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/errno_string.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "server/grpc/auth_token.h"
#include "server/grpc/status_util.h"

namespace tokensel::server {
namespace {

constexpr char kAuthorizationKey[] = "authorization";

// The token check for every call on a TCP listener (see the header).
class BearerTokenProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit BearerTokenProcessor(std::string token) : token_(std::move(token)) {}

  // A comparison and no I/O: run inline on the call's thread.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* /*context*/,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* /*response_metadata*/) override {
    std::vector<absl::string_view> values;
    auto range = auth_metadata.equal_range(kAuthorizationKey);
    for (auto it = range.first; it != range.second; ++it) {
      values.emplace_back(it->second.data(), it->second.size());
    }
    const absl::Status status = CheckAuthorization(values, token_);
    if (!status.ok()) return ToGrpcStatus(status);
    // The token stays out of the handlers' view of the metadata.
    for (auto it = range.first; it != range.second; ++it) {
      consumed_auth_metadata->emplace(kAuthorizationKey,
                                      std::string(it->second.data(), it->second.size()));
    }
    return grpc::Status::OK;
  }

 private:
  const std::string token_;
};

// The PEM file `path` given as --`flag`, which must hold `marker`.
absl::StatusOr<std::string> ReadPem(absl::string_view flag, const std::string& path,
                                    absl::string_view marker, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": cannot read: ", ErrnoString(errno)));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  std::string pem = contents.str();
  if (pem.find(std::string(marker)) == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": not a PEM ", what, " (no '", marker, "' line)"));
  }
  return pem;
}

}  // namespace

absl::StatusOr<TcpSecurity> TcpSecurity::Load(const TcpSecurityOptions& options,
                                              const std::vector<std::string>& tcp_listeners) {
  const bool has_cert = !options.tls_cert_file.empty();
  const bool has_key = !options.tls_key_file.empty();
  if (has_cert != has_key) {
    return absl::InvalidArgumentError(
        absl::StrCat("tls_cert and tls_key must be given together (only --",
                     has_cert ? "tls_cert" : "tls_key", " was set)"));
  }
  const bool has_token = !options.auth_token_file.empty();
  if (has_token && !has_cert) {
    return absl::InvalidArgumentError(
        "auth_token_file needs --tls_cert and --tls_key: a bearer token must not cross the "
        "network in plaintext");
  }
  TcpSecurity security;
  security.tls_ = has_cert;
  security.token_required_ = has_token;
  std::string cert;
  std::string key;
  std::string token;
  if (has_cert) {
    ASSIGN_OR_RETURN(cert, ReadPem("tls_cert", options.tls_cert_file, "-----BEGIN CERTIFICATE-----",
                                   "certificate"));
    ASSIGN_OR_RETURN(key,
                     ReadPem("tls_key", options.tls_key_file, "PRIVATE KEY-----", "private key"));
  }
  if (has_token) {
    ASSIGN_OR_RETURN(token, ReadTokenFile(options.auth_token_file));
  }

  if (tcp_listeners.empty()) {
    if (has_cert || options.insecure_tcp) {
      TS_LOG(INFO) << "no TCP listener: --tls_cert, --tls_key, --auth_token_file and "
                      "--insecure_tcp do not apply (unix sockets rely on file permissions)";
    }
    return security;
  }
  const std::string listeners = absl::StrJoin(tcp_listeners, ", ");
  if (!(has_cert && has_token) && !options.insecure_tcp) {
    std::vector<absl::string_view> missing;
    if (!has_cert) missing.push_back("--tls_cert and --tls_key");
    if (!has_token) missing.push_back("--auth_token_file");
    return absl::InvalidArgumentError(
        absl::StrCat("TCP listener ", listeners, " requires TLS and a bearer token: set ",
                     absl::StrJoin(missing, " and "),
                     ", or pass --insecure_tcp to serve TCP without them (trusted networks only)"));
  }

  if (has_cert) {
    grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    ssl.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
    security.credentials_ = grpc::SslServerCredentials(ssl);
    if (has_token) {
      security.credentials_->SetAuthMetadataProcessor(
          std::make_shared<BearerTokenProcessor>(std::move(token)));
    }
  } else {
    security.credentials_ = grpc::InsecureServerCredentials();
  }
  if (options.insecure_tcp) {
    if (!has_cert) {
      TS_LOG(WARNING) << "--insecure_tcp: TCP listener " << listeners
                      << " serves plaintext gRPC without authentication; anyone who can reach "
                         "it can open sessions and run ops. Use it only on trusted networks "
                         "(e.g. for kubelet gRPC probes behind a NetworkPolicy)";
    } else if (!has_token) {
      TS_LOG(WARNING) << "--insecure_tcp: TCP listener " << listeners
                      << " uses TLS but requires no bearer token; anyone who can reach it can "
                         "open sessions and run ops";
    } else {
      TS_LOG(WARNING) << "--insecure_tcp has no effect: TCP listener " << listeners
                      << " uses TLS and requires a bearer token";
    }
  }
  TS_LOG(INFO) << "TCP listener " << listeners << ": " << security.Describe();
  return security;
}

std::string TcpSecurity::Describe() const {
  if (tls_ && token_required_) return "TLS, bearer token required";
  if (tls_) return "TLS, no token (--insecure_tcp)";
  return "plaintext, no token (--insecure_tcp)";
}

absl::Status TcpSecurity::Probe() const {
  if (!tls_) return absl::OkStatus();
  static std::atomic<int> probes{0};
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(
      absl::StrCat("unix-abstract:tokensel-tls-probe-", ::getpid(), "-", probes++), credentials_,
      &port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::FailedPreconditionError(
        "TCP listeners: the TLS setup failed: are --tls_cert and --tls_key a matching PEM "
        "certificate and private key?");
  }
  server->Shutdown(std::chrono::system_clock::now());
  return absl::OkStatus();
}

}  // namespace tokensel::server
