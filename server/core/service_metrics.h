// ServiceMetrics: every Prometheus metric tokensel exports, on one
// prometheus::Registry. Labels are bounded: op (the operators), backend,
// device (one per device: "cpu", "cuda:0", ...), method (the RPC names),
// code (gRPC code names). Never buffer names or client ids.
//
//   tokensel_op_duration_seconds{op,backend,device} histogram, buckets from 10 us
//   tokensel_rpc_duration_seconds{method,code}     histogram, buckets from 10 us
//   tokensel_requests_total{method,code}           counter
//   tokensel_bytes_moved_total{op}                 counter
//   tokensel_registered_buffers                    gauge
//   tokensel_registered_bytes                      gauge
//   tokensel_sessions                              gauge
//   tokensel_inflight_requests                     gauge
//   tokensel_request_memory_bytes                  gauge (MemoryBudget in use)
//   tokensel_build_info{version,backend}           gauge, always 1
//   tokensel_connections{transport}                gauge (unix, tcp, fd_channel)
//   tokensel_connections_refused_total{reason}     counter (max_connections,
//                                                  max_connections_per_peer, fd_limit)
//   tokensel_event_executes                        gauge (Executes with CUDA IPC
//                                                  events in flight: AsyncRequests)
//   tokensel_event_executes_refused_total          counter (over their caps)
//
// Thread-safe; the observe calls are lock-free after the first use of a
// label combination.
#ifndef TOKENSEL_SERVER_CORE_SERVICE_METRICS_H_
#define TOKENSEL_SERVER_CORE_SERVICE_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/mutex.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace tokensel::core {

class ServiceMetrics {
 public:
  // `devices`: the device labels ops can report (Backend::device_labels());
  // an (op, device) series exists for each from the start. Empty: one
  // device labelled like the backend.
  ServiceMetrics(absl::string_view version, absl::string_view backend,
                 std::vector<std::string> devices = {});
  ~ServiceMetrics();

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // `device`: the label of the device the op ran on (Backend::device_label()).
  void ObserveOp(absl::string_view op, absl::string_view device, double seconds,
                 uint64_t bytes_moved);
  // `code` is the canonical name, e.g. "OK", "INVALID_ARGUMENT".
  void ObserveRpc(absl::string_view method, absl::string_view code, double seconds);
  void SetRegisteredBuffers(double n);
  void SetRegisteredBytes(double bytes);
  void SetSessions(double n);
  void SetInflight(double n);
  void SetRequestMemory(double bytes);
  // `transport` and `reason` come from a small fixed set (the front end's).
  void SetConnections(absl::string_view transport, double n);
  void CountRefusedConnection(absl::string_view reason);
  void SetEventExecutes(double n);
  void CountRefusedEventExecute();

  // The histogram bucket upper bounds (seconds), 10 us .. ~10 s.
  static const std::vector<double>& LatencyBuckets();

 private:
  prometheus::Histogram& OpHistogram(absl::string_view op, absl::string_view device);
  prometheus::Counter& BytesCounter(absl::string_view op);

  const std::string backend_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>* op_duration_;
  prometheus::Family<prometheus::Histogram>* rpc_duration_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Counter>* bytes_moved_;
  prometheus::Gauge* registered_buffers_;
  prometheus::Gauge* registered_bytes_;
  prometheus::Gauge* sessions_;
  prometheus::Gauge* inflight_;
  prometheus::Gauge* request_memory_;
  prometheus::Family<prometheus::Gauge>* connections_;
  prometheus::Family<prometheus::Counter>* connections_refused_;
  prometheus::Gauge* event_executes_;
  prometheus::Counter* event_executes_refused_;

  tokensel::Mutex mu_;
  // op -> device -> series
  std::map<std::string, std::map<std::string, prometheus::Histogram*, std::less<>>, std::less<>>
      op_hist_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, prometheus::Counter*, std::less<>> op_bytes_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>,
           std::pair<prometheus::Histogram*, prometheus::Counter*>>
      rpc_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_SERVICE_METRICS_H_
