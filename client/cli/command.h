// The `tokensel` subcommands: one Command per subcommand, dispatched by
// main.cc on argv[1].
//
// Flags are absl flags defined in the subcommand's .cc (shared ones in
// connection.cc and op_flags.cc). Each Command lists the flags it accepts:
// main.cc rejects any other flag before parsing (usage error, exit 2) and
// prints exactly these flags for `tokensel <cmd> --help`.
//
// Exit codes of every subcommand: 0 success, 1 failure (an RPC error, a
// failed check, a server that is not SERVING), 2 usage error.
#ifndef TOKENSEL_CLIENT_CLI_COMMAND_H_
#define TOKENSEL_CLIENT_CLI_COMMAND_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tokensel::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

struct Command {
  const char* name;
  const char* summary;             // one line, for `tokensel help`
  const char* usage;               // synopsis and description, for --help
  std::vector<std::string> flags;  // accepted flag names (without "--")
  // Runs after flag parsing; returns the exit code. Positional arguments
  // are rejected by main.cc.
  int (*run)();
};

// The registry, in `tokensel help` order.
const std::vector<Command>& Commands();

// Prints "tokensel <cmd>: <status>" to stderr (a TLS or token failure
// reworded to say which, credentials.h) and returns kExitFailure
// (kExitUsage for INVALID_ARGUMENT raised by the CLI's own flag checks is
// the caller's choice: use UsageError).
int Fail(const char* command, const absl::Status& status);
// Prints "tokensel <cmd>: <message> (see tokensel <cmd> --help)" and returns
// kExitUsage.
int UsageError(const char* command, const std::string& message);

// Whether flag `name` was given on the command line of this run (e.g.
// `demo` starts its own server unless --server was given).
bool FlagGiven(const std::string& name);

// Subcommand entry points (one file each).
extern const Command kInfoCommand;
extern const Command kHealthCommand;
extern const Command kBuffersCommand;
extern const Command kSortCommand;
extern const Command kGatherCommand;
extern const Command kScatterCommand;
extern const Command kMergeCommand;
extern const Command kPackedCommand;
extern const Command kSplitCommand;
extern const Command kSeqlensCommand;
extern const Command kTopKCommand;
extern const Command kSampleCommand;
extern const Command kBenchCommand;
extern const Command kDemoCommand;

}  // namespace tokensel::cli

#endif  // TOKENSEL_CLIENT_CLI_COMMAND_H_
