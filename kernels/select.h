// Score keys and radix-select steps of TopKTokens, shared by the CPU and CUDA
// kernels (no float arithmetic: keys come from the raw bits).
//
// ScoreKey*() maps a score to an unsigned key whose order is the ranking
// order of TopKTokens: a higher score gives a higher key, -0 and +0 give the
// same key, every NaN (any sign, any payload) gives key 0, below -inf.
// (Keys are internal: only their order matters.)
#ifndef TOKENSEL_KERNELS_SELECT_H_
#define TOKENSEL_KERNELS_SELECT_H_

#include <cstdint>

#include "kernels/hd.h"

namespace tokensel::kernels {

// Keys from IEEE bits of width sizeof(K)*8 with sign bit `kSign` and
// infinity magnitude `kInf`: key = kSign + x (mod 2^bits) where x is the
// signed magnitude, so -0 and +0 both map to kSign and the order of keys is
// the order of values; NaN (magnitude > infinity) maps to 0, below -inf
// (whose key is kSign - kInf > 0). Branch-free, so the CPU loop vectorizes.
template <typename K, K kSign, K kInf>
TOKENSEL_HD K IeeeKey(K bits) {
  const K magnitude = static_cast<K>(bits & static_cast<K>(~kSign));
  const K neg = (bits & kSign) != 0 ? static_cast<K>(~K{0}) : K{0};
  const K signed_magnitude = static_cast<K>((magnitude ^ neg) - neg);  // -magnitude if negative
  const K key = static_cast<K>(kSign + signed_magnitude);
  return magnitude > kInf ? K{0} : key;
}

TOKENSEL_HD uint32_t ScoreKeyF32(uint32_t bits) {
  return IeeeKey<uint32_t, 0x80000000u, 0x7F800000u>(bits);
}
TOKENSEL_HD uint16_t ScoreKeyF16(uint16_t bits) {
  return IeeeKey<uint16_t, uint16_t{0x8000}, uint16_t{0x7C00}>(bits);
}
TOKENSEL_HD uint16_t ScoreKeyBF16(uint16_t bits) {
  return IeeeKey<uint16_t, uint16_t{0x8000}, uint16_t{0x7F80}>(bits);
}

// Radix select works on 8-bit digits, most significant first.
inline constexpr int kSelectDigitBits = 8;
inline constexpr int kSelectBuckets = 1 << kSelectDigitBits;

// The R largest keys of a row are every key > `key` plus the first `ties`
// keys == `key` in position order (ties go to the lower position).
struct TopKThreshold {
  uint32_t key = 0;
  int64_t ties = 0;
};

// Given the digit histogram of the candidates and `need` >= 1 keys still to
// take from them, returns the bucket holding the need-th largest candidate and
// lowers `need` by the count of the buckets above it.
TOKENSEL_HD int FindSelectBucket(const int64_t* hist, int64_t* need) {
  int64_t above = 0;
  int bucket = kSelectBuckets - 1;
  for (; bucket > 0; --bucket) {
    if (above + hist[bucket] >= *need) break;
    above += hist[bucket];
  }
  *need -= above;
  return bucket;
}

// The in-order emission splits the row at `cut`, the position after the
// t.ties-th key equal to t.key (0 when t.ties == 0): positions before it take
// keys >= t.key, positions from it on take keys > t.key.
TOKENSEL_HD bool TakeBeforeCut(uint32_t key, const TopKThreshold& t) { return key >= t.key; }
TOKENSEL_HD bool TakeFromCut(uint32_t key, const TopKThreshold& t) { return key > t.key; }

}  // namespace tokensel::kernels

#endif  // TOKENSEL_KERNELS_SELECT_H_
