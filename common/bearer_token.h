// Bearer tokens as files hold them: the one reading and validation shared by
// the server (--auth_token_file, server/grpc/auth_token.h) and the CLI
// (client/cli/credentials.h), so both accept and refuse the same tokens with
// the same words.
//
// A token travels as "authorization: Bearer <token>", so it must be printable
// ASCII without spaces. Messages start with `source` (what the caller calls
// the token: "auth_token_file <path>", "$TOKENSEL_AUTH_TOKEN", ...) and never
// contain the token itself.
#ifndef TOKENSEL_COMMON_BEARER_TOKEN_H_
#define TOKENSEL_COMMON_BEARER_TOKEN_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tokensel {

// A character that can follow "Bearer " in a header value: printable ASCII
// other than space.
inline bool IsBearerTokenChar(char c) { return c > ' ' && c < 0x7f; }

// INVALID_ARGUMENT "<source>: the token is empty", "<source>: token has N
// characters, need at least <min_length>" or "<source>: character i of the
// token is not printable ASCII (...)"; OK otherwise.
absl::Status CheckBearerToken(absl::string_view source, absl::string_view token,
                              size_t min_length = 0);

// The token in the file `path`: its whole contents with surrounding
// whitespace (the trailing newline editors and `kubectl create secret
// --from-file` add) trimmed, then CheckBearerToken. INVALID_ARGUMENT
// "<source>: cannot read: <errno text>" if the file cannot be read.
absl::StatusOr<std::string> ReadBearerTokenFile(absl::string_view source, const std::string& path,
                                                size_t min_length = 0);

}  // namespace tokensel

#endif  // TOKENSEL_COMMON_BEARER_TOKEN_H_
