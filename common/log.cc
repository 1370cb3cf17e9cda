#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tokensel::log {
namespace {

std::atomic<int> g_min_level{static_cast<int>(Level::kInfo)};
absl::Mutex g_write_mu;

char LevelLetter(Level level) {
  switch (level) {
    case Level::kDebug:
      return 'D';
    case Level::kInfo:
      return 'I';
    case Level::kWarning:
      return 'W';
    case Level::kError:
      return 'E';
  }
  return '?';
}

}  // namespace

void SetMinLevel(Level level) { g_min_level.store(static_cast<int>(level)); }
Level MinLevel() { return static_cast<Level>(g_min_level.load(std::memory_order_relaxed)); }

absl::StatusOr<Level> ParseLevel(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "debug") return Level::kDebug;
  if (lower == "info") return Level::kInfo;
  if (lower == "warning" || lower == "warn") return Level::kWarning;
  if (lower == "error") return Level::kError;
  return absl::InvalidArgumentError(
      absl::StrCat("log level '", name, "' is not one of debug, info, warning, error"));
}

Message::Message(Level level, const char* file, int line)
    : level_(level), file_(file), line_(line) {}

Message::~Message() {
  const char* base = std::strrchr(file_, '/');
  const std::string line =
      absl::StrCat(std::string(1, LevelLetter(level_)), " ",
                   absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::Now(), absl::UTCTimeZone()), " ",
                   base ? base + 1 : file_, ":", line_, "] ", stream_.str(), "\n");
  absl::MutexLock lock(&g_write_mu);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace tokensel::log
