// CPU implementations of every operator (the embedded default backend and the
// oracle the CUDA kernels are tested against). Contracts: kernels/ops.h.
//
// Every function validates metadata (Validate<Op>), then the data (indices,
// segment ids), and only then writes: on error nothing was written. Rows run
// in parallel on `pool` (null = the calling thread only); the result is the
// same for any thread count. Thread-safe: concurrent calls on one pool are
// fine as long as their outputs do not overlap.
#ifndef TOKENSEL_KERNELS_CPU_CPU_OPS_H_
#define TOKENSEL_KERNELS_CPU_CPU_OPS_H_

#include "absl/status/status.h"
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

}  // namespace tokensel::kernels::cpu

#endif  // TOKENSEL_KERNELS_CPU_CPU_OPS_H_
