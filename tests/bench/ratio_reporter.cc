#include "tests/bench/ratio_reporter.h"

#include <cstdio>

namespace tokensel::bench {
namespace {

double ToNs(double t, benchmark::TimeUnit unit) {
  switch (unit) {
    case benchmark::kNanosecond:
      return t;
    case benchmark::kMicrosecond:
      return t * 1e3;
    case benchmark::kMillisecond:
      return t * 1e6;
    case benchmark::kSecond:
      return t * 1e9;
  }
  return t;
}

// Drops the components Google Benchmark appends to a registered name
// ("/real_time", "/threads:2", "/repeats:5", ...), leaving "<case>/<variant>".
std::string CaseName(std::string name) {
  static constexpr const char* kSuffixes[] = {"real_time", "manual_time", "process_time"};
  static constexpr const char* kPrefixes[] = {
      "threads:", "repeats:", "iterations:", "min_time:", "min_warmup_time:"};
  for (;;) {
    const size_t slash = name.rfind('/');
    if (slash == std::string::npos) return name;
    const std::string last = name.substr(slash + 1);
    bool strip = false;
    for (const char* s : kSuffixes) strip |= last == s;
    for (const char* p : kPrefixes) strip |= last.rfind(p, 0) == 0;
    if (!strip) return name;
    name.resize(slash);
  }
}

}  // namespace

void RatioReporter::ReportRuns(const std::vector<Run>& runs) {
  ConsoleReporter::ReportRuns(runs);
  for (const Run& run : runs) {
    if (run.error_occurred) continue;
    const bool is_aggregate = run.run_type == Run::RT_Aggregate;
    // Use medians when repetitions produced aggregates, else the single run.
    if (is_aggregate ? run.aggregate_name != "median" : run.repetitions > 1) continue;
    const std::string name = CaseName(run.run_name.str());
    const size_t slash = name.rfind('/');
    if (slash == std::string::npos) continue;
    const std::string key = name.substr(0, slash);
    if (!cases_.count(key)) case_order_.push_back(key);
    Entry e;
    e.variant = name.substr(slash + 1);
    e.real_time_ns = ToNs(run.GetAdjustedRealTime(), run.time_unit);
    for (const auto& [k, c] : run.counters) {
      // Rates are visible in the main table; keep the custom counters.
      if (k != "bytes_per_second" && k != "items_per_second") e.counters[k] = c.value;
    }
    cases_[key].push_back(std::move(e));
  }
}

void RatioReporter::Finalize() {
  ConsoleReporter::Finalize();
  std::printf(
      "\nRatios against the (first) baseline of each case (baseline_time / time; >1 = faster)\n");
  std::printf("%-44s %-22s %14s %9s\n", "case", "variant", "time (us)", "ratio");
  for (const std::string& key : case_order_) {
    const auto& entries = cases_[key];
    double base = 0;
    for (const Entry& e : entries) {
      if (base == 0 && e.variant.rfind("baseline", 0) == 0) base = e.real_time_ns;
    }
    for (const Entry& e : entries) {
      if (base > 0) {
        std::printf("%-44s %-22s %14.2f %8.2fx\n", key.c_str(), e.variant.c_str(),
                    e.real_time_ns / 1e3, base / e.real_time_ns);
      } else {
        std::printf("%-44s %-22s %14.2f %9s\n", key.c_str(), e.variant.c_str(),
                    e.real_time_ns / 1e3, "-");
      }
      for (const auto& [k, v] : e.counters) {
        std::printf("%-44s   %-20s %14.6g\n", "", k.c_str(), v);
      }
    }
  }
  std::fflush(stdout);
}

}  // namespace tokensel::bench
