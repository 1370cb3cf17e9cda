// GatherBertMask and SliceGptMask on the CPU. Output rows (the last dim) run
// in parallel; element copies dispatch on the element size only.
#include <cstring>
#include <vector>

#include "common/status_macros.h"
#include "kernels/cpu/copy_rows.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/gather_math.h"

namespace tokensel::kernels::cpu {
namespace {

// dst[j * dst_stride] = src[key_offsets[j]] for j < n (strides/offsets in bytes).
template <int kElemSize>
void GatherElements(char* dst, int64_t dst_stride, const char* src, const int64_t* key_offsets,
                    int64_t n) {
  if (dst_stride == kElemSize) {
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(dst + j * kElemSize, src + key_offsets[j], kElemSize);
    }
  } else {
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(dst + j * dst_stride, src + key_offsets[j], kElemSize);
    }
  }
}

template <int kElemSize>
void GatherBertMaskRows(const GatherBertMaskArgs& args, ThreadPool* pool) {
  const TensorView& mask = args.mask;
  const TensorView& idx = args.indices;
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
          key_offsets[j] = LoadIndex(idx, IndexOffset(idx, index_row, j)) * key_stride;
        }
        cached_index_row = index_row;
      }
      const int64_t query = LoadIndex(idx, IndexOffset(idx, index_row, m.i));
      GatherElements<kElemSize>(out.At(BertMaskOutOffset(out, m)), out_stride,
                                mask.At(BertMaskSourceRowOffset(mask, m.b, m.h, query)),
                                key_offsets.data(), retained);
    }
  });
}

}  // namespace

absl::Status GatherBertMask(const GatherBertMaskArgs& args, ThreadPool* pool) {
  RETURN_IF_ERROR(ValidateGatherBertMask(args));
  RETURN_IF_ERROR(CheckIndexRows(args.indices, args.mask.shape[3], /*unique=*/false, pool));
  if (args.out.NumElements() == 0) return absl::OkStatus();
  switch (args.mask.elem_size()) {
    case 1:
      GatherBertMaskRows<1>(args, pool);
      break;
    case 2:
      GatherBertMaskRows<2>(args, pool);
      break;
    case 4:
      GatherBertMaskRows<4>(args, pool);
      break;
    default:
      GatherBertMaskRows<8>(args, pool);
      break;
  }
  return absl::OkStatus();
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
  return absl::OkStatus();
}

}  // namespace tokensel::kernels::cpu
