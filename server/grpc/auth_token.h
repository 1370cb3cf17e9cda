// Bearer-token helpers for TCP access control. Pure functions, no gRPC types:
// the gRPC side (tcp_security.h) calls CheckAuthorization from its
// AuthMetadataProcessor, the one place a token is checked.
//
// Clients send the metadata "authorization: Bearer <token>" (RFC 6750; the
// scheme is case-insensitive, exactly one space-free token follows).
#ifndef TOKENSEL_SERVER_GRPC_AUTH_TOKEN_H_
#define TOKENSEL_SERVER_GRPC_AUTH_TOKEN_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tokensel::server {

// Shortest token ReadTokenFile accepts: a guessable token is no protection.
inline constexpr size_t kMinTokenLength = 16;

// The token in `path`: tokensel::ReadBearerTokenFile (common/bearer_token.h,
// shared with the CLI) with messages starting "auth_token_file <path>", plus
// kMinTokenLength. INVALID_ARGUMENT if the file cannot be read (names the
// path and errno), is empty, shorter than kMinTokenLength, or holds
// characters that cannot travel in a header value after "Bearer " (anything
// but printable ASCII without spaces). Messages never contain the token.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Compares in time that depends only on the length of `candidate`, never on
// where it first differs from `secret` nor on `secret`'s length. `secret` must
// not be empty.
bool ConstantTimeEquals(absl::string_view secret, absl::string_view candidate);

// Checks the values of the "authorization" metadata of one call against
// `token` (non-empty):
//   no value                      -> UNAUTHENTICATED "missing authorization ..."
//   more than one value           -> UNAUTHENTICATED
//   not "Bearer <token>" (another scheme, no token, embedded spaces)
//                                 -> UNAUTHENTICATED "malformed ..."
//   a well-formed but wrong token -> PERMISSION_DENIED "invalid bearer token"
//   the right token               -> OK
// Messages never echo the received value.
absl::Status CheckAuthorization(const std::vector<absl::string_view>& values,
                                absl::string_view token);

}  // namespace tokensel::server

#endif  // TOKENSEL_SERVER_GRPC_AUTH_TOKEN_H_
