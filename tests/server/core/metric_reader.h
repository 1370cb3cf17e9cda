// Reads single values out of a ServiceMetrics registry (tests only).
#ifndef TOKENSEL_TESTS_SERVER_CORE_METRIC_READER_H_
#define TOKENSEL_TESTS_SERVER_CORE_METRIC_READER_H_

#include <string>

#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "server/core/service_metrics.h"

namespace tokensel::testing {

// The series of family `name` whose label `label` equals `value` (any series
// when `label` is empty); null when absent.
inline const prometheus::ClientMetric* FindSeries(const std::vector<prometheus::MetricFamily>& all,
                                                  const std::string& name,
                                                  const std::string& label = "",
                                                  const std::string& value = "") {
  for (const prometheus::MetricFamily& family : all) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      if (label.empty()) return &m;
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == label && l.value == value) return &m;
      }
    }
  }
  return nullptr;
}

inline double GaugeValue(const core::ServiceMetrics& metrics, const std::string& name) {
  const auto all = metrics.registry()->Collect();
  const prometheus::ClientMetric* m = FindSeries(all, name);
  return m == nullptr ? -1 : m->gauge.value;
}

inline double CounterValue(const core::ServiceMetrics& metrics, const std::string& name,
                           const std::string& label, const std::string& value) {
  const auto all = metrics.registry()->Collect();
  const prometheus::ClientMetric* m = FindSeries(all, name, label, value);
  return m == nullptr ? -1 : m->counter.value;
}

inline double HistogramCount(const core::ServiceMetrics& metrics, const std::string& name,
                             const std::string& label, const std::string& value) {
  const auto all = metrics.registry()->Collect();
  const prometheus::ClientMetric* m = FindSeries(all, name, label, value);
  return m == nullptr ? -1 : static_cast<double>(m->histogram.sample_count);
}

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_SERVER_CORE_METRIC_READER_H_
