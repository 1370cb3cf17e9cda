#include "server/core/service_metrics.h"

#include <string>
#include <utility>
#include <vector>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/core/request.h"

namespace tokensel::core {

const std::vector<double>& ServiceMetrics::LatencyBuckets() {
  static const std::vector<double> buckets = {
      10e-6, 25e-6,  50e-6, 100e-6, 250e-6, 500e-6,  // microseconds
      1e-3,  2.5e-3, 5e-3,  10e-3,  25e-3,  50e-3,  100e-3, 250e-3, 500e-3, 1.0, 2.5, 5.0, 10.0};
  return buckets;
}

ServiceMetrics::ServiceMetrics(absl::string_view version, absl::string_view backend,
                               std::vector<std::string> devices)
    : backend_(backend), registry_(std::make_shared<prometheus::Registry>()) {
  if (devices.empty()) devices.push_back(backend_);
  op_duration_ = &prometheus::BuildHistogram()
                      .Name("tokensel_op_duration_seconds")
                      .Help("Time to execute one operator on the backend, in seconds.")
                      .Register(*registry_);
  rpc_duration_ = &prometheus::BuildHistogram()
                       .Name("tokensel_rpc_duration_seconds")
                       .Help(
                           "Server-side latency of an RPC, by method and status code, in "
                           "seconds.")
                       .Register(*registry_);
  requests_ = &prometheus::BuildCounter()
                   .Name("tokensel_requests_total")
                   .Help("RPCs finished, by method and status code.")
                   .Register(*registry_);
  bytes_moved_ = &prometheus::BuildCounter()
                      .Name("tokensel_bytes_moved_total")
                      .Help("Bytes read plus written by operators, by operator.")
                      .Register(*registry_);
  auto gauge = [this](const char* name, const char* help) -> prometheus::Gauge& {
    return prometheus::BuildGauge().Name(name).Help(help).Register(*registry_).Add({});
  };
  registered_buffers_ =
      &gauge("tokensel_registered_buffers", "Buffers currently registered, across all sessions.");
  registered_bytes_ = &gauge("tokensel_registered_bytes",
                             "Bytes of the buffers currently registered, across all sessions.");
  sessions_ = &gauge("tokensel_sessions", "Sessions currently open.");
  inflight_ = &gauge("tokensel_inflight_requests", "Requests currently being served.");
  event_executes_ = &gauge("tokensel_event_executes",
                           "Executes with CUDA IPC events answered before their device work "
                           "completed, or waiting on a client event.");
  event_executes_refused_ = &prometheus::BuildCounter()
                                 .Name("tokensel_event_executes_refused_total")
                                 .Help("Executes with CUDA IPC events refused over their caps.")
                                 .Register(*registry_)
                                 .Add({});
  request_memory_ = &gauge("tokensel_request_memory_bytes",
                           "Memory reserved by requests in flight (staging, scratch, results).");
  connections_ = &prometheus::BuildGauge()
                      .Name("tokensel_connections")
                      .Help("Connections currently open, by transport (unix, tcp, fd_channel).")
                      .Register(*registry_);
  connections_refused_ = &prometheus::BuildCounter()
                              .Name("tokensel_connections_refused_total")
                              .Help(
                                  "Connections closed at accept, by reason (max_connections, "
                                  "max_connections_per_peer, fd_limit).")
                              .Register(*registry_);
  for (const char* reason : {"max_connections", "max_connections_per_peer", "fd_limit"}) {
    connections_refused_->Add({{"reason", reason}});
  }
  prometheus::BuildGauge()
      .Name("tokensel_build_info")
      .Help("Always 1; the labels carry the server version and the active backend.")
      .Register(*registry_)
      .Add({{"version", std::string(version)}, {"backend", backend_}})
      .Set(1);

  tokensel::MutexLock lock(&mu_);
  // The (op, device) label values, pre-created so every series exists from
  // start-up.
  for (absl::string_view op : AllOpNames()) {
    const std::string name(op);
    for (const std::string& device : devices) {
      op_hist_[name].emplace(
          device, &op_duration_->Add({{"op", name}, {"backend", backend_}, {"device", device}},
                                     LatencyBuckets()));
    }
    op_bytes_.emplace(name, &bytes_moved_->Add({{"op", name}}));
  }
}

ServiceMetrics::~ServiceMetrics() = default;

prometheus::Histogram& ServiceMetrics::OpHistogram(absl::string_view op, absl::string_view device) {
  {
    tokensel::ReaderMutexLock lock(&mu_);
    if (auto it = op_hist_.find(op); it != op_hist_.end()) {
      if (auto d = it->second.find(device); d != it->second.end()) return *d->second;
    }
  }
  tokensel::MutexLock lock(&mu_);
  const std::string name(op);
  auto [it, inserted] = op_hist_[name].try_emplace(std::string(device), nullptr);
  if (inserted) {
    it->second = &op_duration_->Add(
        {{"op", name}, {"backend", backend_}, {"device", std::string(device)}}, LatencyBuckets());
  }
  return *it->second;
}

prometheus::Counter& ServiceMetrics::BytesCounter(absl::string_view op) {
  {
    tokensel::ReaderMutexLock lock(&mu_);
    if (auto it = op_bytes_.find(op); it != op_bytes_.end()) return *it->second;
  }
  tokensel::MutexLock lock(&mu_);
  const std::string name(op);
  auto [it, inserted] = op_bytes_.try_emplace(name, nullptr);
  if (inserted) it->second = &bytes_moved_->Add({{"op", name}});
  return *it->second;
}

void ServiceMetrics::ObserveOp(absl::string_view op, absl::string_view device, double seconds,
                               uint64_t bytes_moved) {
  OpHistogram(op, device).Observe(seconds);
  BytesCounter(op).Increment(static_cast<double>(bytes_moved));
}

void ServiceMetrics::ObserveRpc(absl::string_view method, absl::string_view code, double seconds) {
  const std::pair<std::string, std::string> key{std::string(method), std::string(code)};
  std::pair<prometheus::Histogram*, prometheus::Counter*> series(nullptr, nullptr);
  {
    tokensel::ReaderMutexLock lock(&mu_);
    if (auto it = rpc_.find(key); it != rpc_.end()) series = it->second;
  }
  if (series.first == nullptr) {
    tokensel::MutexLock lock(&mu_);
    auto [it, inserted] = rpc_.try_emplace(key, nullptr, nullptr);
    if (inserted) {
      const prometheus::Labels labels = {{"method", key.first}, {"code", key.second}};
      it->second = {&rpc_duration_->Add(labels, LatencyBuckets()), &requests_->Add(labels)};
    }
    series = it->second;
  }
  series.first->Observe(seconds);
  series.second->Increment();
}

void ServiceMetrics::SetRegisteredBuffers(double n) { registered_buffers_->Set(n); }
void ServiceMetrics::SetRegisteredBytes(double bytes) { registered_bytes_->Set(bytes); }
void ServiceMetrics::SetSessions(double n) { sessions_->Set(n); }
void ServiceMetrics::SetInflight(double n) { inflight_->Set(n); }
void ServiceMetrics::SetRequestMemory(double bytes) { request_memory_->Set(bytes); }

// Family::Add returns the existing series; connection events are rare next
// to RPCs, so the lookup is not worth a cache.
void ServiceMetrics::SetConnections(absl::string_view transport, double n) {
  connections_->Add({{"transport", std::string(transport)}}).Set(n);
}
void ServiceMetrics::SetEventExecutes(double n) { event_executes_->Set(n); }
void ServiceMetrics::CountRefusedEventExecute() { event_executes_refused_->Increment(); }

void ServiceMetrics::CountRefusedConnection(absl::string_view reason) {
  connections_refused_->Add({{"reason", std::string(reason)}}).Increment();
}

}  // namespace tokensel::core
