// CudaBackend's CUDA IPC events (contract: cuda_backend.h, stream_chain.h,
// ipc_event_cache.h): the StreamDevice event calls with the CUDA runtime,
// and BeginChain. Compiled by the host compiler against cuda_runtime_api.h.
#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "server/backends/client_event_error.h"
#include "server/backends/cuda_backend.h"
#include "server/backends/cuda_device_switch.h"
#include "server/backends/stream_chain.h"

namespace tokensel::backends {
namespace {

namespace kc = ::tokensel::kernels::cuda;

// What the driver answers for a handle it does not accept, or an event it
// cannot use on this device (the same set the memory-handle mapper treats
// as the client's fault, cuda_ipc_mapper.cu, plus an event of another
// device). None is sticky.
// cudaErrorDeviceUninitialized: what cudaIpcOpenEventHandle answers for a
// handle of an event whose context is gone (its process exited).
bool IsBadEvent(cudaError_t err) {
  return err == cudaErrorInvalidValue || err == cudaErrorInvalidResourceHandle ||
         err == cudaErrorMapBufferObjectFailed || err == cudaErrorInvalidDevice ||
         err == cudaErrorNotSupported || err == cudaErrorDeviceUninitialized;
}

// A failed switch is the server's trouble, never the client's (not
// classified as a client event's error: server/core/device_switch.h).
absl::Status SwitchFailed(int ordinal, absl::string_view where) {
  return absl::InternalError(
      absl::StrCat("cuda backend: cudaSetDevice(", ordinal, ") failed for ", where));
}

}  // namespace

absl::Status CudaBackend::ClientEventFailed(int code, const char* call, absl::string_view field) {
  const auto err = static_cast<cudaError_t>(code);
  // A non-sticky error stays the thread's last error; clear it (a sticky
  // one the probe sees again).
  (void)cudaGetLastError();
  const std::string error = absl::StrCat(cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  return ClientEventError(field, call, error, IsBadEvent(err), [&]() -> absl::Status {
    // A call on an object of the server's own (client_event_error.h): a
    // dead context answers it with its sticky error, noted by Checked.
    const DeviceCall probe = OnOwnDevice(device_.ordinal, [] {
      cudaEvent_t event = nullptr;
      cudaError_t perr = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
      if (perr == cudaSuccess) {
        perr = cudaEventQuery(event);
        (void)cudaEventDestroy(event);
      }
      return perr;
    });
    if (!probe.switched) return SwitchFailed(device_.ordinal, field);
    return Checked(probe.result, "a probe of the device after a client event's error", field);
  });
}

absl::StatusOr<bool> CudaBackend::QueryStream(kc::Stream stream) {
  // No usability check (as EventDone): a completion must learn the
  // device's fate. Never blocks (a stream may wait on a client's event).
  const DeviceCall call = OnOwnDevice(device_.ordinal, [&] { return cudaStreamQuery(stream); });
  if (!call.switched) return SwitchFailed(device_.ordinal, "a request's completion");
  const auto err = static_cast<cudaError_t>(call.result);
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  RETURN_IF_ERROR(Checked(err, "cudaStreamQuery", "a request's completion"));
  return true;
}

void CudaBackend::MarkOutOfService(absl::string_view why) {
  // As NoteError for a sticky error: once, logged; never reset.
  absl::MutexLock lock(&failure_mu_);
  if (failure_.empty()) {
    failure_ = std::string(why);
    TS_LOG(ERROR) << "cuda backend: device " << label_ << " (" << device_.uuid
                  << ") is out of service: " << failure_
                  << "; treated as failed until the server restarts (health: NOT_SERVING)";
  }
  failed_.store(true, std::memory_order_release);
}

absl::StatusOr<StreamDevice::Event> CudaBackend::OpenIpcEvent(absl::string_view handle,
                                                              absl::string_view field) {
  RETURN_IF_ERROR(CheckUsable());
  cudaIpcEventHandle_t h;
  static_assert(sizeof(h) == core::IpcEvents::kHandleBytes);
  if (handle.size() != sizeof(h)) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is ", handle.size(), " bytes"));
  }
  // Read once, into our own copy (the request's bytes are the server's
  // already, but the driver gets a private struct either way).
  std::memcpy(&h, handle.data(), sizeof(h));
  cudaEvent_t event = nullptr;
  const DeviceCall call =
      OnOwnDevice(device_.ordinal, [&] { return cudaIpcOpenEventHandle(&event, h); });
  if (!call.switched) return SwitchFailed(device_.ordinal, field);
  const auto err = static_cast<cudaError_t>(call.result);
  if (err == cudaSuccess) return static_cast<Event>(event);
  return ClientEventFailed(err, "cudaIpcOpenEventHandle", field);
}

absl::StatusOr<StreamDevice::Event> CudaBackend::CreateEvent() {
  RETURN_IF_ERROR(CheckUsable());
  cudaEvent_t event = nullptr;
  const DeviceCall call = OnOwnDevice(
      device_.ordinal, [&] { return cudaEventCreateWithFlags(&event, cudaEventDisableTiming); });
  if (!call.switched) return SwitchFailed(device_.ordinal, "a completion event");
  RETURN_IF_ERROR(Checked(call.result, "cudaEventCreateWithFlags", "a completion event"));
  return static_cast<Event>(event);
}

void CudaBackend::DestroyEvent(Event event) {
  // Legal with a record still pending: the driver frees it once complete.
  // A failed switch leaks the event (logged): destroying it with another
  // device current could not be trusted either.
  const DeviceCall call = OnOwnDevice(
      device_.ordinal, [&] { return cudaEventDestroy(static_cast<cudaEvent_t>(event)); });
  if (!call.switched) {
    TS_LOG(ERROR) << SwitchFailed(device_.ordinal, "cudaEventDestroy");
  }
}

absl::Status CudaBackend::WaitEvent(kc::Stream stream, Event event, absl::string_view field) {
  RETURN_IF_ERROR(CheckUsable());
  const DeviceCall call = OnOwnDevice(device_.ordinal, [&] {
    return cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(event), 0);
  });
  if (!call.switched) return SwitchFailed(device_.ordinal, field);
  const auto err = static_cast<cudaError_t>(call.result);
  if (err == cudaSuccess) return absl::OkStatus();
  return ClientEventFailed(err, "cudaStreamWaitEvent", field);
}

absl::Status CudaBackend::RecordEvent(Event event, kc::Stream stream, absl::string_view field) {
  RETURN_IF_ERROR(CheckUsable());
  const DeviceCall call = OnOwnDevice(
      device_.ordinal, [&] { return cudaEventRecord(static_cast<cudaEvent_t>(event), stream); });
  if (!call.switched) return SwitchFailed(device_.ordinal, field);
  const auto err = static_cast<cudaError_t>(call.result);
  if (err == cudaSuccess) return absl::OkStatus();
  // The server's own events (the completion event, the wait's marker):
  // classified as any call. The client's (record_event): an event of
  // another device, or one the client destroyed, is the client's mistake,
  // not the device's (client_event_error.h).
  if (field != "record_event") return Checked(err, "cudaEventRecord", field);
  return ClientEventFailed(err, "cudaEventRecord", field);
}

absl::StatusOr<bool> CudaBackend::EventDone(Event event) {
  // No usability check: a completion must learn the device's fate (the
  // query then reports the sticky error, and the queue drains the stream).
  const DeviceCall call =
      OnOwnDevice(device_.ordinal, [&] { return cudaEventQuery(static_cast<cudaEvent_t>(event)); });
  if (!call.switched) return SwitchFailed(device_.ordinal, "a request's completion");
  const auto err = static_cast<cudaError_t>(call.result);
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  RETURN_IF_ERROR(Checked(err, "cudaEventQuery", "a request's completion"));
  return true;
}

absl::StatusOr<std::unique_ptr<core::RequestChain>> CudaBackend::BeginChain(
    const std::string& session, const core::IpcEvents& events, bool async) {
  RETURN_IF_ERROR(CheckUsable());
  std::shared_ptr<IpcEvent> wait;
  std::shared_ptr<IpcEvent> record;
  if (!events.wait.empty()) {
    ASSIGN_OR_RETURN(wait, events_.Get(session, events.wait, "wait_event"));
  }
  if (!events.record.empty()) {
    ASSIGN_OR_RETURN(record, events_.Get(session, events.record, "record_event"));
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<StreamChain> chain,
      StreamChain::Begin(this, StreamPools{&pinned_, &staging_, &workspaces_, &free_gate_},
                         &completions_, std::move(wait), std::move(record), async));
  return std::unique_ptr<core::RequestChain>(std::move(chain));
}

void CudaBackend::BeginSession(const std::string& session) { events_.BeginSession(session); }

void CudaBackend::EndSession(const std::string& session) { events_.EndSession(session); }

void CudaBackend::AbandonPendingWork() { completions_.Shutdown(CompletionQueue::Clock::now()); }

}  // namespace tokensel::backends
