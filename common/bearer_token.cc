#include "common/bearer_token.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/errno_string.h"

namespace tokensel {

absl::Status CheckBearerToken(absl::string_view source, absl::string_view token,
                              size_t min_length) {
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": the token is empty"));
  }
  if (token.size() < min_length) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": token has ", token.size(),
                                                   " characters, need at least ", min_length));
  }
  for (size_t i = 0; i < token.size(); ++i) {
    if (!IsBearerTokenChar(token[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": character ", i,
          " of the token is not printable ASCII (spaces and control characters cannot be sent "
          "after 'Bearer ')"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadBearerTokenFile(absl::string_view source, const std::string& path,
                                                size_t min_length) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": cannot read: ", ErrnoString(errno)));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat(source, ": read error"));
  std::string token(absl::StripAsciiWhitespace(contents.str()));
  if (absl::Status s = CheckBearerToken(source, token, min_length); !s.ok()) return s;
  return token;
}

}  // namespace tokensel
