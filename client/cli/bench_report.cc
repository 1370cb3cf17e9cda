#include "client/cli/bench_report.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/json.h"

namespace tokensel::cli {
namespace {

double PerSecond(double n, double seconds) { return seconds > 0 ? n / seconds : 0; }

std::string OpJson(const OpResult& r, double seconds) {
  const auto& l = r.latency_us;
  std::vector<std::string> errors;
  for (const auto& [code, n] : r.errors) errors.push_back(absl::StrCat(JsonString(code), ":", n));
  return absl::StrFormat(
      "{\"count\":%d,\"ops_per_s\":%.3f,\"p50_us\":%.3f,\"p90_us\":%.3f,\"p99_us\":%.3f,"
      "\"p999_us\":%.3f,\"max_us\":%.3f,\"mean_us\":%.3f,\"bytes_per_s\":%.1f,\"error_count\":%d,"
      "\"errors\":{%s}}",
      l.count(), PerSecond(static_cast<double>(l.count()), seconds), l.Percentile(0.5),
      l.Percentile(0.9), l.Percentile(0.99), l.Percentile(0.999), l.Max(), l.Mean(),
      PerSecond(static_cast<double>(r.bytes), seconds), r.error_count(),
      absl::StrJoin(errors, ","));
}

std::string Row(absl::string_view name, const OpResult& r, double seconds) {
  const auto& l = r.latency_us;
  return absl::StrFormat("%-8s %9d %10.1f %9.1f %9.1f %9.1f %9.1f %9.1f %10.1f %7d\n", name,
                         l.count(), PerSecond(static_cast<double>(l.count()), seconds),
                         l.Percentile(0.5), l.Percentile(0.9), l.Percentile(0.99),
                         l.Percentile(0.999), l.Max(),
                         PerSecond(static_cast<double>(r.bytes), seconds) / 1e6, r.error_count());
}

}  // namespace

int64_t OpResult::error_count() const {
  int64_t n = 0;
  for (const auto& [code, count] : errors) n += count;
  return n;
}

void OpResult::Merge(const OpResult& other) {
  latency_us.Merge(other.latency_us);
  for (const auto& [code, n] : other.errors) errors[code] += n;
  bytes += other.bytes;
}

OpResult PhaseResult::Total() const {
  OpResult total;
  for (const auto& [op, r] : ops) total.Merge(r);
  return total;
}

std::string FormatText(const BenchConfig& c, const PhaseResult& result,
                       const std::optional<PhaseResult>& baseline) {
  const BenchShapes& s = c.shapes;
  std::string out = absl::StrFormat(
      "tokensel bench: %s, %s, concurrency %d, %s, mix %s\n"
      "shapes: B=%d S=%d R=%d C=%d %s L=%d NS=%d; measured %.2f s\n",
      c.target, c.by_reference ? "by reference (shm)" : "inline", c.concurrency,
      c.rate > 0 ? absl::StrFormat("open loop %.1f ops/s", c.rate) : "closed loop", c.mix, s.batch,
      s.seq, s.retained, s.channels, kernels::DTypeName(s.dtype), s.layers, s.segments,
      result.seconds);
  absl::StrAppend(
      &out, absl::StrFormat("%-8s %9s %10s %9s %9s %9s %9s %9s %10s %7s\n", "op", "count", "ops/s",
                            "p50 us", "p90 us", "p99 us", "p999 us", "max us", "MB/s", "errors"));
  for (const auto& [op, r] : result.ops)
    absl::StrAppend(&out, Row(BenchOpName(op), r, result.seconds));
  const OpResult total = result.Total();
  if (result.ops.size() > 1) absl::StrAppend(&out, Row("total", total, result.seconds));
  for (const auto& [code, n] : total.errors) absl::StrAppend(&out, "errors: ", code, " x", n, "\n");
  if (baseline.has_value()) {
    const OpResult ping = baseline->Total();
    const double p50 = ping.latency_us.Percentile(0.5);
    absl::StrAppend(
        &out, absl::StrFormat("baseline Ping: %d calls, p50 %.1f us, p99 %.1f us\n",
                              ping.latency_us.count(), p50, ping.latency_us.Percentile(0.99)));
    for (const auto& [op, r] : result.ops) {
      absl::StrAppend(&out,
                      absl::StrFormat("overhead ratio %s p50 / ping p50 = %.2f\n", BenchOpName(op),
                                      p50 > 0 ? r.latency_us.Percentile(0.5) / p50 : 0.0));
    }
  }
  return out;
}

std::string FormatJson(const BenchConfig& c, const PhaseResult& result,
                       const std::optional<PhaseResult>& baseline) {
  const BenchShapes& s = c.shapes;
  std::string out = absl::StrFormat(
      "{\"config\":{\"target\":%s,\"by_reference\":%s,\"concurrency\":%d,\"rate\":%.3f,"
      "\"mix\":%s,\"batch\":%d,\"seq\":%d,\"retained\":%d,\"channels\":%d,\"dtype\":%s,"
      "\"layers\":%d,\"segments\":%d},\"seconds\":%.6f,\"ops\":{",
      JsonString(c.target), c.by_reference ? "true" : "false", c.concurrency, c.rate,
      JsonString(c.mix), s.batch, s.seq, s.retained, s.channels,
      JsonString(kernels::DTypeName(s.dtype)), s.layers, s.segments, result.seconds);
  std::vector<std::string> ops;
  for (const auto& [op, r] : result.ops) {
    ops.push_back(absl::StrCat(JsonString(BenchOpName(op)), ":", OpJson(r, result.seconds)));
  }
  absl::StrAppend(&out, absl::StrJoin(ops, ","),
                  "},\"total\":", OpJson(result.Total(), result.seconds));
  if (baseline.has_value()) {
    const OpResult ping = baseline->Total();
    const double p50 = ping.latency_us.Percentile(0.5);
    std::vector<std::string> ratios;
    for (const auto& [op, r] : result.ops) {
      ratios.push_back(absl::StrFormat("%s:%.4f", JsonString(BenchOpName(op)),
                                       p50 > 0 ? r.latency_us.Percentile(0.5) / p50 : 0.0));
    }
    absl::StrAppend(&out, ",\"baseline\":{\"ping\":", OpJson(ping, baseline->seconds),
                    ",\"ratio_p50\":{", absl::StrJoin(ratios, ","), "}}");
  }
  absl::StrAppend(&out, "}");
  return out;
}

}  // namespace tokensel::cli
