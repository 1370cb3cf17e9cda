// Arithmetic of the ScratchBytes() bounds (cpu_ops.h): saturating at
// UINT64_MAX, so a bound computed from any metadata never wraps.
#ifndef TOKENSEL_KERNELS_CPU_SCRATCH_H_
#define TOKENSEL_KERNELS_CPU_SCRATCH_H_

#include <algorithm>
#include <cstdint>
#include <limits>

namespace tokensel::kernels::cpu {

inline constexpr uint64_t kMaxScratchBytes = std::numeric_limits<uint64_t>::max();

// Heap bytes an error status may hold when the call returns it (the message:
// field names, multi-indices, shapes and strides of up to kMaxRank dims) plus
// the temporaries that build it.
inline constexpr uint64_t kStatusScratchBytes = 2048;

inline uint64_t SatAdd(uint64_t a, uint64_t b) {
  uint64_t sum;
  return __builtin_add_overflow(a, b, &sum) ? kMaxScratchBytes : sum;
}

inline uint64_t SatMul(uint64_t a, uint64_t b) {
  uint64_t product;
  return __builtin_mul_overflow(a, b, &product) ? kMaxScratchBytes : product;
}

// a * b * c for non-negative int64 counts (negative ones count as 0).
inline uint64_t SatMul3(int64_t a, int64_t b, int64_t c) {
  auto u = [](int64_t v) { return v > 0 ? static_cast<uint64_t>(v) : 0; };
  return SatMul(SatMul(u(a), u(b)), u(c));
}

// Chunks of one ParallelFor over `items` that can hold scratch at the same
// time on a pool of `threads` threads (1 = inline).
inline uint64_t LiveChunks(int threads, int64_t items) {
  return static_cast<uint64_t>(std::clamp<int64_t>(items, 0, std::max(threads, 1)));
}

}  // namespace tokensel::kernels::cpu

#endif  // TOKENSEL_KERNELS_CPU_SCRATCH_H_
