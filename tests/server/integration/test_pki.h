// Test certificates and a token, made at test time with the `openssl` CLI
// into a private temp directory: a self-signed CA, a server certificate it
// signs for IP 127.0.0.1 and DNS localhost (EC P-256, valid 2 days), a second
// unrelated key (for mismatch tests), and a token file.
//
//   absl::StatusOr<std::unique_ptr<TestPki>> pki = TestPki::Create();
//   if (TestPki::OpensslMissing(pki.status())) GTEST_SKIP() << pki.status();
//   ... --tls_cert=pki->server_cert() --tls_key=pki->server_key()
//       --auth_token_file=pki->token_file(); clients trust pki->ca_pem() ...
#ifndef TOKENSEL_TESTS_SERVER_INTEGRATION_TEST_PKI_H_
#define TOKENSEL_TESTS_SERVER_INTEGRATION_TEST_PKI_H_

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace tokensel::itest {

class TestPki {
 public:
  static constexpr char kToken[] = "tokensel-test-token-0123456789abcdef";

  // NOT_FOUND "openssl" when the CLI is not on PATH (tests skip on it);
  // INTERNAL with openssl's output when a step fails.
  static absl::StatusOr<std::unique_ptr<TestPki>> Create() {
    if (std::system("command -v openssl >/dev/null 2>&1") != 0) {
      return absl::NotFoundError("openssl CLI not on PATH: cannot make test certificates");
    }
    char dir_template[] = "/tmp/tokensel-pki-XXXXXX";
    if (mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
    std::unique_ptr<TestPki> pki(new TestPki(dir_template));
    const std::string& d = pki->dir_;
    const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string script = absl::StrCat(
        "set -e; cd '", d, "'; exec >openssl.log 2>&1\n",
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nbasicConstraints=CA:FALSE\\n"
        "keyUsage=digitalSignature,keyEncipherment\\nextendedKeyUsage=serverAuth\\n' >ext.cnf\n",
        "openssl req -x509 ", ec,
        " -keyout ca.key -out ca.pem -days 2 -subj '/CN=tokensel test CA'\n", "openssl req ", ec,
        " -keyout server.key -out server.csr -subj '/CN=localhost'\n",
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
        "-out server.pem -days 2 -extfile ext.cnf\n",
        "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out other.key\n");
    const std::string script_path = d + "/make.sh";
    std::ofstream(script_path) << script;
    if (std::system(absl::StrCat("sh '", script_path, "'").c_str()) != 0) {
      return absl::InternalError(
          absl::StrCat("openssl failed making test certificates:\n", Read(d + "/openssl.log")));
    }
    std::ofstream(pki->token_file()) << kToken << "\n";
    pki->ca_pem_ = Read(d + "/ca.pem");
    return pki;
  }

  static bool OpensslMissing(const absl::Status& status) { return absl::IsNotFound(status); }

  ~TestPki() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TestPki(const TestPki&) = delete;
  TestPki& operator=(const TestPki&) = delete;

  const std::string& dir() const { return dir_; }
  std::string server_cert() const { return dir_ + "/server.pem"; }
  std::string server_key() const { return dir_ + "/server.key"; }
  std::string other_key() const { return dir_ + "/other.key"; }
  std::string token_file() const { return dir_ + "/token"; }
  const std::string& ca_pem() const { return ca_pem_; }

  // Writes `contents` to a new file in dir() and returns its path.
  std::string WriteFile(const std::string& name, const std::string& contents) const {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << contents;
    return path;
  }

  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
  }

 private:
  explicit TestPki(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
  std::string ca_pem_;
};

}  // namespace tokensel::itest

#endif  // TOKENSEL_TESTS_SERVER_INTEGRATION_TEST_PKI_H_
