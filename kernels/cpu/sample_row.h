// One sampled row of the SampleTokens selection contract
// (kernels/sample_math.h): the Philox keys of row (l, b) and the radix select
// of sample_select.h, shared by SampleTokens (rows of a [L,B,S] batch) and
// SamplePackedTokens (one row per packed sequence, b = the sequence index),
// so that equal-length sequences reproduce SampleTokens bit for bit.
#ifndef TOKENSEL_KERNELS_CPU_SAMPLE_ROW_H_
#define TOKENSEL_KERNELS_CPU_SAMPLE_ROW_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/cpu/sample_select.h"
#include "kernels/philox.h"

namespace tokensel::kernels::cpu {

// keys[i] = k(begin + i) of row (l, b) for i in [0, count); `begin` is even.
// Vectorized (64 Philox counters at a time; an AVX-512 clone on x86-64 GCC).
void ComputeRowKeys(Philox4x32Key key, uint32_t l, uint32_t b, uint32_t step, int64_t begin,
                    int64_t count, uint64_t* keys);

// The per-thread scratch of SampleRow, reused across rows of any length.
struct SampleRowScratch {
  std::unique_ptr<uint64_t[]> keys;  // a whole row's keys (rows <= kChunkedSelectMinS)
  int64_t keys_capacity = 0;
  std::vector<uint64_t> chunk_keys;  // longer rows: kSelectChunk keys at a time
  SelectScratch select;
};

// Heap bytes SampleRow holds in a SampleRowScratch for rows of at most S
// positions, picked excluded (metadata only).
uint64_t SampleRowScratchBytes(int64_t S);

// Row (l, b) of S positions keeping R (0 <= R <= S): picked[0, R) gets the
// kept positions, ascending (picked needs R + 1 slots); when inv is not null
// the int32 at inv + s * inv_stride (bytes) becomes the rank of s or -1.
// Rows longer than kChunkedSelectMinS check the stop token between chunks:
// returns false when stopped (picked and inv partial), true otherwise.
bool SampleRow(Philox4x32Key key, uint32_t l, uint32_t b, uint32_t step, int64_t S, int64_t R,
               SampleRowScratch& scratch, int32_t* picked, char* inv, int64_t inv_stride);

}  // namespace tokensel::kernels::cpu

#endif  // TOKENSEL_KERNELS_CPU_SAMPLE_ROW_H_
