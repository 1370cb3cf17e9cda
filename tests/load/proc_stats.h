// Resource readings of another process from /proc, for the load test:
// resident memory by kind (/proc/<pid>/status), open descriptors
// (/proc/<pid>/fd) and mappings of files whose path contains a string
// (/proc/<pid>/maps, e.g. "/dev/shm/tokensel-it-..."). Linux only; needs the
// same uid as the target (or ptrace rights). Header-only.
#ifndef TOKENSEL_TESTS_LOAD_PROC_STATS_H_
#define TOKENSEL_TESTS_LOAD_PROC_STATS_H_

#include <dirent.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace tokensel::load {

struct MemoryStatus {
  int64_t rss_kb = 0;    // VmRSS = anon + file + shmem
  int64_t anon_kb = 0;   // RssAnon: heap, stacks
  int64_t file_kb = 0;   // RssFile: the binary and libraries
  int64_t shmem_kb = 0;  // RssShmem: mapped POSIX shm regions (clients' buffers)
  int64_t threads = 0;
};

inline absl::StatusOr<MemoryStatus> ReadMemoryStatus(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  if (!in) return absl::NotFoundError(absl::StrCat("/proc/", pid, "/status"));
  MemoryStatus s;
  const std::pair<absl::string_view, int64_t*> fields[] = {{"VmRSS:", &s.rss_kb},
                                                           {"RssAnon:", &s.anon_kb},
                                                           {"RssFile:", &s.file_kb},
                                                           {"RssShmem:", &s.shmem_kb},
                                                           {"Threads:", &s.threads}};
  std::string line;
  int found = 0;
  while (std::getline(in, line)) {
    for (const auto& [key, out] : fields) {
      absl::string_view rest = line;
      if (!absl::ConsumePrefix(&rest, key)) continue;
      rest = absl::StripAsciiWhitespace(rest);
      absl::ConsumeSuffix(&rest, " kB");
      if (absl::SimpleAtoi(rest, out)) ++found;
    }
  }
  if (found != 5)
    return absl::InternalError(absl::StrCat("/proc/", pid, "/status: fields missing"));
  return s;
}

// The targets of the process' open descriptors ("socket:[123]",
// "/dev/null", "anon_inode:[eventpoll]", ...).
inline absl::StatusOr<std::vector<std::string>> OpenFds(pid_t pid) {
  const std::string dir = absl::StrCat("/proc/", pid, "/fd");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrCat(dir, ": ", std::strerror(errno)));
  std::vector<std::string> targets;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char buf[512];
    const ssize_t n = readlink(absl::StrCat(dir, "/", e->d_name).c_str(), buf, sizeof(buf) - 1);
    targets.emplace_back(n > 0 ? std::string(buf, static_cast<size_t>(n)) : "?");
  }
  closedir(d);
  return targets;
}

// Mapped ranges whose path contains `needle`.
inline absl::StatusOr<int> CountMappings(pid_t pid, absl::string_view needle) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/maps"));
  if (!in) return absl::NotFoundError(absl::StrCat("/proc/", pid, "/maps"));
  int n = 0;
  std::string line;
  while (std::getline(in, line)) n += absl::StrContains(line, needle) ? 1 : 0;
  return n;
}

}  // namespace tokensel::load

#endif  // TOKENSEL_TESTS_LOAD_PROC_STATS_H_
