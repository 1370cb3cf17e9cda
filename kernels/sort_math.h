// Index arithmetic of SortTokens shared by the CPU and CUDA kernels: the
// per-row bitmap of S bits (uint64 words) that the comparison-free sort marks
// ids in and then scans in ascending order.
#ifndef TOKENSEL_KERNELS_SORT_MATH_H_
#define TOKENSEL_KERNELS_SORT_MATH_H_

#include <cstdint>

#include "kernels/hd.h"

namespace tokensel::kernels {

inline constexpr int kBitmapWordBits = 64;

// Number of uint64 words holding S bits.
TOKENSEL_HD constexpr int64_t BitmapWords(int64_t original_tokens) {
  return (original_tokens + kBitmapWordBits - 1) / kBitmapWordBits;
}

// True when `id` is a valid id of a row of S tokens: 0 <= id < S.
TOKENSEL_HD constexpr bool IdInRange(int64_t id, int64_t original_tokens) {
  return static_cast<uint64_t>(id) < static_cast<uint64_t>(original_tokens);
}

// Word index and bit mask of `id` (already in range).
TOKENSEL_HD constexpr int64_t BitmapWord(int64_t id) { return id >> 6; }
TOKENSEL_HD constexpr uint64_t BitmapMask(int64_t id) { return uint64_t{1} << (id & 63); }

// Sets the bit of `id`; returns whether it was already set (a duplicate).
TOKENSEL_HD bool TestAndSetBit(uint64_t* words, int64_t id) {
  const uint64_t word = words[BitmapWord(id)];
  const uint64_t mask = BitmapMask(id);
  words[BitmapWord(id)] = word | mask;
  return (word & mask) != 0;
}

// Work units of one SortTokens row (marking R ids, scanning S/64 words and,
// with an inverse, filling S entries): used to size parallel chunks.
TOKENSEL_HD constexpr int64_t SortRowCost(int64_t r, int64_t original_tokens, bool inverse) {
  return r + BitmapWords(original_tokens) + (inverse ? original_tokens : 0);
}

}  // namespace tokensel::kernels

#endif  // TOKENSEL_KERNELS_SORT_MATH_H_
