// The SampleTokens selection contract, shared bit-for-bit by the CPU and CUDA
// implementations (kernels/cpu/sample_tokens.cc, kernels/cuda/...).
//
// Row (l, b) of a SampleTokens call with (seed, step, S, R) is defined as:
//
//  1. Every position s in [0, S) gets a 64-bit key. Positions 2p and 2p+1
//     share one Philox4x32-10 draw (kernels/philox.h):
//        key     = {lo32(seed), hi32(seed)}
//        counter = {p = s >> 1, b, l, step}          (all four uint32)
//        out     = Philox4x32_10(counter, key)
//        k(s)    = (uint64(out[2*(s&1)]) << 32) | out[2*(s&1) + 1]
//     i.e. s even uses out[0]:out[1], s odd uses out[2]:out[3] (high:low).
//  2. The row keeps the R positions with the smallest keys; equal keys are
//     ordered by position (the lower position is smaller). Equivalently: with
//     T the R-th smallest key (1-based, R >= 1), keep every s with k(s) < T
//     plus the lowest-positioned (R - #{k < T}) positions with k(s) == T.
//  3. The kept positions are emitted in ascending position order.
//  R == 0 keeps nothing; R == S keeps every position (no keys needed).
//
// Since the keys are i.i.d. uniform (up to the negligible tie rule) the kept
// set is a uniform random R-subset, and the result depends only on
// (seed, step, l, b, S, R): not on the backend, thread count or batch layout.
// Validation guarantees step, l, b < 2^32 and S <= INT32_MAX.
#ifndef TOKENSEL_KERNELS_SAMPLE_MATH_H_
#define TOKENSEL_KERNELS_SAMPLE_MATH_H_

#include <cstdint>

#include "kernels/hd.h"
#include "kernels/philox.h"

namespace tokensel::kernels {

// Largest step (and layer / batch index) the 32-bit counter words can hold.
inline constexpr uint64_t kSampleMaxCounterWord = 0xFFFFFFFFu;

TOKENSEL_HD constexpr Philox4x32Key SampleKey(uint64_t seed) {
  return Philox4x32Key{{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
}

TOKENSEL_HD constexpr Philox4x32Counter SampleCounter(int64_t pair, int64_t l, int64_t b,
                                                      uint64_t step) {
  return Philox4x32Counter{{static_cast<uint32_t>(pair), static_cast<uint32_t>(b),
                            static_cast<uint32_t>(l), static_cast<uint32_t>(step)}};
}

// Key of the even (half == 0) or odd (half == 1) position of a Philox draw.
TOKENSEL_HD constexpr uint64_t SampleKeyHalf(const Philox4x32Counter& out, int half) {
  return (static_cast<uint64_t>(out.v[2 * half]) << 32) | out.v[2 * half + 1];
}

// k(s) of row (l, b): one Philox draw per call. Bulk code draws once per pair.
TOKENSEL_HD constexpr uint64_t SamplePositionKey(uint64_t seed, uint64_t step, int64_t l, int64_t b,
                                                 int64_t s) {
  const Philox4x32Counter out = Philox4x32_10(SampleCounter(s >> 1, l, b, step), SampleKey(seed));
  return SampleKeyHalf(out, static_cast<int>(s & 1));
}

// SamplePackedTokens' r_i (kernels/ops.h op 11): min(n, max(min_tokens,
// ceil(n * keep_num / keep_den))) for 0 <= n <= INT32_MAX, 0 <= keep_num <=
// keep_den, keep_den >= 1, min_tokens >= 0. Exact: n * keep_num (< 2^94) is
// formed in 128 bits. The result is in [0, n].
TOKENSEL_HD constexpr int64_t PackedKeep(int64_t n, int64_t keep_num, int64_t keep_den,
                                         int64_t min_tokens) {
  __extension__ typedef unsigned __int128 U128;  // GCC, Clang and nvcc (host and device)
  const U128 product = static_cast<U128>(n) * static_cast<uint64_t>(keep_num);
  const U128 den = static_cast<uint64_t>(keep_den);
  const auto ceil = static_cast<int64_t>((product + den - 1) / den);  // <= n
  const int64_t wanted = ceil > min_tokens ? ceil : min_tokens;
  return wanted < n ? wanted : n;
}

}  // namespace tokensel::kernels

#endif  // TOKENSEL_KERNELS_SAMPLE_MATH_H_
