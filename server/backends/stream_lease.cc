// StreamLease (contract and the order of the device calls: stream_lease.h).
#include "server/backends/stream_lease.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/ops.h"

namespace tokensel::backends {

absl::StatusOr<std::unique_ptr<StreamLease>> StreamLease::Begin(StreamDevice* device,
                                                                StreamPools pools) {
  // The lease first, then the stream: if `new` throws (std::bad_alloc is
  // caught by the handler and the server carries on) no stream is held yet;
  // once taken, the lease's destructor gives it back.
  std::unique_ptr<StreamLease> lease(new StreamLease(device, pools));
  ASSIGN_OR_RETURN(lease->stream_, device->AcquireStream());
  lease->has_stream_ = true;
  return lease;
}

std::unique_ptr<StreamLease> StreamLease::OnChain(StreamDevice* device, StreamPools pools,
                                                  StreamDevice::Stream stream, LeaseSink* sink,
                                                  bool async, std::string label) {
  std::unique_ptr<StreamLease> lease(new StreamLease(device, pools));
  lease->stream_ = stream;  // borrowed: has_stream_ stays false
  lease->sink_ = sink;
  lease->async_ = async && sink != nullptr;
  lease->label_ = std::move(label);
  return lease;
}

namespace {

// A drain on a release path (a destructor, possibly while unwinding): it
// must not throw. The device layer synchronizes the stream before it
// formats any error (CudaBackend::Drain), so a std::bad_alloc from the
// message leaves the stream drained all the same; it is swallowed here,
// the message being only for an op that has failed already.
void DrainOnRelease(StreamDevice* device, StreamDevice::Stream stream) noexcept {
  try {
    (void)device->Drain(stream, absl::OkStatus());
  } catch (...) {
  }
}

// The workspace of one RunOp, back to its pool when RunOp leaves by any
// path, an exception included (Finish allocates host memory to format a
// bad-data message): after a drain of the stream unless RunOp marked it
// synchronized, since kernels may still use it.
class WorkspaceGuard {
 public:
  WorkspaceGuard(StreamDevice* device, StreamDevice::Stream stream, BlockPool* pool,
                 BlockPool::Block block)
      : device_(device), stream_(stream), pool_(pool), block_(block) {}
  WorkspaceGuard(const WorkspaceGuard&) = delete;
  WorkspaceGuard& operator=(const WorkspaceGuard&) = delete;
  ~WorkspaceGuard() {
    if (!synchronized_) DrainOnRelease(device_, stream_);
    pool_->Release(block_);  // never throws
  }
  void MarkSynchronized() { synchronized_ = true; }

 private:
  StreamDevice* const device_;
  const StreamDevice::Stream stream_;
  BlockPool* const pool_;
  const BlockPool::Block block_;
  bool synchronized_ = false;
};

}  // namespace

void StreamLease::HandOver() noexcept {
  // The sink reserved room for every entry and op (NewEntry, LaunchAsync).
  for (Entry& e : entries_) sink_->AdoptStaging(e.pinned, e.device);
  entries_.clear();
  for (LeaseSink::PendingOp& op : pending_) sink_->AdoptOp(std::move(op));
  pending_.clear();
}

StreamLease::~StreamLease() {
  // Async chain: the work stays queued and the chain holds its memory until
  // the stream completes it; no drain on the request thread (the chain's
  // stream may wait on a client's event: a drain could block for ever).
  if (async_) {
    HandOver();
    return;
  }
  // Copies (or kernels) may still be queued on the stream when the request
  // ends early: their blocks go back to the pools only once they are done,
  // or the next request would share memory with them. (A sync chain's
  // leases begin only after the host saw the client's wait complete.)
  // Nothing below throws (issue 12): the drain's error message is swallowed,
  // the pools' and the stream pool's releases allocate nothing.
  if (queued_) DrainOnRelease(device_, stream_);
  for (LeaseSink::PendingOp& op : pending_) pools_.workspaces->Release(op.workspace);
  for (Entry& e : entries_) {
    pools_.pinned->Release(e.pinned);
    pools_.staging->Release(e.device);
  }
  if (has_stream_) device_->ReleaseStream(stream_);
}

uint64_t StreamLease::StagingCost(uint64_t bytes) const {
  const size_t pinned = pools_.pinned->AllocationBytes(bytes);
  const size_t device = pools_.staging->AllocationBytes(bytes);
  if (pinned == SIZE_MAX || device == SIZE_MAX || pinned > UINT64_MAX - device) return UINT64_MAX;
  return uint64_t{pinned} + device;
}

absl::StatusOr<StreamLease::Entry*> StreamLease::NewEntry(uint64_t bytes, bool read_back) {
  if (ran_) {
    return absl::FailedPreconditionError("cuda staging: a lease stages before its op, not after");
  }
  if (bytes > SIZE_MAX) {
    return absl::ResourceExhaustedError(absl::StrCat("cuda staging of ", bytes, " bytes"));
  }
  // Room for the entry before any block is taken: if the vector cannot grow
  // (std::bad_alloc) nothing is held; after the reserve the push_back of the
  // trivially copyable Entry cannot throw, so both blocks are always owned.
  if (entries_.size() == entries_.capacity())
    entries_.reserve(std::max<size_t>(4, 2 * entries_.size()));
  // Async chain: the chain's room for this entry, for the hand-over.
  if (async_) sink_->Reserve(1, 0);
  ASSIGN_OR_RETURN(const BlockPool::Block pinned,
                   pools_.pinned->Acquire(static_cast<size_t>(bytes)));
  absl::StatusOr<BlockPool::Block> device = pools_.staging->Acquire(static_cast<size_t>(bytes));
  if (!device.ok()) {
    pools_.pinned->Release(pinned);
    return device.status();
  }
  entries_.push_back(Entry{pinned, *device, bytes, read_back});
  return &entries_.back();
}

absl::StatusOr<core::RequestLease::Staged> StreamLease::StageInput(const void* src, uint64_t bytes,
                                                                   bool read_back) {
  ASSIGN_OR_RETURN(Entry* const e, NewEntry(bytes, read_back));
  const Staged staged{e->device.data, entries_.size() - 1};
  if (bytes == 0) return staged;
  // Read once, into server-private pinned memory: the async copy below reads
  // the pinned block when the stream gets to it, not the caller's memory.
  std::memcpy(e->pinned.data, src, static_cast<size_t>(bytes));
  queued_ = true;
  RETURN_IF_ERROR(device_->CopyToDevice(e->device.data, e->pinned.data, bytes, stream_));
  return staged;
}

absl::StatusOr<core::RequestLease::Staged> StreamLease::StageOutput(uint64_t bytes) {
  ASSIGN_OR_RETURN(Entry* const e, NewEntry(bytes, /*read_back=*/true));
  const Staged staged{e->device.data, entries_.size() - 1};
  if (bytes == 0) return staged;
  // On the stream, before the kernels: an output never carries another
  // request's bytes, whatever the op writes, and the fill cannot land after
  // the kernel wrote the result.
  queued_ = true;
  RETURN_IF_ERROR(device_->Zero(e->device.data, bytes, stream_));
  return staged;
}

absl::Status StreamLease::RunOp(core::OpArgs args) {
  if (ran_) return absl::FailedPreconditionError("cuda backend: one op per request lease");
  ran_ = true;
  // A failed device is not touched again (no launch on a dead context).
  RETURN_IF_ERROR(device_->CheckUsable());
  // The workspace size is defined for valid metadata only (cuda_ops.h).
  RETURN_IF_ERROR(std::visit([](const auto* a) { return kernels::Validate(*a); }, args));
  const uint64_t ws_bytes = device_->WorkspaceBytes(args);
  if (ws_bytes > SIZE_MAX) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda backend: a workspace of ", ws_bytes, " bytes"));
  }
  if (async_) {
    // An async request returns no inline output (the executor decides so
    // before it starts): nothing may need copying back.
    for (const Entry& e : entries_) {
      if (e.read_back && e.bytes > 0) {
        return absl::FailedPreconditionError(
            "cuda backend: an asynchronous request cannot read back inline outputs");
      }
    }
  }
  ASSIGN_OR_RETURN(const BlockPool::Block block,
                   pools_.workspaces->Acquire(static_cast<size_t>(ws_bytes)));
  if (async_) return LaunchAsync(args, block);
  WorkspaceGuard workspace(device_, stream_, pools_.workspaces, block);
  const kernels::cuda::Workspace ws{block.data, block.bytes};
  queued_ = true;
  absl::Status st = device_->Launch(args, ws, stream_);
  // The copies back follow the kernels on the same stream; Finish's
  // synchronization then covers them too (one sync per request).
  for (const Entry& e : entries_) {
    if (!st.ok()) break;
    if (e.read_back && e.bytes > 0) {
      st = device_->CopyToHost(e.pinned.data, e.device.data, e.bytes, stream_);
    }
  }
  if (st.ok()) st = device_->Finish(args, ws, stream_);
  if (!st.ok()) {
    // Kernels or copies may still be queued (a later launch failed, or
    // Finish stopped at a CUDA error before it synchronized): drain before
    // the workspace goes back to the pool, where the next op would share it
    // with them. The device layer classifies what the drain reports.
    st = device_->Drain(stream_, std::move(st));
  }
  queued_ = false;               // synchronized by Finish, or drained
  workspace.MarkSynchronized();  // the guard returns the workspace now
  done_ = st.ok();
  return st;
}

absl::Status StreamLease::LaunchAsync(core::OpArgs args, BlockPool::Block block) {
  // The lease owns the workspace from here (as a pending op: returned by the
  // completion, or by the destructor's fallback); if the copy of the args
  // cannot allocate, nothing was launched and the block goes back now.
  try {
    sink_->Reserve(0, 1);
    pending_.push_back(LeaseSink::PendingOp{core::CopyArgs(args), block, false, label_});
  } catch (...) {
    pools_.workspaces->Release(block);
    throw;
  }
  queued_ = true;
  absl::Status st = device_->Launch(args, {block.data, block.bytes}, stream_);
  // A failed launch may have enqueued some of the op's kernels: its
  // workspace is held until the stream completes all the same, but Finish
  // does not run (the error is returned now).
  pending_.back().finish = st.ok();
  done_ = st.ok();
  return st;
}

absl::Status StreamLease::ReadBack(size_t slot, void* dst, uint64_t bytes) {
  if (slot >= entries_.size() || !entries_[slot].read_back) {
    return absl::InvalidArgumentError(absl::StrCat("staging slot ", slot, " is not read back"));
  }
  const Entry& e = entries_[slot];
  if (bytes > e.bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: read back of ", bytes, " bytes from staging of ", e.bytes));
  }
  if (!done_) {
    return absl::FailedPreconditionError("cuda backend: read back before the op completed");
  }
  if (bytes > 0) std::memcpy(dst, e.pinned.data, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

}  // namespace tokensel::backends
