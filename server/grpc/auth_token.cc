#include "server/grpc/auth_token.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/bearer_token.h"

namespace tokensel::server {
namespace {

constexpr absl::string_view kScheme = "bearer ";

}  // namespace

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  return ReadBearerTokenFile(absl::StrCat("auth_token_file ", path), path, kMinTokenLength);
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
    if (!IsBearerTokenChar(c)) {
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
