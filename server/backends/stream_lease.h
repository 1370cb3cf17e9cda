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
// that drains before giving it back.
// RunOp may run once per lease (a second call is FAILED_PRECONDITION).
//
// Used by one thread at a time; the pools and the device outlive the lease.
#ifndef TOKENSEL_SERVER_BACKENDS_STREAM_LEASE_H_
#define TOKENSEL_SERVER_BACKENDS_STREAM_LEASE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
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
  // device out of service.
  virtual absl::Status Drain(Stream stream, absl::Status status) = 0;
  // UNAVAILABLE once the device is out of service (checked before RunOp).
  virtual absl::Status CheckUsable() const = 0;
};

struct StreamPools {
  BlockPool* pinned;      // host staging (page-locked)
  BlockPool* staging;     // device staging
  BlockPool* workspaces;  // device workspaces of the ops
};

class StreamLease final : public core::RequestLease {
 public:
  // Takes a stream (AcquireStream's error otherwise).
  static absl::StatusOr<std::unique_ptr<StreamLease>> Begin(StreamDevice* device,
                                                            StreamPools pools);
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
  bool queued_ = false;  // device work issued since the last synchronization
  bool ran_ = false;     // RunOp was called
  bool done_ = false;    // RunOp succeeded: read-back tensors are on the host
};

}  // namespace tokensel::backends

#endif  // TOKENSEL_SERVER_BACKENDS_STREAM_LEASE_H_
