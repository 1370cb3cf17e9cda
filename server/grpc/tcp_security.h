// TCP listener security: TLS (grpc::SslServerCredentials) plus a bearer
// token checked by an AuthMetadataProcessor attached to those credentials.
//
// The processor is the one place a token is checked. Because it belongs to
// the TCP listeners' ServerCredentials, it runs for every call (TokenSelect,
// health, reflection) arriving on a TCP port and never for the unix socket,
// whose callers are authenticated by the socket file's owner, group and mode
// (0660). Outcomes (see CheckAuthorization): no or malformed authorization ->
// UNAUTHENTICATED, a wrong token -> PERMISSION_DENIED; the handler never sees
// the authorization metadata (it is consumed).
//
// Policy (TcpSecurity::Load), with at least one TCP listener:
//   --tls_cert + --tls_key + --auth_token_file  TLS, token required
//   anything less without --insecure_tcp        refused (INVALID_ARGUMENT)
//   --insecure_tcp + TLS, no token              TLS, no token; WARNING logged
//   --insecure_tcp, nothing else                plaintext, no token; WARNING
// and always: --tls_cert and --tls_key come together; a token needs TLS (it
// would cross the network in clear otherwise; INVALID_ARGUMENT). Without TCP
// listeners the files are still validated but unused (logged).
#ifndef TOKENSEL_SERVER_GRPC_TCP_SECURITY_H_
#define TOKENSEL_SERVER_GRPC_TCP_SECURITY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace grpc {
class ServerCredentials;
}  // namespace grpc

namespace tokensel::server {

struct TcpSecurityOptions {
  std::string tls_cert_file;    // PEM certificate chain
  std::string tls_key_file;     // PEM private key
  std::string auth_token_file;  // see ReadTokenFile
  bool insecure_tcp = false;
};

class TcpSecurity {
 public:
  // Reads and checks the files and applies the policy above for a server
  // whose TCP listeners are `tcp_listeners` (used in messages). Logs the
  // --insecure_tcp WARNING. INVALID_ARGUMENT naming the flag and file for
  // every refusal; messages never contain the token.
  static absl::StatusOr<TcpSecurity> Load(const TcpSecurityOptions& options,
                                          const std::vector<std::string>& tcp_listeners);

  // The credentials every TCP listener is added with; one object shared by
  // all of them (thread-safe, as gRPC requires).
  std::shared_ptr<grpc::ServerCredentials> credentials() const { return credentials_; }
  bool tls() const { return tls_; }
  // Whether gRPC can build a listener from credentials(): a certificate and
  // key that do not match are only found when gRPC creates its security
  // connector. Starts and stops a throwaway server on an abstract unix
  // socket (TLS only; plaintext always passes). FAILED_PRECONDITION naming
  // the flags when gRPC refuses.
  absl::Status Probe() const;
  bool token_required() const { return token_required_; }
  // "TLS, bearer token required", "TLS, no token (--insecure_tcp)",
  // "plaintext, no token (--insecure_tcp)".
  std::string Describe() const;

 private:
  std::shared_ptr<grpc::ServerCredentials> credentials_;
  bool tls_ = false;
  bool token_required_ = false;
};

}  // namespace tokensel::server

#endif  // TOKENSEL_SERVER_GRPC_TCP_SECURITY_H_
