#include "server/grpc/auth_token.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tokensel::server {
namespace {

constexpr absl::string_view kScheme = "bearer ";

bool IsTokenChar(char c) { return c > ' ' && c < 0x7f; }

}  // namespace

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("auth_token_file ", path, ": cannot read: ", std::strerror(errno)));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat("auth_token_file ", path, ": read error"));
  }
  std::string token = std::string(absl::StripAsciiWhitespace(contents.str()));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("auth_token_file ", path, ": is empty"));
  }
  if (token.size() < kMinTokenLength) {
    return absl::InvalidArgumentError(absl::StrCat("auth_token_file ", path, ": token has ",
                                                   token.size(), " characters, need at least ",
                                                   kMinTokenLength));
  }
  for (size_t i = 0; i < token.size(); ++i) {
    if (!IsTokenChar(token[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "auth_token_file ", path, ": character ", i,
          " of the token is not printable ASCII (spaces and control characters cannot be "
          "sent after 'Bearer ')"));
    }
  }
  return token;
}

bool ConstantTimeEquals(absl::string_view secret, absl::string_view candidate) {
  // Walk the candidate (whose length the caller knows anyway), wrapping
  // around the secret, and fold every difference plus the length mismatch
  // into one accumulator: no early exit, no branch on secret data.
  volatile unsigned char diff = secret.size() == candidate.size() ? 0 : 1;
  for (size_t i = 0; i < candidate.size(); ++i) {
    diff = diff | static_cast<unsigned char>(candidate[i] ^ secret[i % secret.size()]);
  }
  return diff == 0;
}

absl::Status CheckAuthorization(const std::vector<absl::string_view>& values,
                                absl::string_view token) {
  if (values.empty()) {
    return absl::UnauthenticatedError(
        "missing authorization metadata: TCP clients must send 'authorization: Bearer <token>'");
  }
  if (values.size() > 1) {
    return absl::UnauthenticatedError(
        absl::StrCat("malformed authorization metadata: ", values.size(),
                     " values, expected exactly one 'Bearer <token>'"));
  }
  absl::string_view value = values[0];
  if (value.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
    return absl::UnauthenticatedError(
        "malformed authorization metadata: expected 'Bearer <token>'");
  }
  value.remove_prefix(kScheme.size());
  for (char c : value) {
    if (!IsTokenChar(c)) {
      return absl::UnauthenticatedError(
          "malformed authorization metadata: the bearer token contains spaces or control "
          "characters");
    }
  }
  if (!ConstantTimeEquals(token, value)) {
    return absl::PermissionDeniedError("invalid bearer token");
  }
  return absl::OkStatus();
}

}  // namespace tokensel::server
