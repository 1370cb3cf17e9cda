// CPU implementations of every operator (the embedded default backend and the
// oracle the CUDA kernels are tested against). Contracts: kernels/ops.h.
//
// Every function validates metadata (Validate<Op>), then the data (indices,
// segment ids), and only then writes: on error nothing was written. Rows run
// in parallel on `pool` (null = the calling thread only); the result is the
// same for any thread count. Thread-safe: concurrent calls on one pool are
// fine as long as their outputs do not overlap.
//
// Client memory: the inputs may be shared memory that a hostile client keeps
// rewriting during the call. Every value that decides an address or a size
// is read exactly once into private memory (a snapshot of the index tensor,
// snapshot.h) or checked at the point of use, so such a client can make a
// call return INVALID_ARGUMENT or produce garbage in its own outputs, but
// never make it touch memory outside the views it passed.
//
// Stop: each op checks the calling thread's StopToken (stop.h) before every
// parallel chunk and after every phase; once it fires the op returns the
// token's status (CANCELLED / DEADLINE_EXCEEDED) as soon as the running chunks
// end, never OK. A stopped op may have written part of its outputs; an op
// that fails with any other error has written nothing.
//
// Scratch: ScratchBytes(args, threads) is an upper bound of the heap bytes
// the call allocates (snapshots, bitmaps, keys, staging, per-chunk vectors,
// an error status) when run on a pool of `threads` threads (1 = inline),
// computed from metadata only (never reads tensor data), saturating at
// UINT64_MAX. It is safe on args that fail validation (then it bounds what
// the failing call allocates: its status).
#ifndef TOKENSEL_KERNELS_CPU_CPU_OPS_H_
#define TOKENSEL_KERNELS_CPU_CPU_OPS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/stop.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ops.h"

namespace tokensel::kernels::cpu {

absl::Status SortTokens(const SortTokensArgs& args, ThreadPool* pool);
absl::Status GatherTokens(const GatherTokensArgs& args, ThreadPool* pool);
absl::Status ScatterTokens(const ScatterTokensArgs& args, ThreadPool* pool);
absl::Status GatherBertMask(const GatherBertMaskArgs& args, ThreadPool* pool);
absl::Status SliceGptMask(const SliceGptMaskArgs& args, ThreadPool* pool);
absl::Status SegmentSeqlens(const SegmentSeqlensArgs& args, ThreadPool* pool);
absl::Status SampleTokens(const SampleTokensArgs& args, ThreadPool* pool);
absl::Status TopKTokens(const TopKTokensArgs& args, ThreadPool* pool);
absl::Status MergeTokens(const MergeTokensArgs& args, ThreadPool* pool);
absl::Status SplitTokens(const SplitTokensArgs& args, ThreadPool* pool);
absl::Status SamplePackedTokens(const SamplePackedTokensArgs& args, ThreadPool* pool);

uint64_t ScratchBytes(const SortTokensArgs& args, int threads);
uint64_t ScratchBytes(const GatherTokensArgs& args, int threads);
uint64_t ScratchBytes(const ScatterTokensArgs& args, int threads);
uint64_t ScratchBytes(const GatherBertMaskArgs& args, int threads);
uint64_t ScratchBytes(const SliceGptMaskArgs& args, int threads);
uint64_t ScratchBytes(const SegmentSeqlensArgs& args, int threads);
uint64_t ScratchBytes(const SampleTokensArgs& args, int threads);
uint64_t ScratchBytes(const TopKTokensArgs& args, int threads);
uint64_t ScratchBytes(const MergeTokensArgs& args, int threads);
uint64_t ScratchBytes(const SplitTokensArgs& args, int threads);
uint64_t ScratchBytes(const SamplePackedTokensArgs& args, int threads);

// Run<Op> by argument type, for code generic over the ops (CpuBackend).
inline absl::Status Run(const SortTokensArgs& a, ThreadPool* p) { return SortTokens(a, p); }
inline absl::Status Run(const GatherTokensArgs& a, ThreadPool* p) { return GatherTokens(a, p); }
inline absl::Status Run(const ScatterTokensArgs& a, ThreadPool* p) { return ScatterTokens(a, p); }
inline absl::Status Run(const GatherBertMaskArgs& a, ThreadPool* p) { return GatherBertMask(a, p); }
inline absl::Status Run(const SliceGptMaskArgs& a, ThreadPool* p) { return SliceGptMask(a, p); }
inline absl::Status Run(const SegmentSeqlensArgs& a, ThreadPool* p) { return SegmentSeqlens(a, p); }
inline absl::Status Run(const SampleTokensArgs& a, ThreadPool* p) { return SampleTokens(a, p); }
inline absl::Status Run(const TopKTokensArgs& a, ThreadPool* p) { return TopKTokens(a, p); }
inline absl::Status Run(const MergeTokensArgs& a, ThreadPool* p) { return MergeTokens(a, p); }
inline absl::Status Run(const SplitTokensArgs& a, ThreadPool* p) { return SplitTokens(a, p); }
inline absl::Status Run(const SamplePackedTokensArgs& a, ThreadPool* p) {
  return SamplePackedTokens(a, p);
}

}  // namespace tokensel::kernels::cpu

#endif  // TOKENSEL_KERNELS_CPU_CPU_OPS_H_
