// Shared by the two halves of the CUDA SamplePackedTokens: sample_packed.cu
// (checks, scans, the short sequences, the tail, Finish) and
// sample_packed_long.cu (the long sequences, chunked over many blocks; plan:
// sample_packed_plan.h). Device code; include from .cu files only.
#ifndef TOKENSEL_KERNELS_CUDA_SAMPLE_PACKED_INTERNAL_CUH_
#define TOKENSEL_KERNELS_CUDA_SAMPLE_PACKED_INTERNAL_CUH_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/sample_packed_plan.h"
#include "kernels/cuda/view_access.cuh"
#include "kernels/tensor_view.h"

namespace tokensel::kernels::cuda {

struct PackedOutputs {
  TensorView ids;        // int32 [L,T']
  TensorView positions;  // int32 [L,T'] (data null when absent)
  TensorView inverse;    // int32 [L,T] (kInverse)
  int32_t* gather_ids;   // workspace, [T'] (null without out)
  bool ids_aligned, pos_aligned, inv_aligned;
};

// The writes of one kept / dropped token of sequence i (first token `first`
// in the pack, first kept slot `base` in the layer's ids) in layer l. Both
// paths write through it, so they write the same bytes.
template <bool kInverse>
struct PackedWriter {
  const PackedOutputs& o;
  int64_t l, first, base;

  // Position `position` of the sequence is kept, at slot `slot` (< r_i).
  __device__ __forceinline__ void Kept(int64_t position, int64_t slot) const {
    const int64_t k = base + slot;
    const auto id = static_cast<int32_t>(first + position);
    StoreI32(o.ids.data, l * o.ids.strides[0] + k * o.ids.strides[1], id, o.ids_aligned);
    if (o.positions.data != nullptr) {
      StoreI32(o.positions.data, l * o.positions.strides[0] + k * o.positions.strides[1],
               static_cast<int32_t>(position), o.pos_aligned);
    }
    if (o.gather_ids != nullptr) o.gather_ids[k] = id;
    if (kInverse) {
      StoreI32(o.inverse.data, l * o.inverse.strides[0] + (first + position) * o.inverse.strides[1],
               static_cast<int32_t>(k), o.inv_aligned);
    }
  }
  __device__ __forceinline__ void Dropped(int64_t position) const {
    if (kInverse) {
      StoreI32(o.inverse.data, l * o.inverse.strides[0] + (first + position) * o.inverse.strides[1],
               -1, o.inv_aligned);
    }
  }
};

// The dims the caller sized with T' (-1 = the tensor is absent).
struct PackedKeptDims {
  int64_t ids, positions, out;
};

// Enqueues the prefix sums of kept[1..n] and chunk_base[1..n] in place
// (sample_packed_scan.cu; tile_sums: 2 * PackedScanTiles(n) int64 of
// workspace), then records T' in the report and flags a T' that differs
// from `dims`. Not gated: it only reads and writes the workspace.
absl::Status LaunchPackedScan(long long* kept, long long* chunk_base, int64_t n,
                              long long* tile_sums, PackedKeptDims dims, long long* report,
                              Workspace ws, Stream stream);

// The workspace the long path reads and writes (SamplePackedLayout), after
// LaunchPackedScan: kept and chunk_base hold their exclusive prefix sums at
// [i] (kept[i + 1] - kept[i] = r_i), chunk_base[n] = the chunk count G.
struct PackedLongArgs {
  const int32_t* cu;            // snapshot, N+1
  const long long* kept;        // N+1
  const long long* chunk_base;  // N+1
  int64_t n, layers;
  int64_t max_chunks, long_slots;  // host bounds (PackedMaxChunks, PackedLongSlots)
  uint64_t seed, step;
  PackedLongState* state;      // [L][long_slots]
  uint32_t* hist;              // [L][long_slots][256]
  unsigned long long* counts;  // [L][max_chunks]
};

// Enqueues the long path (sample_packed_long.cu): every kernel returns at
// once when the status word is set, and does nothing when no sequence is
// long. Requires a.max_chunks > 0.
absl::Status LaunchPackedLong(const PackedLongArgs& a, const PackedOutputs& o, bool inverse,
                              Workspace ws, Stream stream);

}  // namespace tokensel::kernels::cuda

#endif  // TOKENSEL_KERNELS_CUDA_SAMPLE_PACKED_INTERNAL_CUH_
