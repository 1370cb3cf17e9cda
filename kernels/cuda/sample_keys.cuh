// The key functor of the block-wide select for sampling (select.cuh's
// KeyFn), shared by SampleTokens (row (l, b)) and SamplePackedTokens
// (sequence i as b): one generator for both ops, so a pack of equal-length
// sequences reproduces SampleTokens bit for bit. Device code only.
#ifndef TOKENSEL_KERNELS_CUDA_SAMPLE_KEYS_CUH_
#define TOKENSEL_KERNELS_CUDA_SAMPLE_KEYS_CUH_

#include <cstdint>

#include "kernels/philox.h"
#include "kernels/sample_math.h"

namespace tokensel::kernels::cuda {

// ~k(s) for the pair of positions starting at `first` (even) of row (l, b)
// (kernels/sample_math.h): the select keeps the largest, so the complement
// keeps the smallest keys with the same tie rule.
struct SampleKeyFn {
  Philox4x32Key key;
  int64_t l;
  int64_t b;
  uint64_t step;

  __device__ __forceinline__ void operator()(int64_t first, uint64_t* keys) const {
    const Philox4x32Counter out = Philox4x32_10(SampleCounter(first >> 1, l, b, step), key);
    keys[0] = ~SampleKeyHalf(out, 0);
    keys[1] = ~SampleKeyHalf(out, 1);
  }
};

}  // namespace tokensel::kernels::cuda

#endif  // TOKENSEL_KERNELS_CUDA_SAMPLE_KEYS_CUH_
