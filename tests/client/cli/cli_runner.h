// Runs the `tokensel` binary (TOKENSEL_CLI_BINARY) as a subprocess and
// collects its exit code, stdout and stderr; plus a per-test temp directory
// and a JSON parser for the CLI's --json output.
#ifndef TOKENSEL_TESTS_CLIENT_CLI_CLI_RUNNER_H_
#define TOKENSEL_TESTS_CLIENT_CLI_CLI_RUNNER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/struct.pb.h"

namespace tokensel::cli::testing {

struct CliResult {
  int exit_code = -1;  // -1: killed by a signal
  std::string out;
  std::string err;
  std::string Describe() const;  // for failure messages
};

// Runs `tokensel <args...>`; a subprocess that runs longer than
// `timeout_seconds` is killed (exit_code -1). The child gets this process'
// environment without $TOKENSEL_AUTH_TOKEN* (tests say which token they
// mean), plus `env` ("NAME=value" entries).
CliResult RunCli(const std::vector<std::string>& args, int timeout_seconds = 120,
                 const std::vector<std::string>& env = {});

// A fresh directory under /tmp, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

 private:
  std::string dir_;
};

// Parses one JSON value (google.protobuf.Value, the protobuf JSON parser).
absl::StatusOr<google::protobuf::Value> ParseJson(const std::string& json);

}  // namespace tokensel::cli::testing

#endif  // TOKENSEL_TESTS_CLIENT_CLI_CLI_RUNNER_H_
