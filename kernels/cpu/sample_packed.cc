// CPU SamplePackedTokens (ops.h op 11).
//
// 1. cu_seqlens is copied once into private memory and checked there
//    (CheckPackedCuSeqlens): every address below comes from that copy, so a
//    client rewriting cu_seqlens during the call changes nothing.
// 2. r_i and the prefix sums cu_kept (private, int64) give T', and the dims
//    that depend on it are checked: nothing is written before this point.
// 3. Tasks (l, i) run in parallel, grouped so that a chunk holds about
//    kGrainTokens tokens: SampleRow (kernels/cpu/sample_row.h, the very code
//    of SampleTokens, b = i) picks sequence i's kept positions into private
//    memory, and the task writes its slices of ids, positions, inverse and,
//    for L = 1, copies the kept activation rows to out. Every output element
//    is written by exactly one task, from private values only (no output is
//    read back), so the result is the same for any thread count.
// 4. inverse entries at or past cu[N] get -1.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "kernels/cpu/copy_rows.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/sample_row.h"
#include "kernels/cpu/scratch.h"
#include "kernels/sample_math.h"

namespace tokensel::kernels::cpu {
namespace {

// Tokens per ParallelFor chunk, at least (sequences are never split).
constexpr int64_t kGrainTokens = int64_t{1} << 14;

// Element (row, col) of an int32 [rows, cols] view.
void StoreInt32(const TensorView& v, int64_t row, int64_t col, int32_t value) {
  std::memcpy(v.At(row * v.strides[0] + col * v.strides[1]), &value, sizeof(value));
}

// A private copy of cu_seqlens (read once, element by element).
std::vector<int32_t> SnapshotCu(const TensorView& cu) {
  const int64_t n = cu.shape[0];
  std::vector<int32_t> copy(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) std::memcpy(&copy[i], cu.At(i * cu.strides[0]), sizeof(int32_t));
  return copy;
}

}  // namespace

absl::Status SamplePackedTokens(const SamplePackedTokensArgs& args, ThreadPool* pool) {
  RETURN_IF_ERROR(ValidateSamplePackedTokens(args));
  const std::vector<int32_t> cu = SnapshotCu(args.cu_seqlens);
  const int64_t n_plus_1 = static_cast<int64_t>(cu.size());
  const int64_t N = n_plus_1 - 1, L = args.layers, T = args.total_tokens;
  RETURN_IF_ERROR(CheckPackedCuSeqlens(cu.data(), n_plus_1, T));
  std::vector<int64_t> kept(static_cast<size_t>(n_plus_1), 0);  // cu_seqlens_kept
  int64_t max_keep = 0;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t r =
        PackedKeep(int64_t{cu[i + 1]} - cu[i], args.keep_num, args.keep_den, args.min_tokens);
    kept[i + 1] = kept[i] + r;
    max_keep = std::max(max_keep, r);
  }
  RETURN_IF_ERROR(CheckPackedKeptDims(args, kept[N]));

  // Writing starts here.
  const TensorView& cu_kept = args.cu_seqlens_kept;  // int32 [N+1]
  for (int64_t i = 0; i <= N; ++i) {
    const auto value = static_cast<int32_t>(kept[i]);
    std::memcpy(cu_kept.At(i * cu_kept.strides[0]), &value, sizeof(value));
  }
  const std::optional<TensorView>& inverse = args.inverse;
  if (inverse) {
    for (int64_t l = 0; l < L; ++l) {
      for (int64_t t = cu[N]; t < T; ++t) StoreInt32(*inverse, l, t, -1);
    }
  }
  const int64_t tasks = L * N;
  const int64_t mean_tokens = N > 0 ? std::max<int64_t>(1, cu[N] / N) : 1;
  const int64_t grain = std::max<int64_t>(1, kGrainTokens / mean_tokens);
  const Philox4x32Key key = SampleKey(args.seed);
  const auto step = static_cast<uint32_t>(args.step);
  const int64_t C = args.activations ? args.activations->shape[1] : 0;
  const bool gather = args.out.has_value();
  const TensorView act = gather ? *args.activations : TensorView{};
  const TensorView out = gather ? *args.out : TensorView{};
  const int64_t act_row = act.strides[0] * act.elem_size();  // bytes
  const int64_t out_row = out.strides[0] * out.elem_size();
  // One copier for the whole output (T' rows, L == 1 with out), so that a
  // large output streams past the caches however short its sequences are.
  DispatchRowCopy(
      act.elem_size(), C, out.strides[1], act.strides[1], gather ? kept[N] : 0,
      [&](const auto& copy) {
        ParallelFor(pool, tasks, grain, [&](int64_t begin, int64_t end) {
          std::vector<int32_t> picked(static_cast<size_t>(max_keep) + 1);
          SampleRowScratch scratch;
          for (int64_t task = begin; task < end; ++task) {
            const int64_t l = task / N, i = task % N;
            const int64_t first = cu[i], n = int64_t{cu[i + 1]} - cu[i], r = kept[i + 1] - kept[i];
            if (!SampleRow(key, static_cast<uint32_t>(l), static_cast<uint32_t>(i), step, n, r,
                           scratch, picked.data(), nullptr, 0)) {
              break;  // stopped; Finish still fences the rows written
            }
            const int64_t base = kept[i];
            for (int64_t k = 0; k < r; ++k) {
              StoreInt32(args.ids, l, base + k, static_cast<int32_t>(first + picked[k]));
              if (args.positions) StoreInt32(*args.positions, l, base + k, picked[k]);
            }
            if (inverse) {
              for (int64_t s = 0; s < n; ++s) StoreInt32(*inverse, l, first + s, -1);
              for (int64_t k = 0; k < r; ++k) {
                StoreInt32(*inverse, l, first + picked[k], static_cast<int32_t>(base + k));
              }
            }
            if (gather) {
              for (int64_t k = 0; k < r; ++k) {
                copy(out.At(0) + (base + k) * out_row, act.At(0) + (first + picked[k]) * act_row);
              }
            }
          }
          copy.Finish();
        });
      });
  return CheckStop();
}

uint64_t ScratchBytes(const SamplePackedTokensArgs& args, int threads) {
  if (!ValidateSamplePackedTokens(args).ok()) return kStatusScratchBytes;
  const int64_t n_plus_1 = args.cu_seqlens.shape[0], T = args.total_tokens;
  // cu snapshot + kept prefix sums, then per live chunk: picked (r_i + 1 <=
  // T + 1 slots) and SampleRow's scratch for rows of at most T positions.
  const uint64_t fixed =
      SatAdd(SatMul3(n_plus_1, sizeof(int32_t), 1), SatMul3(n_plus_1, sizeof(int64_t), 1));
  const uint64_t per_chunk = SatAdd(SatMul3(T + 1, sizeof(int32_t), 1), SampleRowScratchBytes(T));
  const uint64_t chunks = LiveChunks(threads, args.layers * (n_plus_1 - 1));
  return SatAdd(SatAdd(fixed, SatMul(chunks, per_chunk)), kStatusScratchBytes);
}

}  // namespace tokensel::kernels::cpu
