// ServerDescription: what GetServerInfo reports about a running server — its
// version, backend and devices, and every limit a client must respect.
//
// Assembled once by the composition root (server/app/server.cc) from its
// options and the objects it built; the front end only converts it
// (server/grpc/convert.h, ServerInfoToProto). Plain data, no transport types.
#ifndef TOKENSEL_SERVER_CORE_SERVER_DESCRIPTION_H_
#define TOKENSEL_SERVER_CORE_SERVER_DESCRIPTION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "server/core/backend.h"

namespace tokensel::core {

struct ServerDescription {
  std::string version;
  std::string backend;
  std::vector<DeviceDescription> devices;
  uint64_t max_message_bytes = 0;
  uint32_t max_buffers_per_session = 0;
  uint32_t max_inflight = 0;
  uint64_t session_ttl_ms = 0;
  uint32_t max_rank = 0;
  uint32_t max_sessions_per_peer = 0;
  uint32_t max_buffers_total = 0;
  uint64_t max_op_elements = 0;
  uint64_t max_request_memory_bytes = 0;
  uint64_t memory_budget_bytes = 0;
  std::string shm_prefix;
  std::vector<std::string> memory_kinds;  // "host_shm", "cuda_ipc", "cuda_vmm"
  bool fd_channel = false;                // every unix listener has an fd channel
  bool ipc_events = false;                // Execute's wait_event / record_event are served
  uint32_t max_async_executes_per_session = 0;
  uint32_t max_async_executes = 0;
  // The wait caps (async_requests.h): wait_events outstanding, waiting or
  // stuck (--max_waits_per_session, --max_waits, --max_waits_per_peer).
  uint32_t max_stuck_executes_per_session = 0;
  uint32_t max_stuck_executes = 0;
  uint32_t max_async_executes_per_peer = 0;  // all the sessions of one peer
  uint32_t max_stuck_executes_per_peer = 0;
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_SERVER_DESCRIPTION_H_
