// Row selection of the CPU SampleTokens (kernels/sample_math.h step 2-3):
// given the 64-bit keys of a row, emit the positions of the R smallest keys
// (ties -> lower position) in ascending position order, and optionally the
// inverse map. In a header so tests can drive it with crafted keys (ties
// never occur with real Philox keys).
//
// Algorithm, O(S): histogram the top BucketBits(S) bits of every key, scan
// to the bucket holding the R-th smallest key, nth_element inside that bucket
// (about 8-16 keys) gives the threshold T, then one branch-free pass keeps
// every key < T plus the first ties == T. A bucket of more than
// MaxBucketKeys(S) keys (crafted keys only) is narrowed first, so the scratch
// is bounded (SelectScratchBytes) whatever the keys.
#ifndef TOKENSEL_KERNELS_CPU_SAMPLE_SELECT_H_
#define TOKENSEL_KERNELS_CPU_SAMPLE_SELECT_H_

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/stop.h"

namespace tokensel::kernels::cpu {

// Top key bits histogrammed: S/16 to S/8 buckets (8 to 16 keys each, a
// small histogram to clear and scan), between 2 and 2^16.
inline int BucketBits(int64_t S) {
  const int width = static_cast<int>(std::bit_width(static_cast<uint64_t>(S)));
  return std::clamp(width - 4, 1, 16);
}

// Rows longer than this use SelectRowChunked (12 MiB of dense scratch per
// thread at the limit), with keys made kSelectChunk at a time (512 KiB).
inline constexpr int64_t kChunkedSelectMinS = int64_t{1} << 20;
inline constexpr int64_t kSelectChunk = int64_t{1} << 16;

// Most keys the threshold bucket may hold: 4x the mean bucket size (8 to 16
// keys; S/2^16 <= 2^15 for long rows), at least 256. Random keys put 1 +
// Poisson(mean) keys in it, so more practically never happens; crafted keys
// could put all S, so a larger bucket is narrowed by histogramming its next
// BucketBits(S) bits first (one more pass over the keys per level, with the
// same histogram): the scratch stays bounded whatever the keys are.
inline int64_t MaxBucketKeys(int64_t S) {
  const int64_t mean = ((S - 1) >> BucketBits(S)) + 1;
  return std::max<int64_t>(256, 4 * mean);
}

struct SelectScratch {
  std::vector<uint32_t> hist;    // [1 << BucketBits(S)]
  std::vector<uint64_t> bucket;  // keys of the bucket holding the R-th key (+ 1 slack)
};

// Sets `v` to n zeros. When it must grow, the old block is freed first, so
// the peak is n elements, not old + n.
template <typename T>
void ZeroFill(std::vector<T>& v, size_t n) {
  if (v.capacity() < n) std::vector<T>().swap(v);
  v.assign(n, T{0});
}

// Heap bytes SelectRow / SelectRowChunked may hold in a SelectScratch for
// rows of S positions (the histogram and the bucket, at their largest), with
// the bucket limit `max_bucket` (0: MaxBucketKeys(S)).
inline uint64_t SelectScratchBytes(int64_t S, int64_t max_bucket = 0) {
  if (max_bucket <= 0) max_bucket = MaxBucketKeys(S);
  const uint64_t hist = (uint64_t{1} << BucketBits(S)) * sizeof(uint32_t);
  const uint64_t bucket = static_cast<uint64_t>(std::min(S, max_bucket) + 1) * sizeof(uint64_t);
  return hist + bucket;
}

struct Threshold {
  uint64_t key = 0;        // T, the R-th smallest key
  int64_t take_equal = 0;  // keys == T that are kept (the lowest positions)
  int64_t num_equal = 0;   // keys == T in the row
};

// T from the bucket holding the R-th smallest key: `bucket[0, size)` are its
// keys (reordered), `below` the keys in lower buckets.
inline Threshold ThresholdInBucket(std::vector<uint64_t>& bucket, int64_t size, int64_t below,
                                   int64_t R) {
  const auto nth = bucket.begin() + (R - below - 1);
  std::nth_element(bucket.begin(), nth, bucket.begin() + size);
  Threshold t;
  t.key = *nth;
  int64_t less = below;
  for (int64_t i = 0; i < size; ++i) {
    less += bucket[i] < t.key;
    t.num_equal += bucket[i] == t.key;
  }
  t.take_equal = R - less;
  return t;
}

// The bucket holding the R-th smallest key of a histogram, and the number of
// keys in the buckets below it.
inline uint64_t TargetBucket(const std::vector<uint32_t>& hist, int64_t R, int64_t* below) {
  *below = 0;
  uint64_t target = 0;
  while (*below + hist[target] < R) *below += hist[target++];
  return target;
}

// T for 1 <= R < S, from a row's keys visited by for_each_chunk(visit):
// visit(const uint64_t* keys, int64_t count) for consecutive chunks of the
// row; for_each_chunk returns false when it stopped early (stop.h), and then
// so does this (t is meaningless). Passes: the top-bits histogram, a
// narrowing histogram per level while the target bucket holds more than
// `max_bucket` keys (0: MaxBucketKeys(S); never with random keys), the
// bucket's collection.
template <typename ForEachChunk>
bool FindThreshold(ForEachChunk&& for_each_chunk, int64_t S, int64_t R, SelectScratch& scratch,
                   Threshold* t, int64_t max_bucket = 0) {
  if (max_bucket <= 0) max_bucket = MaxBucketKeys(S);
  const int digit_bits = BucketBits(S);
  int bits = digit_bits;  // of the prefix that names the target bucket
  ZeroFill(scratch.hist, size_t{1} << bits);
  uint32_t* hist = scratch.hist.data();
  const int top_shift = 64 - bits;
  if (!for_each_chunk([&](const uint64_t* keys, int64_t count) {
        for (int64_t i = 0; i < count; ++i) ++hist[keys[i] >> top_shift];
      })) {
    return false;
  }
  int64_t below = 0;  // keys in the buckets before the target
  uint64_t prefix = TargetBucket(scratch.hist, R, &below);
  int64_t size = hist[prefix];
  while (size > max_bucket && bits < 64) {
    const int digit = std::min(digit_bits, 64 - bits);
    const int shift = 64 - bits;  // keys >> shift is their prefix
    ZeroFill(scratch.hist, size_t{1} << digit);
    hist = scratch.hist.data();
    const uint64_t mask = (uint64_t{1} << digit) - 1;
    if (!for_each_chunk([&](const uint64_t* keys, int64_t count) {
          for (int64_t i = 0; i < count; ++i) {
            if ((keys[i] >> shift) == prefix) ++hist[(keys[i] >> (shift - digit)) & mask];
          }
        })) {
      return false;
    }
    int64_t below_in = 0;
    const uint64_t target = TargetBucket(scratch.hist, R - below, &below_in);
    below += below_in;
    prefix = (prefix << digit) | target;
    bits += digit;
    size = hist[target];
  }
  if (bits == 64) {  // every key of the bucket is `prefix`
    *t = Threshold{prefix, R - below, size};
    return true;
  }
  // Branch-free compaction of the target bucket (one slack slot).
  std::vector<uint64_t>& bucket = scratch.bucket;
  if (static_cast<int64_t>(bucket.size()) < size + 1) {
    std::vector<uint64_t>().swap(bucket);
    bucket.resize(static_cast<size_t>(size + 1));
  }
  uint64_t* out = bucket.data();
  int64_t m = 0;
  const int shift = 64 - bits;
  if (!for_each_chunk([&](const uint64_t* keys, int64_t count) {
        for (int64_t i = 0; i < count; ++i) {
          out[m] = keys[i];
          m += (keys[i] >> shift) == prefix;
        }
      })) {
    return false;
  }
  *t = ThresholdInBucket(bucket, size, below, R);
  return true;
}

// Where the emission of one row stands: positions kept so far, and keys
// == T that may still be kept (the lowest positions win ties).
struct EmitCursor {
  int64_t n = 0;
  int64_t eq_left = 0;
};

// Emits the kept positions among keys[0, count), which are the keys of
// positions [first, first + count) of a row (a whole row, or one chunk of it
// in position order): picked[cursor.n...] gets the kept positions,
// ascending; picked needs R + 1 slots (the branch-free loop stores one slot
// past the last kept position). When inv is not null (the row's start), the
// int32 at inv + s * inv_stride (bytes; any alignment) becomes the rank of
// position s or -1.
inline void EmitKeptRange(const uint64_t* keys, int64_t first, int64_t count, const Threshold& t,
                          EmitCursor& cursor, int32_t* picked, char* inv, int64_t inv_stride) {
  int64_t n = cursor.n;
  char* const inv_at = inv == nullptr ? nullptr : inv + first * inv_stride;  // position `first`
  if (t.take_equal == t.num_equal) {
    // Every key == T is kept: the common case (no 64-bit tie at T).
    if (inv_at == nullptr) {
      for (int64_t i = 0; i < count; ++i) {
        picked[n] = static_cast<int32_t>(first + i);
        n += keys[i] <= t.key;
      }
    } else {
      for (int64_t i = 0; i < count; ++i) {
        const bool keep = keys[i] <= t.key;
        picked[n] = static_cast<int32_t>(first + i);
        const int32_t rank = keep ? static_cast<int32_t>(n) : -1;
        std::memcpy(inv_at + i * inv_stride, &rank, sizeof(rank));
        n += keep;
      }
    }
    cursor.n = n;
    return;
  }
  int64_t eq_left = cursor.eq_left;
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t k = keys[i];
    const bool keep = k < t.key || (k == t.key && eq_left > 0);
    eq_left -= keep && k == t.key;
    picked[n] = static_cast<int32_t>(first + i);
    if (inv_at != nullptr) {
      const int32_t rank = keep ? static_cast<int32_t>(n) : -1;
      std::memcpy(inv_at + i * inv_stride, &rank, sizeof(rank));
    }
    n += keep;
  }
  cursor = {n, eq_left};
}

// The whole row: R == 0 keeps nothing, R == S everything (keys unused).
inline void SelectRow(const uint64_t* keys, int64_t S, int64_t R, SelectScratch& scratch,
                      int32_t* picked, char* inv, int64_t inv_stride, int64_t max_bucket = 0) {
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
  Threshold t;
  FindThreshold(
      [&](auto&& visit) {
        visit(keys, S);
        return true;
      },
      S, R, scratch, &t, max_bucket);
  EmitCursor cursor{0, t.take_equal};
  EmitKeptRange(keys, 0, S, t, cursor, picked, inv, inv_stride);
}

// SelectRow for long rows, with the keys produced chunk by chunk instead of
// held whole (S * 12 bytes of scratch per thread would let one request with
// S = 2^31 - 1 ask for 24 GiB): three passes over the keys (histogram,
// target bucket, emission; more only for crafted keys, see MaxBucketKeys),
// each recomputing them. Same threshold and the same keep rule, so the same
// result as SelectRow; memory O(chunk + bucket) plus `picked` (R + 1 slots,
// as for SelectRow). Checks the stop token (stop.h) before every chunk:
// returns false when stopped (then picked and inv are partial).
// keys_of(begin, count, out) writes the keys of positions [begin, begin +
// count) to out; begin is a multiple of `chunk` (> 0).
template <typename KeysOf>
bool SelectRowChunked(KeysOf&& keys_of, int64_t S, int64_t R, int64_t chunk, SelectScratch& scratch,
                      std::vector<uint64_t>& keys, int32_t* picked, char* inv, int64_t inv_stride,
                      int64_t max_bucket = 0) {
  if (R == 0 || R == S) {
    SelectRow(nullptr, S, R, scratch, picked, inv, inv_stride);
    return true;
  }
  keys.resize(static_cast<size_t>(chunk));
  // visit(begin, count, keys) for every chunk, in order; false once stopped.
  auto for_each_chunk = [&](auto&& visit) {
    for (int64_t begin = 0; begin < S; begin += chunk) {
      if (!CheckStop().ok()) return false;
      const int64_t count = std::min(chunk, S - begin);
      keys_of(begin, count, keys.data());
      visit(begin, count, keys.data());
    }
    return true;
  };
  Threshold t;
  if (!FindThreshold(
          [&](auto&& visit) {
            return for_each_chunk(
                [&](int64_t, int64_t count, const uint64_t* k) { visit(k, count); });
          },
          S, R, scratch, &t, max_bucket)) {
    return false;
  }
  EmitCursor cursor{0, t.take_equal};
  return for_each_chunk([&](int64_t begin, int64_t count, const uint64_t* k) {
    EmitKeptRange(k, begin, count, t, cursor, picked, inv, inv_stride);
  });
}

}  // namespace tokensel::kernels::cpu

#endif  // TOKENSEL_KERNELS_CPU_SAMPLE_SELECT_H_
