// How the CLI reaches a secured TCP listener (the server's --tls_cert,
// --tls_key, --auth_token_file): the flags every networked subcommand
// shares, what they resolve to for one target, and errors that say which of
// TLS or the token failed.
//
//   --tls_ca=<PEM file>       trust these CAs (TLS on); absent = the system roots
//   --tls                     TLS with the system roots (implied by the others)
//   --tls_server_name=<name>  the name checked against the certificate
//                             (default: the target's host)
//   --auth_token_file=<file>  bearer token, sent as "authorization: Bearer ..."
//
// The token may also come from the environment, so it stays out of shell
// history and `ps`: $TOKENSEL_AUTH_TOKEN_FILE (a file, like the flag), else
// $TOKENSEL_AUTH_TOKEN (the token itself). The flag wins over both.
//
// Which connection a target gets:
//   unix:///path         plaintext, no token (the socket's mode is the
//                        authentication); giving a TLS or token flag is
//                        INVALID_ARGUMENT, environment tokens are ignored
//   https://host:port    TLS (the scheme is dropped: gRPC dials host:port)
//   http://host:port     plaintext
//   host:port            TLS when --tls, --tls_ca, --tls_server_name or a
//                        token (flag or environment) is given; plaintext
//                        otherwise (a server started with --insecure_tcp)
// A token is never sent without TLS: --auth_token_file with --tls=false or
// http:// is INVALID_ARGUMENT (an environment token is then not sent).
//
// The token is read once, trimmed of surrounding whitespace, and must be
// printable ASCII without spaces. No message or log line contains it.
// A token file that group or others may read gets a warning on stderr.
#ifndef TOKENSEL_CLIENT_CLI_CREDENTIALS_H_
#define TOKENSEL_CLIENT_CLI_CREDENTIALS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace tokensel::cli {

inline constexpr char kTokenFileEnv[] = "TOKENSEL_AUTH_TOKEN_FILE";
inline constexpr char kTokenEnv[] = "TOKENSEL_AUTH_TOKEN";

// "tls", "tls_ca", "tls_server_name", "auth_token_file".
std::vector<std::string> SecurityFlags();

// What one target resolves to.
struct TargetSecurity {
  std::string target;  // what gRPC dials (https:// and http:// dropped)
  bool tcp = false;
  bool tls = false;
  std::string ca_pem;       // empty = the system roots
  std::string ca_source;    // "--tls_ca=<path>" or "the system roots"
  std::string server_name;  // empty = the target's host
  std::string token;
  std::string token_source;  // "--auth_token_file=<path>", "$TOKENSEL_AUTH_TOKEN", ...
};

// Resolves `target` with the flags and environment above. INVALID_ARGUMENT
// for contradicting flags or an unreadable or malformed CA or token file
// (naming the flag and path, never the token).
absl::StatusOr<TargetSecurity> ResolveSecurity(const std::string& target);

// The channel credentials for `security`; sets the server name override in
// `args`. (The token travels as per-call metadata: ClientOptions::auth_token.)
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const TargetSecurity& security,
                                                                grpc::ChannelArguments* args);

// `status` of a call made with `security`, reworded to say what failed.
// UNAVAILABLE from a TLS handshake: "TLS handshake with <target> failed: "
// and why, as far as gRPC's words tell (a CA not in --tls_ca, a name the
// certificate lacks, a port without TLS); UNAVAILABLE of a plaintext
// connection a TLS port dropped: which flags a secured server needs;
// UNAUTHENTICATED: "bearer token missing" (which flag to pass) or not
// accepted as one; the server's PERMISSION_DENIED "invalid bearer token":
// "wrong bearer token" and its source. The code stays; gRPC's or the
// server's words follow in parentheses. Anything else is returned as is.
absl::Status ExplainSecurityError(const absl::Status& status, const TargetSecurity& security);

// The security of the last connection Connect made (for Fail()); nullptr
// before any.
const TargetSecurity* LastTargetSecurity();
void SetLastTargetSecurity(const TargetSecurity& security);

}  // namespace tokensel::cli

#endif  // TOKENSEL_CLIENT_CLI_CREDENTIALS_H_
