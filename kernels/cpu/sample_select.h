// Row selection of the CPU SampleTokens (kernels/sample_math.h step 2-3):
// given the 64-bit keys of a row, emit the positions of the R smallest keys
// (ties -> lower position) in ascending position order, and optionally the
// inverse map. In a header so tests can drive it with crafted keys (ties
// never occur with real Philox keys).
//
// Algorithm, O(S): histogram the top BucketBits(S) bits of every key, scan
// to the bucket holding the R-th smallest key, nth_element inside that bucket
// (about 8-16 keys) gives the threshold T, then one branch-free pass keeps
// every key < T plus the first ties == T.
#ifndef TOKENSEL_KERNELS_CPU_SAMPLE_SELECT_H_
#define TOKENSEL_KERNELS_CPU_SAMPLE_SELECT_H_

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

namespace tokensel::kernels::cpu {

// Top key bits histogrammed: S/16 to S/8 buckets (8 to 16 keys each, a
// small histogram to clear and scan), between 2 and 2^16.
inline int BucketBits(int64_t S) {
  const int width = static_cast<int>(std::bit_width(static_cast<uint64_t>(S)));
  return std::clamp(width - 4, 1, 16);
}

struct SelectScratch {
  std::vector<uint32_t> hist;    // [1 << BucketBits(S)]
  std::vector<uint64_t> bucket;  // keys of the bucket holding the R-th key
};

struct Threshold {
  uint64_t key = 0;        // T, the R-th smallest key
  int64_t take_equal = 0;  // keys == T that are kept (the lowest positions)
  int64_t num_equal = 0;   // keys == T in the row
};

// T for 1 <= R <= S.
inline Threshold FindThreshold(const uint64_t* keys, int64_t S, int64_t R, SelectScratch& scratch) {
  const int bits = BucketBits(S);
  const int shift = 64 - bits;
  scratch.hist.assign(size_t{1} << bits, 0u);
  uint32_t* hist = scratch.hist.data();
  for (int64_t s = 0; s < S; ++s) ++hist[keys[s] >> shift];
  int64_t below = 0;  // keys in the buckets before `target`
  uint64_t target = 0;
  while (below + hist[target] < R) below += hist[target++];
  // Branch-free compaction of the target bucket (one slack slot).
  const int64_t size = hist[target];
  std::vector<uint64_t>& bucket = scratch.bucket;
  if (static_cast<int64_t>(bucket.size()) < size + 1) bucket.resize(size + 1);
  uint64_t* out = bucket.data();
  int64_t m = 0;
  for (int64_t s = 0; s < S; ++s) {
    out[m] = keys[s];
    m += (keys[s] >> shift) == target;
  }
  const auto nth = bucket.begin() + (R - below - 1);
  std::nth_element(bucket.begin(), nth, bucket.begin() + size);
  Threshold t;
  t.key = *nth;
  int64_t less = below;
  for (int64_t i = 0; i < size; ++i) {
    less += out[i] < t.key;
    t.num_equal += out[i] == t.key;
  }
  t.take_equal = R - less;
  return t;
}

// picked[0, R) = kept positions, ascending; picked needs S + 1 slots (the
// branch-free loop stores one slot past the last kept position). When inv is
// not null, the int32 at inv + s * inv_stride (bytes; any alignment) becomes
// the rank of s or -1.
inline void EmitKept(const uint64_t* keys, int64_t S, const Threshold& t, int32_t* picked,
                     char* inv, int64_t inv_stride) {
  int64_t n = 0;
  if (t.take_equal == t.num_equal) {
    // Every key == T is kept: the common case (no 64-bit tie at T).
    if (inv == nullptr) {
      for (int64_t s = 0; s < S; ++s) {
        picked[n] = static_cast<int32_t>(s);
        n += keys[s] <= t.key;
      }
    } else {
      for (int64_t s = 0; s < S; ++s) {
        const bool keep = keys[s] <= t.key;
        picked[n] = static_cast<int32_t>(s);
        const int32_t rank = keep ? static_cast<int32_t>(n) : -1;
        std::memcpy(inv + s * inv_stride, &rank, sizeof(rank));
        n += keep;
      }
    }
    return;
  }
  int64_t eq_left = t.take_equal;
  for (int64_t s = 0; s < S; ++s) {
    const uint64_t k = keys[s];
    const bool keep = k < t.key || (k == t.key && eq_left > 0);
    eq_left -= keep && k == t.key;
    picked[n] = static_cast<int32_t>(s);
    if (inv != nullptr) {
      const int32_t rank = keep ? static_cast<int32_t>(n) : -1;
      std::memcpy(inv + s * inv_stride, &rank, sizeof(rank));
    }
    n += keep;
  }
}

// The whole row: R == 0 keeps nothing, R == S everything (keys unused).
inline void SelectRow(const uint64_t* keys, int64_t S, int64_t R, SelectScratch& scratch,
                      int32_t* picked, char* inv, int64_t inv_stride) {
  if (R == 0 || R == S) {
    for (int64_t s = 0; s < R; ++s) picked[s] = static_cast<int32_t>(s);
    if (inv != nullptr) {
      for (int64_t s = 0; s < S; ++s) {
        const int32_t rank = R == 0 ? -1 : static_cast<int32_t>(s);
        std::memcpy(inv + s * inv_stride, &rank, sizeof(rank));
      }
    }
    return;
  }
  EmitKept(keys, S, FindThreshold(keys, S, R, scratch), picked, inv, inv_stride);
}

}  // namespace tokensel::kernels::cpu

#endif  // TOKENSEL_KERNELS_CPU_SAMPLE_SELECT_H_
