// LoadReport: the counters a load worker reports, as one machine-readable
// line of space-separated key=value tokens (keys sorted):
//
//   LOAD-REPORT errors=0 exhausted=0 mismatches=0 ok=41234 requests=41234
//     rpc.GatherTokens=5012 ... err.<CODE>=n ... case.GatherTokens.inline=2488 ...
//     lat_us.OK.p50=180 lat_us.OK.p99=2100 lat_us.OK.max=9000 ...
//
//   requests     every RPC the worker issued (a Stream counts once)
//   ok           RPCs that succeeded AND whose results matched the oracle
//   mismatches   RPCs that succeeded with a result differing from the oracle
//                (region bytes or inline outputs), or refused ones that
//                changed the region anyway
//   errors       unexpected non-OK answers (RPC status or Stream message
//                code); err.<CODE> counts every non-OK answer by code
//   exhausted    RESOURCE_EXHAUSTED answers when the worker was told they
//                are expected (back-pressure runs); not in `errors`
//   rpc.<Method> RPCs per method (as tokensel_requests_total{method} counts)
//   case.<Op>.{ref,inline}, case.<Pipeline>  what was sent
//   stream_msgs  requests sent inside Streams
//   lat_us.<CODE>.{p50,p99,max,min}  latency of request-carrying RPCs
//
// Header-only; not thread-safe (one report per thread, merged at the end).
#ifndef TOKENSEL_TESTS_LOAD_LOAD_REPORT_H_
#define TOKENSEL_TESTS_LOAD_LOAD_REPORT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace tokensel::load {

inline constexpr char kReportPrefix[] = "LOAD-REPORT";

class LoadReport {
 public:
  void Add(absl::string_view key, int64_t n = 1) { counters_[std::string(key)] += n; }
  void Set(absl::string_view key, int64_t n) { counters_[std::string(key)] = n; }
  int64_t Get(absl::string_view key) const {
    auto it = counters_.find(std::string(key));
    return it == counters_.end() ? 0 : it->second;
  }
  // Sums every counter (lat_us.* are not sums: merge those before reporting).
  void Merge(const LoadReport& other) {
    for (const auto& [key, n] : other.counters_) counters_[key] += n;
  }
  // The counters whose key starts with `prefix`, keyed by the rest.
  std::map<std::string, int64_t> WithPrefix(absl::string_view prefix) const {
    std::map<std::string, int64_t> out;
    for (const auto& [key, n] : counters_) {
      absl::string_view rest = key;
      if (absl::ConsumePrefix(&rest, prefix)) out[std::string(rest)] = n;
    }
    return out;
  }
  const std::map<std::string, int64_t>& counters() const { return counters_; }

  std::string ToLine() const {
    std::string line = kReportPrefix;
    for (const auto& [key, n] : counters_) absl::StrAppend(&line, " ", key, "=", n);
    return line;
  }
  // nullopt unless `line` is a ToLine() output.
  static std::optional<LoadReport> Parse(absl::string_view line) {
    line = absl::StripAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&line, kReportPrefix)) return std::nullopt;
    LoadReport report;
    for (absl::string_view token : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      const size_t eq = token.find('=');
      int64_t n = 0;
      if (eq == absl::string_view::npos || !absl::SimpleAtoi(token.substr(eq + 1), &n)) {
        return std::nullopt;
      }
      report.Set(token.substr(0, eq), n);
    }
    return report;
  }

 private:
  std::map<std::string, int64_t> counters_;
};

}  // namespace tokensel::load

#endif  // TOKENSEL_TESTS_LOAD_LOAD_REPORT_H_
