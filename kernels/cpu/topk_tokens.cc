// CPU TopKTokens: per row, the R highest-scoring positions in ascending
// position order (ties -> lower position, NaN lowest, -0 == +0).
//
// Per row: map each score's raw bits to an order-preserving key (select.h),
// radix-select the threshold (key T, ties k) of the R largest keys
// (radix_select.h), then one in-order pass emits every position with key > T
// and the first k with key == T (split at the k-th tie, so the pass carries
// no tie counter). O(S) per row; rows run in parallel.
//
// Client memory: each score is read exactly once, into the row's private
// keys; the radix select, the tie cut and the emission read only those keys,
// so a client rewriting its scores can change which positions are taken but
// never make the emission take more than R or fewer (the tie cut finds its
// t.ties equal keys because they are the keys the threshold was computed
// from). Scores never decide an address. The per-row scratch (2 * S keys
// per live chunk) is inherent; ScratchBytes reports it.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/radix_select.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/unaligned.h"
#include "kernels/ops.h"
#include "kernels/select.h"

namespace tokensel::kernels::cpu {
namespace {

// Target scores per parallel chunk.
constexpr int64_t kChunkWork = int64_t{1} << 15;
// Rows at least this long check the stop token between their stages.
constexpr int64_t kLongRow = int64_t{1} << 16;

// Score bits -> key, per dtype.
struct F32Key {
  using Bits = uint32_t;
  static uint32_t Key(uint32_t b) { return ScoreKeyF32(b); }
};
struct F16Key {
  using Bits = uint16_t;
  static uint16_t Key(uint16_t b) { return ScoreKeyF16(b); }
};
struct BF16Key {
  using Bits = uint16_t;
  static uint16_t Key(uint16_t b) { return ScoreKeyBF16(b); }
};

template <typename KeyOf>
void LoadKeys(const char* row, int64_t stride, int64_t s, typename KeyOf::Bits* keys) {
  using Bits = typename KeyOf::Bits;
  if (stride == static_cast<int64_t>(sizeof(Bits))) {
    for (int64_t i = 0; i < s; ++i) keys[i] = KeyOf::Key(LoadAt<Bits>(row + i * sizeof(Bits)));
  } else {
    for (int64_t i = 0; i < s; ++i) keys[i] = KeyOf::Key(LoadAt<Bits>(row + i * stride));
  }
}

// Position after the t.ties-th key equal to t.key (0 when t.ties == 0).
template <typename K>
int64_t TieCut(const K* keys, const TopKThreshold& t) {
  if (t.ties == 0) return 0;
  const K key_t = static_cast<K>(t.key);
  int64_t seen = 0;
  int64_t i = 0;
  while (seen < t.ties) seen += keys[i++] == key_t;
  return i;
}

// Appends the positions in [begin, end) whose key passes `take` to out[n...],
// stopping once n reaches r. Branch-free compaction: slot n is overwritten
// until a taken position lands in it (n < r, so never past the row).
template <typename K, typename I, bool kContiguous, typename Take>
int64_t EmitRange(const K* keys, int64_t begin, int64_t end, Take take, int64_t n, int64_t r,
                  char* out, int64_t stride) {
  for (int64_t i = begin; i < end && n < r; ++i) {
    StoreAt<I>(out + n * (kContiguous ? static_cast<int64_t>(sizeof(I)) : stride),
               static_cast<I>(i));
    n += take(keys[i]);
  }
  return n;
}

// Writes the r positions taken under `t`, in order.
template <typename K, typename I, bool kContiguous>
void EmitTaken(const K* keys, int64_t s, const TopKThreshold& t, int64_t r, char* out,
               int64_t stride) {
  const int64_t cut = TieCut(keys, t);
  const int64_t n = EmitRange<K, I, kContiguous>(
      keys, 0, cut, [t](K k) { return TakeBeforeCut(k, t); }, 0, r, out, stride);
  EmitRange<K, I, kContiguous>(
      keys, cut, s, [t](K k) { return TakeFromCut(k, t); }, n, r, out, stride);
}

template <typename I>
void EmitIota(int64_t r, char* out, int64_t stride) {
  for (int64_t i = 0; i < r; ++i) StoreAt<I>(out + i * stride, static_cast<I>(i));
}

template <typename KeyOf, typename I>
void TopKTyped(const TopKTokensArgs& args, ThreadPool* pool) {
  using K = typename KeyOf::Bits;
  const TensorView& scores = args.scores;
  const TensorView& ids = args.ids;
  const int64_t s = scores.shape[scores.rank - 1];
  const int64_t r = ids.shape[ids.rank - 1];
  const int64_t rows = scores.NumRows();
  if (rows == 0 || r == 0) return;
  const int64_t score_stride = scores.strides[scores.rank - 1] * scores.elem_size();
  const int64_t id_stride = ids.strides[ids.rank - 1] * ids.elem_size();
  const int64_t grain = std::max<int64_t>(1, kChunkWork / s);
  ParallelFor(pool, rows, grain, [&](int64_t begin, int64_t end) {
    std::unique_ptr<K[]> keys;
    std::unique_ptr<K[]> scratch;
    if (r < s) {
      keys.reset(new K[static_cast<size_t>(s)]);
      scratch.reset(new K[static_cast<size_t>(s)]);
    }
    for (int64_t row = begin; row < end; ++row) {
      char* out = ids.At(RowOffset(ids, row));
      if (r == s) {
        EmitIota<I>(r, out, id_stride);
        continue;
      }
      LoadKeys<KeyOf>(scores.At(RowOffset(scores, row)), score_stride, s, keys.get());
      if (s >= kLongRow && !CheckStop().ok()) return;
      const TopKThreshold t = RadixSelect<K>(keys.get(), s, r, scratch.get());
      if (s >= kLongRow && !CheckStop().ok()) return;
      if (id_stride == static_cast<int64_t>(sizeof(I))) {
        EmitTaken<K, I, true>(keys.get(), s, t, r, out, id_stride);
      } else {
        EmitTaken<K, I, false>(keys.get(), s, t, r, out, id_stride);
      }
    }
  });
}

template <typename I>
void TopKByScore(const TopKTokensArgs& args, ThreadPool* pool) {
  switch (args.scores.dtype) {
    case DType::kFloat16:
      return TopKTyped<F16Key, I>(args, pool);
    case DType::kBFloat16:
      return TopKTyped<BF16Key, I>(args, pool);
    default:
      return TopKTyped<F32Key, I>(args, pool);
  }
}

}  // namespace

absl::Status TopKTokens(const TopKTokensArgs& args, ThreadPool* pool) {
  RETURN_IF_ERROR(ValidateTopKTokens(args));
  if (args.ids.dtype == DType::kInt64) {
    TopKByScore<int64_t>(args, pool);
  } else {
    TopKByScore<int32_t>(args, pool);
  }
  return CheckStop();
}

uint64_t ScratchBytes(const TopKTokensArgs& args, int threads) {
  if (!ValidateTopKTokens(args).ok()) return kStatusScratchBytes;
  const int64_t s = args.scores.shape[args.scores.rank - 1];
  const int64_t r = args.ids.shape[args.ids.rank - 1];
  const int64_t rows = args.scores.NumRows();
  if (rows == 0 || r == 0 || r == s) return kStatusScratchBytes;
  // keys + radix candidates: 2 * S keys per live chunk.
  const uint64_t per_chunk = SatMul3(2 * s, args.scores.elem_size(), 1);
  return SatAdd(SatMul(LiveChunks(threads, rows), per_chunk), kStatusScratchBytes);
}

}  // namespace tokensel::kernels::cpu
