// CPU SampleTokens (ops.h op 7): the selection contract of kernels/sample_math.h.
//
// Per row: the Philox keys of all S positions, computed 64 counters at a time
// so the rounds vectorize, into S * 8 bytes of per-chunk scratch; then the
// O(S) radix select + branch-free emission of kernels/cpu/sample_select.h
// (rows longer than kChunkedSelectMinS recompute their keys in chunks instead
// of holding S * 12 bytes, see SelectRowChunked);
// then the ids row is stored (memcpy when int32 and contiguous). Rows run in
// parallel; each row is computed by one thread from (seed, step, l, b) alone,
// so the result does not depend on the thread count. The optional masks are
// produced afterwards by GatherBertMask / SliceGptMask on the sampled ids.
//
// Client memory: the op reads no client data but the optional mask (only
// copied, never an address); the ids it writes are read back by
// GatherBertMask, which snapshots and validates them like any indices.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/sample_row.h"
#include "kernels/cpu/sample_select.h"
#include "kernels/cpu/scratch.h"
#include "kernels/philox.h"
#include "kernels/sample_math.h"

namespace tokensel::kernels::cpu {
namespace {

// Pairs of positions per Philox block: the rounds loop runs over 64
// independent counters held in small arrays, which compilers vectorize
// (32x32->64 widening multiplies, e.g. SSE2 pmuludq).
constexpr int kBlockPairs = 64;
// Positions per ParallelFor chunk (rows are split no finer than this).
constexpr int64_t kGrainPositions = int64_t{1} << 14;

// On x86-64 GCC builds PhiloxBlock is also compiled for x86-64-v4 (AVX-512:
// 8 lanes per multiply, about 1.8x faster) and picked at load time; the
// arithmetic, hence every key, is the same on every path.
// (Not under ThreadSanitizer: the ifunc resolver runs before the TSan
// runtime is up and crashes the process at load.)
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define TOKENSEL_PHILOX_CLONES __attribute__((target_clones("default", "arch=x86-64-v4")))
#else
#define TOKENSEL_PHILOX_CLONES
#endif

// keys[2p], keys[2p+1] for the kBlockPairs pairs starting at `first_pair`.
TOKENSEL_PHILOX_CLONES void PhiloxBlock(Philox4x32Key key, uint32_t l, uint32_t b, uint32_t step,
                                        uint32_t first_pair, uint64_t* __restrict keys) {
  uint32_t c0[kBlockPairs], c1[kBlockPairs], c2[kBlockPairs], c3[kBlockPairs];
  for (int i = 0; i < kBlockPairs; ++i) {
    c0[i] = first_pair + static_cast<uint32_t>(i);
    c1[i] = b;
    c2[i] = l;
    c3[i] = step;
  }
  uint32_t k0 = key.v[0], k1 = key.v[1];
  for (int round = 0; round < kPhiloxRounds; ++round) {
    // Same arithmetic as PhiloxRound (kernels/philox.h), lane-parallel.
    for (int i = 0; i < kBlockPairs; ++i) {
      const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0[i];
      const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2[i];
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[i] ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[i] ^ k1;
      c0[i] = n0;
      c1[i] = static_cast<uint32_t>(p1);
      c2[i] = n2;
      c3[i] = static_cast<uint32_t>(p0);
    }
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  for (int i = 0; i < kBlockPairs; ++i) {
    keys[2 * i] = (static_cast<uint64_t>(c0[i]) << 32) | c1[i];
    keys[2 * i + 1] = (static_cast<uint64_t>(c2[i]) << 32) | c3[i];
  }
}

void WriteIds(const TensorView& ids, int64_t row, const int32_t* picked, int64_t R) {
  char* out = ids.At(RowOffset(ids, row));
  const int64_t stride = ids.strides[2] * ids.elem_size();  // bytes
  if (ids.dtype == DType::kInt32 && stride == sizeof(int32_t)) {
    std::memcpy(out, picked, static_cast<size_t>(R) * sizeof(int32_t));
  } else if (ids.dtype == DType::kInt32) {
    for (int64_t i = 0; i < R; ++i) std::memcpy(out + i * stride, &picked[i], sizeof(int32_t));
  } else {
    for (int64_t i = 0; i < R; ++i) {
      const int64_t v = picked[i];
      std::memcpy(out + i * stride, &v, sizeof(int64_t));
    }
  }
}

}  // namespace

void ComputeRowKeys(Philox4x32Key key, uint32_t l, uint32_t b, uint32_t step, int64_t begin,
                    int64_t count, uint64_t* keys) {
  const int64_t first_pair = begin / 2;
  const int64_t full_pairs = count / 2;  // an odd count leaves one even position
  int64_t p = 0;
  for (; p + kBlockPairs <= full_pairs; p += kBlockPairs) {
    PhiloxBlock(key, l, b, step, static_cast<uint32_t>(first_pair + p), keys + 2 * p);
  }
  for (int64_t i = 2 * p; i < count; i += 2) {
    const int64_t s = begin + i;
    const Philox4x32Counter out = Philox4x32_10(SampleCounter(s >> 1, l, b, step), key);
    keys[i] = SampleKeyHalf(out, 0);
    if (i + 1 < count) keys[i + 1] = SampleKeyHalf(out, 1);
  }
}

uint64_t SampleRowScratchBytes(int64_t S) {
  if (S <= 0) return 0;
  const int64_t keys = S > kChunkedSelectMinS ? kSelectChunk : S;
  return SatAdd(SatMul3(keys, sizeof(uint64_t), 1), SelectScratchBytes(S));
}

bool SampleRow(Philox4x32Key key, uint32_t l, uint32_t b, uint32_t step, int64_t S, int64_t R,
               SampleRowScratch& scratch, int32_t* picked, char* inv, int64_t inv_stride) {
  if (R == 0 || R == S) {  // no keys needed
    SelectRow(nullptr, S, R, scratch.select, picked, inv, inv_stride);
    return true;
  }
  if (S > kChunkedSelectMinS) {
    auto keys_of = [&](int64_t first, int64_t count, uint64_t* out) {
      ComputeRowKeys(key, l, b, step, first, count, out);
    };
    // A row can take seconds: it checks the stop token every chunk.
    return SelectRowChunked(keys_of, S, R, kSelectChunk, scratch.select, scratch.chunk_keys, picked,
                            inv, inv_stride);
  }
  if (scratch.keys_capacity < S) {
    scratch.keys.reset();                 // the old block goes first: the peak is S keys
    scratch.keys.reset(new uint64_t[S]);  // uninitialized: every slot is computed
    scratch.keys_capacity = S;
  }
  ComputeRowKeys(key, l, b, step, 0, S, scratch.keys.get());
  SelectRow(scratch.keys.get(), S, R, scratch.select, picked, inv, inv_stride);
  return true;
}

absl::Status SampleTokens(const SampleTokensArgs& args, ThreadPool* pool) {
  RETURN_IF_ERROR(ValidateSampleTokens(args));
  // No data to validate: every input is metadata, so writing starts here.
  const int64_t L = args.layers, B = args.batch, S = args.original_tokens;
  const int64_t R = args.retained_tokens;
  const int64_t rows = L * B;
  const bool has_inverse = args.inverse.has_value();
  const TensorView inverse = has_inverse ? *args.inverse : TensorView{};
  const int64_t grain = std::max<int64_t>(1, kGrainPositions / std::max<int64_t>(S, 1));
  const int64_t inv_stride = has_inverse ? inverse.strides[2] * int64_t{sizeof(int32_t)} : 0;
  const Philox4x32Key key = SampleKey(args.seed);
  const auto step = static_cast<uint32_t>(args.step);
  ParallelFor(pool, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> picked(static_cast<size_t>(R) + 1);
    SampleRowScratch scratch;
    for (int64_t row = begin; row < end; ++row) {
      const auto l = static_cast<uint32_t>(row / B), b = static_cast<uint32_t>(row % B);
      char* inv = has_inverse ? inverse.At(RowOffset(inverse, row)) : nullptr;
      if (!SampleRow(key, l, b, step, S, R, scratch, picked.data(), inv, inv_stride)) return;
      WriteIds(args.ids, row, picked.data(), R);
    }
  });
  RETURN_IF_ERROR(CheckStop());
  // The mask ops read the ids back from the client's tensor, which the client
  // may have rewritten meanwhile: GatherBertMask snapshots and checks them
  // like any client indices (an INVALID_ARGUMENT then); SliceGptMask reads no
  // ids.
  if (args.bert_mask) {
    RETURN_IF_ERROR(
        GatherBertMask(GatherBertMaskArgs{*args.mask, args.ids, *args.bert_mask}, pool));
  }
  if (args.gpt_mask) {
    RETURN_IF_ERROR(SliceGptMask(SliceGptMaskArgs{*args.mask, *args.gpt_mask}, pool));
  }
  return absl::OkStatus();
}

uint64_t ScratchBytes(const SampleTokensArgs& args, int threads) {
  if (!ValidateSampleTokens(args).ok()) return kStatusScratchBytes;
  const int64_t S = args.original_tokens, R = args.retained_tokens;
  const int64_t rows = args.layers * args.batch;
  uint64_t per_chunk = SatMul3(R + 1, sizeof(int32_t), 1);  // picked
  if (R != 0 && R != S) per_chunk = SatAdd(per_chunk, SampleRowScratchBytes(S));
  uint64_t bytes = SatMul(LiveChunks(threads, rows), per_chunk);
  if (args.bert_mask) {  // runs after the rows' scratch is freed
    bytes = std::max(
        bytes, ScratchBytes(GatherBertMaskArgs{*args.mask, args.ids, *args.bert_mask}, threads));
  }
  return SatAdd(bytes, kStatusScratchBytes);
}

}  // namespace tokensel::kernels::cpu
