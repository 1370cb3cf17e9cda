#include "server/grpc/handlers.h"

#include <exception>
#include <new>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/grpc/status_util.h"

namespace tokensel::server {

std::optional<std::string> Handlers::SessionMetadata(const grpc::CallbackServerContext& ctx) {
  const auto& metadata = ctx.client_metadata();
  auto it = metadata.find(grpc::string_ref(kSessionMetadataKey.data(), kSessionMetadataKey.size()));
  if (it == metadata.end()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

absl::Status CallStopToken::Check() const {
  if (ctx_->IsCancelled()) return absl::CancelledError("the client cancelled the call");
  if (std::chrono::system_clock::now() >= deadline_) {
    return absl::DeadlineExceededError("the call's deadline passed before the work was done");
  }
  return absl::OkStatus();
}

absl::Status NoThrow(const std::function<absl::Status()>& work) {
  try {
    return work();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        "server: out of memory serving this request (it was abandoned; the server goes on)");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("server: unexpected exception: ", e.what()));
  } catch (...) {
    return absl::InternalError("server: unexpected exception");
  }
}

core::Peer Handlers::PeerOf(const grpc::CallbackServerContext& ctx) const {
  return server::PeerOf(deps_.connections, ctx);
}

absl::StatusOr<core::SessionInfo> Handlers::TouchSession(
    const grpc::CallbackServerContext& ctx) const {
  std::optional<std::string> id = SessionMetadata(ctx);
  if (!id.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("missing ", kSessionMetadataKey, " metadata (call OpenSession first)"));
  }
  const core::Peer peer = PeerOf(ctx);
  ASSIGN_OR_RETURN(absl::Duration ttl, deps_.sessions->Touch(*id, peer));
  core::SessionInfo info;
  info.id = std::move(*id);
  info.ttl = ttl;
  info.owner = peer.Principal();  // Touch checked: the caller is the owner
  return info;
}

absl::Status Handlers::RunOp(const std::string& session, const core::OpRequest& op,
                             v1::OpResponse* response, const core::RunOptions& options) const {
  ASSIGN_OR_RETURN(core::OpResult result, deps_.executor->Run(session, op, options));
  OpResultToProto(std::move(result), response);
  return absl::OkStatus();
}

absl::Status Handlers::RunOp(const std::string& session, const v1::Op& op, v1::OpResponse* response,
                             const core::RunOptions& options, absl::string_view prefix) const {
  ASSIGN_OR_RETURN(core::OpRequest request, OpFromProto(op, prefix));
  return RunOp(session, request, response, options);
}

absl::Status Handlers::Execute(const std::string& session, const v1::ExecuteRequest& request,
                               v1::ExecuteResponse* response,
                               const core::RunOptions& options) const {
  const core::IpcEvents events{request.wait_event(), request.record_event()};
  const core::Backend& backend = deps_.executor->backend();
  if (!events.empty()) {
    const absl::string_view field = events.wait.empty() ? "record_event" : "wait_event";
    if (backend.ipc_events() == core::IpcEventSupport::kNoDevice) {
      return absl::FailedPreconditionError(
          absl::StrCat(field, ": CUDA IPC events need the cuda backend (this server runs ",
                       backend.name(), ")"));
    }
    if (backend.ipc_events() != core::IpcEventSupport::kSupported) {
      return absl::FailedPreconditionError(
          absl::StrCat(field, ": CUDA IPC events are not supported by this server's cuda backend"));
    }
    for (const auto& [name, handle] :
         {std::pair<absl::string_view, const std::string&>("wait_event", events.wait),
          {"record_event", events.record}}) {
      if (!handle.empty() && handle.size() != core::IpcEvents::kHandleBytes) {
        return absl::InvalidArgumentError(absl::StrCat(name, " is ", handle.size(),
                                                       " bytes; a cudaIpcEventHandle_t is exactly ",
                                                       core::IpcEvents::kHandleBytes));
      }
    }
  }
  if (deps_.async != nullptr) {
    // No ops and no events: the session's barrier, which waits (within the
    // call's deadline) for its asynchronous Executes to complete.
    if (request.ops_size() == 0 && events.empty()) {
      auto check = [&options]() {
        return options.stop != nullptr ? options.stop->Check() : absl::OkStatus();
      };
      RETURN_IF_ERROR(deps_.async->WaitSession(session, check));
      // A call that expired (or was cancelled) while it waited must not take
      // the deferred error with it: its reply goes nowhere.
      RETURN_IF_ERROR(check());
    }
    // An earlier asynchronous Execute failed on the device after its reply:
    // this Execute reports that, and runs nothing (docs/server.md).
    RETURN_IF_ERROR(deps_.async->TakeDeferred(session));
  }
  ASSIGN_OR_RETURN(std::vector<core::OpRequest> ops, OpsFromProto(request));
  core::RunOptions run = options;
  run.events = &events;
  run.async = deps_.async;
  ASSIGN_OR_RETURN(std::vector<core::OpResult> results, deps_.executor->RunAll(session, ops, run));
  response->mutable_results()->Reserve(static_cast<int>(results.size()));
  for (core::OpResult& result : results) {
    OpResultToProto(std::move(result), response->add_results());
  }
  return absl::OkStatus();
}

absl::Status Handlers::Register(const std::string& session,
                                const v1::RegisterBufferRequest& request,
                                v1::RegisterBufferResponse* response,
                                absl::string_view owner) const {
  core::RegionSpec spec;
  if (request.source_case() == v1::RegisterBufferRequest::kFd) {
    // The name first, so that a request doomed by it does not use up the
    // ticket.
    RETURN_IF_ERROR(core::ValidateBufferName(request.name()));
    if (deps_.tickets == nullptr) {
      return absl::FailedPreconditionError("fd: this server takes no file descriptors");
    }
    if (request.fd().segments_size() > 0) {
      ASSIGN_OR_RETURN(spec, VmmSegmentsFromProto(session, request.fd()));
    } else {
      ASSIGN_OR_RETURN(core::FdTickets::Redeemed redeemed,
                       deps_.tickets->Redeem(session, request.fd().ticket()));
      spec = core::FdRegionSpec{std::move(redeemed.fd),     redeemed.kind,
                                request.fd().offset(),      request.fd().size(),
                                request.fd().device_uuid(), request.fd().allocation_size()};
    }
  } else {
    ASSIGN_OR_RETURN(spec, RegionFromProto(request));
  }
  // The peer's share of the device's FreeGate (VMM mappings, IPC handles:
  // free_gate.h); a client cannot set it.
  std::visit([&](auto& region) { region.owner = std::string(owner); }, spec);
  ASSIGN_OR_RETURN(core::BufferInfo info, deps_.registry->Register(session, request.name(), spec));
  BufferInfoToProto(info, response->mutable_buffer());
  return absl::OkStatus();
}

// PassedFd.segments: every check that needs no descriptor comes before any
// ticket is used up (RedeemAll then takes all or none), so a malformed
// request leaves the caller's tickets waiting. The mapper checks the rest
// (sizes, sums, the allocations themselves) before it maps anything.
absl::StatusOr<core::FdRegionSpec> Handlers::VmmSegmentsFromProto(const std::string& session,
                                                                  const v1::PassedFd& fd) const {
  if (!fd.ticket().empty() || fd.allocation_size() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fd.segments supersedes fd.ticket and fd.allocation_size, which must be "
                     "empty / 0 with it (got fd.ticket \"",
                     fd.ticket().size() > 40 ? fd.ticket().substr(0, 40) + "..." : fd.ticket(),
                     "\", fd.allocation_size ", fd.allocation_size(), ")"));
  }
  if (static_cast<size_t>(fd.segments_size()) > core::kMaxVmmSegments) {
    return absl::InvalidArgumentError(absl::StrCat("fd.segments has ", fd.segments_size(),
                                                   " entries; a buffer spans at most ",
                                                   core::kMaxVmmSegments, " allocations"));
  }
  std::vector<std::string> tickets;
  tickets.reserve(static_cast<size_t>(fd.segments_size()));
  for (int i = 0; i < fd.segments_size(); ++i) {
    if (fd.segments(i).allocation_size() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("fd.segments[", i, "].allocation_size must be > 0, got 0"));
    }
    tickets.push_back(fd.segments(i).ticket());
  }
  ASSIGN_OR_RETURN(std::vector<core::FdTickets::Redeemed> redeemed,
                   deps_.tickets->RedeemAll(session, tickets, "fd.segments"));
  core::FdRegionSpec spec;
  spec.kind = core::FdKind::kCudaVmm;
  spec.offset = fd.offset();
  spec.size = fd.size();
  spec.device_uuid = fd.device_uuid();
  for (size_t i = 0; i < redeemed.size(); ++i) {
    if (redeemed[i].kind != core::FdKind::kCudaVmm) {
      return absl::InvalidArgumentError(
          absl::StrCat("fd.segments[", i,
                       "].ticket names a FD_KIND_HOST_MEMORY descriptor; segments are CUDA VMM "
                       "allocations (FD_KIND_CUDA_VMM)"));
    }
    spec.segments.push_back(core::VmmSegmentSpec{
        std::move(redeemed[i].fd), fd.segments(static_cast<int>(i)).allocation_size()});
  }
  return spec;
}

absl::Status Handlers::Unregister(const std::string& session,
                                  const v1::UnregisterBufferRequest& request) const {
  return deps_.registry->Unregister(session, request.name());
}

void RpcTimer::Record(absl::StatusCode code) const {
  if (metrics_ == nullptr) return;
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
  metrics_->ObserveRpc(method_, StatusCodeName(code), elapsed.count());
}

}  // namespace tokensel::server
