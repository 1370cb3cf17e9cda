// Minimal logging facade (abseil 20220623 has no absl/log).
//
//   TS_LOG(INFO) << "listening on " << address;
//
// Lines go to stderr as "<level> <time> <file>:<line>] message". The threshold
// is process-wide and thread-safe; messages below it cost one atomic load.
#ifndef TOKENSEL_COMMON_LOG_H_
#define TOKENSEL_COMMON_LOG_H_

#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tokensel::log {

enum class Level : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Messages below `level` are dropped. Default: kInfo.
void SetMinLevel(Level level);
Level MinLevel();
// Parses "debug", "info", "warning" or "error" (case-insensitive).
absl::StatusOr<Level> ParseLevel(absl::string_view name);

// One log line; emitted when destroyed.
class Message {
 public:
  Message(Level level, const char* file, int line);
  ~Message();
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  Level level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

}  // namespace tokensel::log

#define TOKENSEL_LOG_LEVEL_DEBUG ::tokensel::log::Level::kDebug
#define TOKENSEL_LOG_LEVEL_INFO ::tokensel::log::Level::kInfo
#define TOKENSEL_LOG_LEVEL_WARNING ::tokensel::log::Level::kWarning
#define TOKENSEL_LOG_LEVEL_ERROR ::tokensel::log::Level::kError

#define TS_LOG(severity)                                             \
  if (TOKENSEL_LOG_LEVEL_##severity < ::tokensel::log::MinLevel()) { \
  } else                                                             \
    ::tokensel::log::Message(TOKENSEL_LOG_LEVEL_##severity, __FILE__, __LINE__).stream()

#endif  // TOKENSEL_COMMON_LOG_H_
