// GatherBertMask and SliceGptMask on the CPU. Output rows (the last dim) run
// in parallel; element copies dispatch on the element size only.
//
// GatherBertMask reads its indices once, into a snapshot that is validated
// and then used for every key column and query row (index_check.h).
// SliceGptMask reads no data that decides an address: every offset comes
// from the validated shapes and strides.
#include <cstring>
#include <vector>

#include "common/status_macros.h"
#include "kernels/cpu/copy_rows.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/index_check.h"
#include "kernels/cpu/scratch.h"
#include "kernels/gather_math.h"

namespace tokensel::kernels::cpu {
namespace {

// dst[j * dst_stride] = src[key_offsets[j]] for j < n (strides/offsets in bytes).
template <int kElemSize>
void GatherElements(char* dst, int64_t dst_stride, const char* src, const int64_t* key_offsets,
                    int64_t n) {
  if (dst_stride == kElemSize) {
    // Unrolled: the loop is load/store bound (an offset, an element, a
    // store), and the branch and counter cost a third of it otherwise
    // (A/B: GatherBertMask 0.22x -> 0.30x of memcpy, docs/development.md).
#pragma GCC unroll 8
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(dst + j * kElemSize, src + key_offsets[j], kElemSize);
    }
  } else {
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(dst + j * dst_stride, src + key_offsets[j], kElemSize);
    }
  }
}

// `idx` is the private row-major snapshot of args.indices ([L,B,R]).
template <int kElemSize>
void GatherBertMaskRows(const GatherBertMaskArgs& args, const TensorView& idx, ThreadPool* pool) {
  const TensorView& mask = args.mask;
  const TensorView& out = args.out;
  const int64_t retained = out.shape[4];
  const int64_t rows = out.shape[0] * out.shape[1] * out.shape[2] * out.shape[3];
  const int64_t key_stride = mask.strides[3] * kElemSize;
  const int64_t out_stride = out.strides[4] * kElemSize;
  ParallelFor(pool, rows, RowGrain(retained * kElemSize), [&](int64_t begin, int64_t end) {
    // Byte offsets of the R key columns of the current index row; consecutive
    // output rows share an index row (H * R of them), so they are reused.
    std::vector<int64_t> key_offsets(static_cast<size_t>(retained));
    int64_t cached_index_row = -1;
    for (int64_t row = begin; row < end; ++row) {
      const BertMaskRow m = BertMaskRowOf(out, row);
      const int64_t index_row = BertMaskIndexRow(idx, m);
      if (index_row != cached_index_row) {
        for (int64_t j = 0; j < retained; ++j) {
          key_offsets[j] = LoadIndex(idx, index_row * retained + j) * key_stride;
        }
        cached_index_row = index_row;
      }
      const int64_t query = LoadIndex(idx, index_row * retained + m.i);
      GatherElements<kElemSize>(out.At(BertMaskOutOffset(out, m)), out_stride,
                                mask.At(BertMaskSourceRowOffset(mask, m.b, m.h, query)),
                                key_offsets.data(), retained);
    }
  });
}

}  // namespace

absl::Status GatherBertMask(const GatherBertMaskArgs& args, ThreadPool* pool) {
  RETURN_IF_ERROR(ValidateGatherBertMask(args));
  IndexSnapshot snapshot;
  RETURN_IF_ERROR(
      SnapshotIndexRows(args.indices, args.mask.shape[3], /*unique=*/false, pool, &snapshot));
  if (args.out.NumElements() == 0) return absl::OkStatus();
  const TensorView& idx = snapshot.view();
  switch (args.mask.elem_size()) {
    case 1:
      GatherBertMaskRows<1>(args, idx, pool);
      break;
    case 2:
      GatherBertMaskRows<2>(args, idx, pool);
      break;
    case 4:
      GatherBertMaskRows<4>(args, idx, pool);
      break;
    default:
      GatherBertMaskRows<8>(args, idx, pool);
      break;
  }
  return CheckStop();
}

uint64_t ScratchBytes(const GatherBertMaskArgs& args, int threads) {
  if (!ValidateGatherBertMask(args).ok()) return kStatusScratchBytes;
  const TensorView& out = args.out;
  uint64_t bytes = SnapshotIndexRowsScratchBytes(args.indices, args.mask.shape[3],
                                                 /*unique=*/false, threads);
  if (out.NumElements() > 0) {  // the key offsets of one index row per live chunk
    const int64_t rows = out.shape[0] * out.shape[1] * out.shape[2] * out.shape[3];
    bytes = SatAdd(bytes, SatMul(LiveChunks(threads, rows), SatMul3(out.shape[4], 8, 1)));
  }
  return SatAdd(bytes, kStatusScratchBytes);
}

absl::Status SliceGptMask(const SliceGptMaskArgs& args, ThreadPool* pool) {
  RETURN_IF_ERROR(ValidateSliceGptMask(args));
  const TensorView& mask = args.mask;
  const TensorView& out = args.out;
  if (out.NumElements() == 0) return absl::OkStatus();
  const int64_t retained = out.shape[3];
  const int64_t rows = out.shape[0] * out.shape[1] * out.shape[2];
  const int64_t elem = mask.elem_size();
  DispatchRowCopy(elem, retained, out.strides[3], mask.strides[3], rows, [&](const auto& copy) {
    ParallelFor(pool, rows, RowGrain(retained * elem), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const GptMaskRowOffsets o = GptMaskRowOffsetsOf(mask, out, row);
        copy(out.At(o.out), mask.At(o.mask));
      }
      copy.Finish();
    });
  });
  return CheckStop();
}

uint64_t ScratchBytes(const SliceGptMaskArgs& /*args*/, int /*threads*/) {
  return kStatusScratchBytes;  // allocates nothing but a failing call's status
}

}  // namespace tokensel::kernels::cpu
