#include "client/cli/credentials.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cli/command.h"
#include "common/bearer_token.h"
#include "common/errno_string.h"

ABSL_FLAG(bool, tls, false,
          "TCP: TLS, verified against the system roots unless --tls_ca is given. Implied by\n"
          "--tls_ca, --tls_server_name, a token or an https:// target; --tls=false forces\n"
          "plaintext (for a server started with --insecure_tcp)");
ABSL_FLAG(std::string, tls_ca, "",
          "TCP: PEM file of the CA(s) that signed the server's certificate (turns TLS on);\n"
          "empty = the system roots");
ABSL_FLAG(std::string, tls_server_name, "",
          "TCP: the name the server's certificate must carry, when it is not the target's\n"
          "host (e.g. dialing an IP address or a tunnel); turns TLS on");
ABSL_FLAG(std::string, auth_token_file, "",
          "TCP: file holding the bearer token of the server's --auth_token_file (needs TLS;\n"
          "turns it on). Else $TOKENSEL_AUTH_TOKEN_FILE (a file), else $TOKENSEL_AUTH_TOKEN\n"
          "(the token); ignored for unix:// targets");

namespace tokensel::cli {
namespace {

std::optional<TargetSecurity>& LastSecurity() {
  static auto* last = new std::optional<TargetSecurity>();
  return *last;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cannot read: ", ErrnoString(errno)));
  }
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// The token in `path` (named `source` in messages, which never quote it);
// warns once if others may read the file.
absl::StatusOr<std::string> ReadToken(const std::string& source, const std::string& path) {
  // Once per process: bench connects once per worker.
  static bool warned = false;
  struct stat st;
  if (!warned && stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    warned = true;
    std::fprintf(stderr,
                 "tokensel: warning: token file %s may be read by others (mode %04o); "
                 "chmod 600 it\n",
                 path.c_str(), static_cast<unsigned>(st.st_mode & 07777));
  }
  return ReadBearerTokenFile(source, path);
}

// The token from the flag, else the environment; empty token_source = none.
absl::Status FindToken(TargetSecurity* security) {
  const std::string flag = absl::GetFlag(FLAGS_auth_token_file);
  const char* file_env = std::getenv(kTokenFileEnv);
  const char* token_env = std::getenv(kTokenEnv);
  std::string path;  // the token file, when the token comes from one
  if (!flag.empty()) {
    path = flag;
    security->token_source = absl::StrCat("--auth_token_file=", flag);
  } else if (file_env != nullptr && *file_env != '\0') {
    path = file_env;
    security->token_source = absl::StrCat("$", kTokenFileEnv, "=", file_env);
  } else if (token_env != nullptr && *token_env != '\0') {
    security->token_source = absl::StrCat("$", kTokenEnv);
    security->token = std::string(absl::StripAsciiWhitespace(token_env));
    return CheckBearerToken(security->token_source, security->token);
  } else {
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> token = ReadToken(security->token_source, path);
  if (!token.ok()) return token.status();
  security->token = *std::move(token);
  return absl::OkStatus();
}

// What gRPC's UNAVAILABLE says about a failed TLS handshake (its words
// differ between versions and TLS libraries: OpenSSL here, BoringSSL in
// Python's grpcio), in lower case.
enum class TlsFailure { kNone, kUntrustedCa, kWrongName, kNotTls, kOther };

TlsFailure ClassifyTlsFailure(absl::string_view message) {
  const std::string m = absl::AsciiStrToLower(message);
  auto has = [&m](absl::string_view s) { return absl::StrContains(m, s); };
  if (has("verify failed") || has("verify_failed")) return TlsFailure::kUntrustedCa;
  if (has("not in peer certificate") || has("hostname verification")) {
    return TlsFailure::kWrongName;
  }
  if (has("wrong version number") || has("wrong_version_number")) return TlsFailure::kNotTls;
  for (absl::string_view marker : {"handshake", "ssl", "certificate", "tls", "tsi_", "security"}) {
    if (has(marker)) return TlsFailure::kOther;
  }
  return TlsFailure::kNone;
}

}  // namespace

std::vector<std::string> SecurityFlags() {
  return {"tls", "tls_ca", "tls_server_name", "auth_token_file"};
}

absl::StatusOr<TargetSecurity> ResolveSecurity(const std::string& target) {
  TargetSecurity security;
  const std::string ca_file = absl::GetFlag(FLAGS_tls_ca);
  const std::string server_name = absl::GetFlag(FLAGS_tls_server_name);
  const bool tls_flag = absl::GetFlag(FLAGS_tls);
  const bool tls_forced_off = FlagGiven("tls") && !tls_flag;
  const bool tls_flags_given = tls_flag || !ca_file.empty() || !server_name.empty() ||
                               !absl::GetFlag(FLAGS_auth_token_file).empty();
  security.target = target;
  if (absl::StartsWith(target, "unix:")) {
    if (tls_flags_given) {
      return absl::InvalidArgumentError(
          "--tls, --tls_ca, --tls_server_name and --auth_token_file apply to TCP targets; "
          "a unix socket is authenticated by its file mode");
    }
    return security;
  }
  security.tcp = true;
  std::optional<bool> scheme_tls;
  for (const auto& [scheme, tls] : {std::pair<absl::string_view, bool>{"https://", true},
                                    std::pair<absl::string_view, bool>{"http://", false}}) {
    if (absl::StartsWith(security.target, scheme)) {
      security.target.erase(0, scheme.size());
      scheme_tls = tls;
    }
  }
  if (!security.target.empty() && security.target.back() == '/') security.target.pop_back();
  if (security.target.empty()) return absl::InvalidArgumentError("--server has no host:port");

  if (tls_forced_off || scheme_tls == false) {  // plaintext; an environment token is not sent
    if (tls_flags_given) {
      return absl::InvalidArgumentError(absl::StrCat(
          tls_forced_off ? "--tls=false" : "an http:// target",
          " asks for plaintext, but --tls_ca, --tls_server_name or --auth_token_file was given "
          "(a token is never sent in clear)"));
    }
    return security;
  }
  absl::Status token_status = FindToken(&security);
  if (!token_status.ok()) return token_status;
  security.tls = scheme_tls == true || tls_flags_given || !security.token.empty();
  if (!security.tls) return security;
  security.server_name = server_name;
  security.ca_source = "the system roots";
  if (!ca_file.empty()) {
    security.ca_source = absl::StrCat("--tls_ca=", ca_file);
    absl::StatusOr<std::string> pem = ReadSmallFile(security.ca_source, ca_file);
    if (!pem.ok()) return pem.status();
    if (!absl::StrContains(*pem, "-----BEGIN CERTIFICATE-----")) {
      return absl::InvalidArgumentError(
          absl::StrCat(security.ca_source, ": no PEM certificate (-----BEGIN CERTIFICATE-----)"));
    }
    security.ca_pem = *std::move(pem);
  }
  return security;
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const TargetSecurity& security,
                                                                grpc::ChannelArguments* args) {
  if (!security.tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = security.ca_pem;
  if (!security.server_name.empty()) args->SetSslTargetNameOverride(security.server_name);
  return grpc::SslCredentials(ssl);
}

absl::Status ExplainSecurityError(const absl::Status& status, const TargetSecurity& security) {
  if (!security.tcp || status.ok()) return status;
  const std::string said = absl::StrCat(" (", status.message(), ")");
  const std::string name =
      security.server_name.empty() ? "the target's host" : "'" + security.server_name + "'";
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
      if (const TlsFailure failure = ClassifyTlsFailure(status.message());
          security.tls && failure != TlsFailure::kNone) {
        std::string why;
        switch (failure) {
          case TlsFailure::kUntrustedCa:
            why = absl::StrCat("the server's certificate is not signed by a CA of ",
                               security.ca_source, " (--tls_ca)");
            break;
          case TlsFailure::kWrongName:
            why = absl::StrCat("the server's certificate does not name ", name,
                               " (--tls_server_name)");
            break;
          case TlsFailure::kNotTls:
            why =
                "the port does not speak TLS (a server started with --insecure_tcp? then "
                "--tls=false, and no token)";
            break;
          default:
            why = absl::StrCat("the server's certificate is not signed by a CA of ",
                               security.ca_source, ", does not name ", name,
                               ", or the port does not speak TLS");
        }
        return absl::UnavailableError(
            absl::StrCat("TLS handshake with ", security.target, " failed: ", why, said));
      }
      // A TLS port drops a plaintext client's connection ("Socket closed").
      if (!security.tls &&
          (absl::StrContains(absl::AsciiStrToLower(status.message()), "socket closed") ||
           absl::StrContains(absl::AsciiStrToLower(status.message()), "connection reset"))) {
        return absl::UnavailableError(
            absl::StrCat("plaintext connection to ", security.target,
                         " failed; a server with TLS needs "
                         "--tls_ca=<CA file> (or --tls for the system roots) and --auth_token_file",
                         said));
      }
      return status;
    case absl::StatusCode::kUnauthenticated:
      if (security.token_source.empty()) {
        return absl::UnauthenticatedError(absl::StrCat(
            "bearer token missing: the server wants one; pass --auth_token_file=<file> or set $",
            kTokenFileEnv, said));
      }
      return absl::UnauthenticatedError(
          absl::StrCat("bearer token from ", security.token_source, " not accepted as one", said));
    case absl::StatusCode::kPermissionDenied:
      if (!security.token_source.empty() &&
          absl::StrContains(status.message(), "invalid bearer token")) {
        return absl::PermissionDeniedError(absl::StrCat(
            "wrong bearer token: the server refused the token from ", security.token_source, said));
      }
      return status;
    default:
      return status;
  }
}

const TargetSecurity* LastTargetSecurity() {
  return LastSecurity().has_value() ? &*LastSecurity() : nullptr;
}

void SetLastTargetSecurity(const TargetSecurity& security) { LastSecurity() = security; }

}  // namespace tokensel::cli
