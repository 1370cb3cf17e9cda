// tokensel: the command-line client of tokensel-server.
//
//   tokensel help                     the subcommands
//   tokensel <cmd> --help             a subcommand's usage and flags
//   tokensel <cmd> [--flag=value...]
//
// Dispatches on argv[1], checks that every flag given belongs to that
// subcommand, then parses the rest with absl::ParseCommandLine.
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/command.h"
#include "client/cli/credentials.h"

namespace tokensel::cli {
namespace {

std::set<std::string>& GivenFlags() {
  static auto* given = new std::set<std::string>();
  return *given;
}

const Command* FindCommand(const std::string& name) {
  for (const Command& c : Commands()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

void PrintGeneralHelp(std::FILE* out) {
  std::fprintf(out,
               "tokensel: command-line client of tokensel-server (token selection sidecar)\n\n"
               "usage: tokensel <command> [--flag=value ...]\n"
               "       tokensel <command> --help\n\ncommands:\n");
  for (const Command& c : Commands()) std::fprintf(out, "  %-9s %s\n", c.name, c.summary);
  std::fprintf(out, "\nexit codes: 0 success, 1 failure, 2 usage error\n");
}

void PrintCommandHelp(const Command& command) {
  std::printf("usage: tokensel %s [--flag=value ...]\n\n%s\n", command.name, command.usage);
  if (command.flags.empty()) return;
  std::printf("\nflags:\n");
  for (const std::string& name : command.flags) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;  // a registry bug; listed flags are defined
    std::printf("  --%s  (default: %s)\n", name.c_str(),
                flag->DefaultValue().empty() ? "\"\"" : flag->DefaultValue().c_str());
    for (absl::string_view line : absl::StrSplit(flag->Help(), '\n')) {
      std::printf("      %.*s\n", static_cast<int>(line.size()), line.data());
    }
  }
}

bool IsHelpArg(absl::string_view arg) {
  return arg == "--help" || arg == "-help" || arg == "-h" || arg == "--helpfull" ||
         arg == "--helpshort";
}

// The flag name of `arg` ("--name=value", "-name", "--noname"), or "" when
// `arg` is not a flag.
std::string FlagName(absl::string_view arg) {
  if (arg.size() < 2 || arg[0] != '-') return "";
  arg.remove_prefix(arg[1] == '-' ? 2 : 1);
  return std::string(arg.substr(0, arg.find('=')));
}

bool Accepts(const Command& command, const std::string& name) {
  for (const std::string& f : command.flags) {
    if (f == name) return true;
    // Boolean flags may be negated as --noname.
    if (absl::StartsWith(name, "no") && name.substr(2) == f) {
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(f);
      return flag != nullptr && flag->IsOfType<bool>();
    }
  }
  return false;
}

int Main(int argc, char** argv) {
  if (argc < 2 || IsHelpArg(argv[1])) {
    PrintGeneralHelp(argc < 2 ? stderr : stdout);
    return argc < 2 ? kExitUsage : kExitOk;
  }
  const std::string name = argv[1];
  if (name == "help") {
    if (argc == 2) {
      PrintGeneralHelp(stdout);
      return kExitOk;
    }
    const Command* command = FindCommand(argv[2]);
    if (command == nullptr) {
      std::fprintf(stderr, "tokensel: unknown command '%s' (see tokensel help)\n", argv[2]);
      return kExitUsage;
    }
    PrintCommandHelp(*command);
    return kExitOk;
  }
  const Command* command = FindCommand(name);
  if (command == nullptr) {
    std::fprintf(stderr, "tokensel: unknown command '%s' (see tokensel help)\n", name.c_str());
    return kExitUsage;
  }
  std::string program = absl::StrCat("tokensel ", command->name);
  std::vector<char*> args = {program.data()};
  for (int i = 2; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (IsHelpArg(arg)) {
      PrintCommandHelp(*command);
      return kExitOk;
    }
    const std::string flag = FlagName(arg);
    if (!flag.empty() && !Accepts(*command, flag)) {
      return UsageError(command->name, absl::StrCat("unknown flag --", flag));
    }
    if (!flag.empty()) GivenFlags().insert(flag);
  }
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  absl::SetProgramUsageMessage(absl::StrCat("tokensel ", command->name, ": ", command->summary));
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (positional.size() > 1) {
    return UsageError(command->name, absl::StrCat("unexpected argument '", positional[1], "'"));
  }
  return command->run();
}

}  // namespace

const std::vector<Command>& Commands() {
  static const auto* commands = new std::vector<Command>{
      kInfoCommand,    kHealthCommand, kBuffersCommand, kSortCommand,    kGatherCommand,
      kScatterCommand, kMergeCommand,  kSplitCommand,   kSeqlensCommand, kTopKCommand,
      kSampleCommand,  kPackedCommand, kBenchCommand,   kDemoCommand};
  return *commands;
}

bool FlagGiven(const std::string& name) { return GivenFlags().count(name) > 0; }

int Fail(const char* command, const absl::Status& status) {
  const TargetSecurity* security = LastTargetSecurity();
  const absl::Status explained =
      security != nullptr ? ExplainSecurityError(status, *security) : status;
  std::fprintf(stderr, "tokensel %s: %s\n", command, explained.ToString().c_str());
  return kExitFailure;
}

int UsageError(const char* command, const std::string& message) {
  std::fprintf(stderr, "tokensel %s: %s (see tokensel %s --help)\n", command, message.c_str(),
               command);
  return kExitUsage;
}

}  // namespace tokensel::cli

int main(int argc, char** argv) { return tokensel::cli::Main(argc, argv); }
