// StreamLease: the RequestLease (server/core/backend.h) of a device backend,
// written against StreamDevice, the few device calls it makes, so that its
// ordering, pooling and cleanup are tested without a device
// (tests/server/backends/stream_lease_test.cc records every call on a fake).
// CudaBackend implements StreamDevice with the CUDA runtime.
//
// One request = one lease: a stream taken from the backend's pool when the
// lease begins and returned when it ends; staging blocks from two BlockPools
// (pinned host memory, device memory) held until the end; a workspace from a
// third pool while RunOp runs. Everything on the device goes to that one
// stream, in this order:
//   StageInput(src):  src -> pinned block (a host memcpy: the caller's memory
//                     is read once, here), then an async copy pinned ->
//                     device block on the stream;
//   StageOutput:      an async zero fill of the device block on the stream;
//   RunOp:            the kernels (Launch), then an async copy device ->
//                     pinned block of every read-back tensor, then Finish,
//                     the one synchronization of the stream (it also reads
//                     the kernels' status word);
//   ReadBack:         pinned block -> the caller (a host memcpy, after the
//                     synchronization).
// Why: the op streams are non-blocking, so copies issued anywhere else (the
// legacy default stream, synchronous cudaMemcpy) are not ordered with the
// kernels; and per-request cudaMalloc / cudaFree would synchronize the whole
// device on every request. Pinned memory is for asynchrony: an async copy
// from a pinned block returns at once and the DMA runs in the stream's
// order, overlapping the host and other streams (so the block must not be
// touched until the stream is synchronized: it is the lease's own). From
// pageable memory cudaMemcpyAsync reads the source into a driver buffer
// before it returns (synchronizing as needed): correct, but no overlap.
//
// Errors: a failed copy or launch returns its status (the device layer
// classifies sticky errors); a failed op is drained (StreamDevice::Drain)
// before its workspace goes back to the pool. Ending the lease with device
// work still queued (an error between staging and RunOp, or RunOp never
// called) synchronizes the stream first: no block goes back to a pool, and
// no stream to the stream pool, while a copy may still use it. Every block
// and the stream are returned on every path, std::bad_alloc included (the
// gRPC handler catches it and the server carries on): each block is owned by
// the lease from the moment it is taken, and RunOp's workspace by a guard
// that drains before giving it back. The release paths never throw (the
// pools' and the stream pool's releases allocate nothing; see Drain).
// RunOp may run once per lease (a second call is FAILED_PRECONDITION).
//
// On a chain (StreamChain, stream_chain.h: an Execute with CUDA IPC events)
// the lease borrows the chain's stream (never released by the lease). Sync
// chain: as above. Async chain: RunOp only launches (no copies back: an
// async request has no inline output; a read-back of bytes is
// FAILED_PRECONDITION), and when the lease ends nothing is drained: its
// staging blocks and its op (workspace, a copy of the args, for Finish)
// pass to the chain (LeaseSink), which holds them until the stream's work
// completed. The chain's room for them is reserved before each block is
// taken (LeaseSink::Reserve), so the hand-over cannot fail: a lease on a
// chain never synchronizes the chain's stream, which may still wait on the
// client's event.
//
// Used by one thread at a time; the pools and the device outlive the lease.
#ifndef TOKENSEL_SERVER_BACKENDS_STREAM_LEASE_H_
#define TOKENSEL_SERVER_BACKENDS_STREAM_LEASE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/cuda_ops.h"
#include "server/backends/block_pool.h"
#include "server/core/backend.h"

namespace tokensel::backends {

// The device calls of a StreamLease. Each returns INTERNAL (or UNAVAILABLE
// for a device already out of service) on a device error, having noted a
// sticky one. Thread-safe.
class StreamDevice {
 public:
  using Stream = kernels::cuda::Stream;
  virtual ~StreamDevice() = default;
  // A stream for one request (pooled; created when all are in use), and
  // back. UNAVAILABLE when the device is out of service.
  virtual absl::StatusOr<Stream> AcquireStream() = 0;
  virtual void ReleaseStream(Stream stream) = 0;
  // Async on `stream`: host (pinned) -> device, device -> host (pinned), and
  // a zero fill of device memory.
  virtual absl::Status CopyToDevice(void* dst, const void* src, uint64_t bytes, Stream stream) = 0;
  virtual absl::Status CopyToHost(void* dst, const void* src, uint64_t bytes, Stream stream) = 0;
  virtual absl::Status Zero(void* dst, uint64_t bytes, Stream stream) = 0;
  // The op: its workspace size (of validated args), its kernels enqueued on
  // `stream` (kernels::cuda::Async), and Finish (kernels::cuda::Finish:
  // synchronizes `stream`, then the op's status).
  virtual uint64_t WorkspaceBytes(core::OpArgs args) const = 0;
  virtual absl::Status Launch(core::OpArgs args, kernels::cuda::Workspace ws, Stream stream) = 0;
  virtual absl::Status Finish(core::OpArgs args, kernels::cuda::Workspace ws, Stream stream) = 0;
  // Synchronizes `stream` after a failure (or before work still queued is
  // abandoned) and returns `status`, marked when the drain itself found the
  // device out of service. The synchronization comes before anything that
  // may throw (formatting the message): the lease's destructor swallows a
  // std::bad_alloc from it, the stream drained.
  virtual absl::Status Drain(Stream stream, absl::Status status) = 0;
  // UNAVAILABLE once the device is out of service (checked before RunOp).
  virtual absl::Status CheckUsable() const = 0;
  // Whether `stream` has no work left (cudaStreamQuery): never blocks, so
  // it is how a stream that may wait on a client's event is watched (a
  // host synchronization of it could block for ever); an error once the
  // device reports one.
  virtual absl::StatusOr<bool> QueryStream(Stream stream) = 0;
  // Marks the device out of service for good (as a sticky error does:
  // CheckUsable then answers UNAVAILABLE, health goes NOT_SERVING), with
  // `why` in the log and the later errors. Used when the device keeps
  // failing without a sticky error (CompletionQueue: a query that never
  // succeeds again).
  virtual void MarkOutOfService(absl::string_view why) = 0;
  // Whether the device's context itself failed (a sticky error was seen: it
  // runs nothing more, every stream's work is over). Not set by
  // MarkOutOfService, after which the context may still run queued work
  // (CompletionQueue abandons such work instead of releasing it).
  virtual bool ContextFailed() const = 0;

  // Events (CUDA IPC events of Execute; stream_chain.h).
  using Event = void*;  // cudaEvent_t
  // The client's event from its 64 handle bytes (cudaIpcOpenEventHandle,
  // this device current): INVALID_ARGUMENT naming `field` when the driver
  // rejects the handle (nothing is marked failed); other errors classified
  // as for any call.
  virtual absl::StatusOr<Event> OpenIpcEvent(absl::string_view handle, absl::string_view field) = 0;
  // A private event (no timing) marking a request's completion.
  virtual absl::StatusOr<Event> CreateEvent() = 0;
  virtual void DestroyEvent(Event event) = 0;
  // Async on `stream`: wait for `event`, record `event`. `field` names the
  // client's event in errors.
  virtual absl::Status WaitEvent(Stream stream, Event event, absl::string_view field) = 0;
  virtual absl::Status RecordEvent(Event event, Stream stream, absl::string_view field) = 0;
  // Whether the work recorded before `event` has completed (cudaEventQuery):
  // never blocks; an error once the device reports one.
  virtual absl::StatusOr<bool> EventDone(Event event) = 0;
};

struct StreamPools {
  BlockPool* pinned;         // host staging (page-locked)
  BlockPool* staging;        // device staging
  BlockPool* workspaces;     // device workspaces of the ops
  FreeGate* gate = nullptr;  // the pools' (block_pool.h); null: none
};

// Where a lease on an async chain leaves what its device work still uses.
// Reserve (before the lease takes the blocks or launches) may throw
// std::bad_alloc (then nothing changed); once it returned, the Adopt* of
// what it reserved for never throw: the hand-over at the end of the lease
// cannot fail, so a lease on a chain never has to drain the chain's stream
// (which may wait on a client's event: stream_chain.h).
class LeaseSink {
 public:
  struct PendingOp {
    core::OpArgsValue args;      // for Finish
    BlockPool::Block workspace;  // its DeviceStatus word is read by Finish
    bool finish;                 // false: the launch failed (hold only)
    std::string label;           // "ops[k] (Name)"
  };
  virtual ~LeaseSink() = default;
  // Room for `staging` more staging entries and `ops` more ops.
  virtual void Reserve(size_t staging, size_t ops) = 0;
  virtual void AdoptStaging(BlockPool::Block pinned, BlockPool::Block device) noexcept = 0;
  virtual void AdoptOp(PendingOp op) noexcept = 0;
};

class StreamLease final : public core::RequestLease {
 public:
  // Takes a stream (AcquireStream's error otherwise).
  static absl::StatusOr<std::unique_ptr<StreamLease>> Begin(StreamDevice* device,
                                                            StreamPools pools);
  // A lease on a chain's `stream` (borrowed); `sink` receives its work when
  // `async`. `label` names the op in its deferred error.
  static std::unique_ptr<StreamLease> OnChain(StreamDevice* device, StreamPools pools,
                                              StreamDevice::Stream stream, LeaseSink* sink,
                                              bool async, std::string label);
  ~StreamLease() override;

  // Pinned plus device block sizes of `bytes`, saturating.
  uint64_t StagingCost(uint64_t bytes) const override;
  absl::StatusOr<Staged> StageInput(const void* src, uint64_t bytes, bool read_back) override;
  absl::StatusOr<Staged> StageOutput(uint64_t bytes) override;
  absl::Status RunOp(core::OpArgs args) override;
  absl::Status ReadBack(size_t slot, void* dst, uint64_t bytes) override;

  StreamDevice::Stream stream() const { return stream_; }

 private:
  StreamLease(StreamDevice* device, StreamPools pools) : device_(device), pools_(pools) {}
  // Async: launches and keeps the op for the sink.
  absl::Status LaunchAsync(core::OpArgs args, BlockPool::Block block);
  // Async, at the end: everything to the sink (reserved: cannot fail).
  void HandOver() noexcept;

  struct Entry {
    BlockPool::Block pinned;
    BlockPool::Block device;
    uint64_t bytes;
    bool read_back;
  };
  // Takes both blocks of a new entry (returned on failure).
  absl::StatusOr<Entry*> NewEntry(uint64_t bytes, bool read_back);

  StreamDevice* const device_;
  const StreamPools pools_;
  StreamDevice::Stream stream_ = nullptr;  // set once, by Begin
  bool has_stream_ = false;
  std::vector<Entry> entries_;
  bool queued_ = false;        // device work issued since the last synchronization
  bool ran_ = false;           // RunOp was called
  bool done_ = false;          // RunOp succeeded: read-back tensors are on the host
  LeaseSink* sink_ = nullptr;  // on a chain: the stream is borrowed
  bool async_ = false;         // on an async chain
  std::string label_;
  std::vector<LeaseSink::PendingOp> pending_;  // async: the launched op (0 or 1)
};

}  // namespace tokensel::backends

#endif  // TOKENSEL_SERVER_BACKENDS_STREAM_LEASE_H_
