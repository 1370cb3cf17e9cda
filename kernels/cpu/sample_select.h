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

// Rows longer than this use SelectRowChunked (12 MiB of dense scratch per
// thread at the limit), with keys made kSelectChunk at a time (512 KiB).
inline constexpr int64_t kChunkedSelectMinS = int64_t{1} << 20;
inline constexpr int64_t kSelectChunk = int64_t{1} << 16;

struct SelectScratch {
  std::vector<uint32_t> hist;    // [1 << BucketBits(S)]
  std::vector<uint64_t> bucket;  // keys of the bucket holding the R-th key
};

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

// T for 1 <= R <= S.
inline Threshold FindThreshold(const uint64_t* keys, int64_t S, int64_t R, SelectScratch& scratch) {
  const int bits = BucketBits(S);
  const int shift = 64 - bits;
  scratch.hist.assign(size_t{1} << bits, 0u);
  uint32_t* hist = scratch.hist.data();
  for (int64_t s = 0; s < S; ++s) ++hist[keys[s] >> shift];
  int64_t below = 0;  // keys in the buckets before `target`
  const uint64_t target = TargetBucket(scratch.hist, R, &below);
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
  return ThresholdInBucket(bucket, size, below, R);
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
  const Threshold t = FindThreshold(keys, S, R, scratch);
  EmitCursor cursor{0, t.take_equal};
  EmitKeptRange(keys, 0, S, t, cursor, picked, inv, inv_stride);
}

// SelectRow for long rows, with the keys produced chunk by chunk instead of
// held whole (S * 12 bytes of scratch per thread would let one request with
// S = 2^31 - 1 ask for 24 GiB): three passes over the keys (histogram,
// target bucket, emission), each recomputing them. Same threshold and the
// same keep rule, so the same result as SelectRow; memory O(chunk + bucket)
// plus `picked` (R + 1 slots, as for SelectRow).
// keys_of(begin, count, out) writes the keys of positions [begin, begin +
// count) to out; begin is a multiple of `chunk` (> 0).
template <typename KeysOf>
void SelectRowChunked(KeysOf&& keys_of, int64_t S, int64_t R, int64_t chunk, SelectScratch& scratch,
                      std::vector<uint64_t>& keys, int32_t* picked, char* inv, int64_t inv_stride) {
  if (R == 0 || R == S) return SelectRow(nullptr, S, R, scratch, picked, inv, inv_stride);
  const int bits = BucketBits(S);
  const int shift = 64 - bits;
  keys.resize(static_cast<size_t>(chunk));
  auto for_each_chunk = [&](auto&& visit) {
    for (int64_t begin = 0; begin < S; begin += chunk) {
      const int64_t count = std::min(chunk, S - begin);
      keys_of(begin, count, keys.data());
      visit(begin, count, keys.data());
    }
  };
  scratch.hist.assign(size_t{1} << bits, 0u);
  for_each_chunk([&](int64_t, int64_t count, const uint64_t* k) {
    for (int64_t i = 0; i < count; ++i) ++scratch.hist[k[i] >> shift];
  });
  int64_t below = 0;
  const uint64_t target = TargetBucket(scratch.hist, R, &below);
  std::vector<uint64_t>& bucket = scratch.bucket;
  bucket.clear();
  for_each_chunk([&](int64_t, int64_t count, const uint64_t* k) {
    for (int64_t i = 0; i < count; ++i) {
      if ((k[i] >> shift) == target) bucket.push_back(k[i]);
    }
  });
  const Threshold t = ThresholdInBucket(bucket, static_cast<int64_t>(bucket.size()), below, R);
  EmitCursor cursor{0, t.take_equal};
  for_each_chunk([&](int64_t begin, int64_t count, const uint64_t* k) {
    EmitKeptRange(k, begin, count, t, cursor, picked, inv, inv_stride);
  });
}

}  // namespace tokensel::kernels::cpu

#endif  // TOKENSEL_KERNELS_CPU_SAMPLE_SELECT_H_
