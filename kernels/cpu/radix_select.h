// CPU radix select for TopKTokens: the threshold (select.h TopKThreshold) of
// the r largest of n unsigned keys, in O(n) with 8-bit digits, most
// significant first. Each level histograms the current candidates' digit,
// picks the bucket holding the r-th largest and keeps only that bucket's keys
// as the next candidates; it stops early once a whole bucket is taken.
#ifndef TOKENSEL_KERNELS_CPU_RADIX_SELECT_H_
#define TOKENSEL_KERNELS_CPU_RADIX_SELECT_H_

#include <cstdint>
#include <cstring>

#include "kernels/select.h"

namespace tokensel::kernels::cpu {

// hist[b] = number of keys whose digit at `shift` is b. Four interleaved
// sub-histograms keep runs of equal digits from serialising on one counter.
template <typename K>
void DigitHistogram(const K* keys, int64_t n, int shift, int64_t* hist) {
  constexpr unsigned kMask = kSelectBuckets - 1;
  if (n < 4 * kSelectBuckets) {
    for (int b = 0; b < kSelectBuckets; ++b) hist[b] = 0;
    for (int64_t i = 0; i < n; ++i) ++hist[(keys[i] >> shift) & kMask];
    return;
  }
  uint32_t sub[4][kSelectBuckets];
  std::memset(sub, 0, sizeof(sub));
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    ++sub[0][(keys[i] >> shift) & kMask];
    ++sub[1][(keys[i + 1] >> shift) & kMask];
    ++sub[2][(keys[i + 2] >> shift) & kMask];
    ++sub[3][(keys[i + 3] >> shift) & kMask];
  }
  for (; i < n; ++i) ++sub[0][(keys[i] >> shift) & kMask];
  for (int b = 0; b < kSelectBuckets; ++b) {
    hist[b] = int64_t{sub[0][b]} + sub[1][b] + sub[2][b] + sub[3][b];
  }
}

// Copies the keys of `in` whose bits above `shift` equal `prefix` to `out`
// (which may be `in`), in order; returns how many.
template <typename K>
int64_t CompactPrefix(const K* in, int64_t n, int shift, uint32_t prefix, K* out) {
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const K key = in[i];
    out[m] = key;
    m += (static_cast<uint32_t>(key) >> shift) == prefix;
  }
  return m;
}

// Threshold of the r largest of keys[0, n), 0 < r < n. `scratch` holds n keys
// (the candidates); `keys` is not modified.
template <typename K>
TopKThreshold RadixSelect(const K* keys, int64_t n, int64_t r, K* scratch) {
  constexpr int kBits = static_cast<int>(sizeof(K)) * 8;
  int64_t hist[kSelectBuckets];
  const K* cand = keys;
  int64_t count = n;
  int64_t need = r;
  uint32_t prefix = 0;  // digits chosen so far
  for (int shift = kBits - kSelectDigitBits;; shift -= kSelectDigitBits) {
    DigitHistogram(cand, count, shift, hist);
    const int bucket = FindSelectBucket(hist, &need);
    prefix = (prefix << kSelectDigitBits) | static_cast<uint32_t>(bucket);
    if (need == hist[bucket]) {
      // The whole bucket is taken: everything >= its lowest key. That key is
      // > 0 because r < n leaves some key below the bucket.
      return TopKThreshold{(prefix << shift) - 1, 0};
    }
    if (shift == 0) return TopKThreshold{prefix, need};
    count = CompactPrefix(cand, count, shift, prefix, scratch);
    cand = scratch;
  }
}

}  // namespace tokensel::kernels::cpu

#endif  // TOKENSEL_KERNELS_CPU_RADIX_SELECT_H_
