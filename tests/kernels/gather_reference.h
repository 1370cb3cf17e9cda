// Naive single-threaded references for GatherTokens, ScatterTokens,
// GatherBertMask and SliceGptMask, written independently of kernels/: plain
// nested loops over multi-indices, one element memcpy at a time. They trust
// their inputs (tests only call them on valid ones).
#ifndef TOKENSEL_TESTS_KERNELS_GATHER_REFERENCE_H_
#define TOKENSEL_TESTS_KERNELS_GATHER_REFERENCE_H_

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <utility>
#include <vector>

#include "kernels/tensor_view.h"
#include "tests/testing/test_tensor.h"

namespace tokensel::testing {

// Byte address of element `idx` (one entry per dim) of `v`.
inline char* RefElem(const kernels::TensorView& v, std::initializer_list<int64_t> idx) {
  int64_t offset = 0;
  int d = 0;
  for (int64_t i : idx) offset += i * v.strides[d++];
  return static_cast<char*>(v.data) + offset * kernels::ElementSize(v.dtype);
}

inline int64_t RefIndex(const kernels::TensorView& v, std::initializer_list<int64_t> idx) {
  const char* p = RefElem(v, idx);
  if (v.dtype == kernels::DType::kInt64) {
    int64_t x;
    std::memcpy(&x, p, 8);
    return x;
  }
  int32_t x;
  std::memcpy(&x, p, 4);
  return x;
}

inline void RefCopyElem(char* dst, const char* src, const kernels::TensorView& v) {
  std::memcpy(dst, src, static_cast<size_t>(kernels::ElementSize(v.dtype)));
}

// out[b,r,c] = act[b,idx[b,r],c] (batch_first) / out[r,b,c] = act[idx[b,r],b,c].
inline void RefGather(const kernels::TensorView& act, const kernels::TensorView& idx,
                      const kernels::TensorView& out, bool batch_first) {
  const int64_t batch = idx.shape[0], retained = idx.shape[1], channels = act.shape[2];
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t r = 0; r < retained; ++r) {
      const int64_t s = RefIndex(idx, {b, r});
      for (int64_t c = 0; c < channels; ++c) {
        if (batch_first) {
          RefCopyElem(RefElem(out, {b, r, c}), RefElem(act, {b, s, c}), act);
        } else {
          RefCopyElem(RefElem(out, {r, b, c}), RefElem(act, {s, b, c}), act);
        }
      }
    }
  }
}

// all[b,idx[b,r],c] = layer[b,r,c] (batch_first) / all[idx[b,r],b,c] = layer[r,b,c].
inline void RefScatter(const kernels::TensorView& all, const kernels::TensorView& layer,
                       const kernels::TensorView& idx, bool batch_first) {
  const int64_t batch = idx.shape[0], retained = idx.shape[1], channels = all.shape[2];
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t r = 0; r < retained; ++r) {
      const int64_t s = RefIndex(idx, {b, r});
      for (int64_t c = 0; c < channels; ++c) {
        if (batch_first) {
          RefCopyElem(RefElem(all, {b, s, c}), RefElem(layer, {b, r, c}), all);
        } else {
          RefCopyElem(RefElem(all, {s, b, c}), RefElem(layer, {r, b, c}), all);
        }
      }
    }
  }
}

// out[l,b,h,i,j] = mask[b,h, Sq==1 ? 0 : idx[l,b,i], idx[l,b,j]].
inline void RefGatherBertMask(const kernels::TensorView& mask, const kernels::TensorView& idx,
                              const kernels::TensorView& out) {
  const int64_t layers = idx.shape[0], batch = idx.shape[1], retained = idx.shape[2];
  const int64_t heads = mask.shape[1];
  for (int64_t l = 0; l < layers; ++l) {
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < retained; ++i) {
          const int64_t q = mask.shape[2] == 1 ? 0 : RefIndex(idx, {l, b, i});
          for (int64_t j = 0; j < retained; ++j) {
            const int64_t k = RefIndex(idx, {l, b, j});
            RefCopyElem(RefElem(out, {l, b, h, i, j}), RefElem(mask, {b, h, q, k}), mask);
          }
        }
      }
    }
  }
}

// out[b,h,i,j] = mask[b,h,i,j] for i, j < R.
inline void RefSliceGptMask(const kernels::TensorView& mask, const kernels::TensorView& out) {
  for (int64_t b = 0; b < out.shape[0]; ++b) {
    for (int64_t h = 0; h < out.shape[1]; ++h) {
      for (int64_t i = 0; i < out.shape[2]; ++i) {
        for (int64_t j = 0; j < out.shape[3]; ++j) {
          RefCopyElem(RefElem(out, {b, h, i, j}), RefElem(mask, {b, h, i, j}), mask);
        }
      }
    }
  }
}

// Exact IEEE half bits of a small integer (|v| < 2048), for spec vectors.
inline uint16_t HalfBitsOfInt(int v) {
  if (v == 0) return 0;
  const uint16_t sign = v < 0 ? 0x8000 : 0;
  uint32_t m = static_cast<uint32_t>(v < 0 ? -v : v);
  int e = 0;
  while ((m >> e) > 1) ++e;                       // m in [2^e, 2^(e+1))
  const uint32_t frac = (m << (10 - e)) & 0x3FF;  // exact for e <= 10
  return static_cast<uint16_t>(sign | ((e + 15) << 10) | frac);
}

// Test views of a randomly filled TestTensor, in the layouts the ops must
// handle. The last dim is the channel (row) dim.
enum class ViewKind {
  kContiguous,
  kPadded,          // stride padding on every dim
  kMisaligned,      // odd base address (and a padded row)
  kChannelStride2,  // last-dim stride 2
  kChannelOffset,   // base[..., 1:n+1] of a wider tensor: misaligned by one element
  kBroadcast0,      // dim 0 has stride 0 (inputs only)
};
inline constexpr ViewKind kAllViewKinds[] = {ViewKind::kContiguous,    ViewKind::kPadded,
                                             ViewKind::kMisaligned,    ViewKind::kChannelStride2,
                                             ViewKind::kChannelOffset, ViewKind::kBroadcast0};

struct HeldView {
  TestTensor tensor;
  kernels::TensorView view;

  // Same layout and bytes in new storage (for the reference to write into).
  HeldView Clone() {
    HeldView c;
    c.tensor = tensor;
    c.view = view;
    c.view.data = static_cast<char*>(c.tensor.data()) +
                  (static_cast<char*>(view.data) - static_cast<char*>(tensor.data()));
    return c;
  }
};

inline HeldView MakeHeld(kernels::DType dtype, std::vector<int64_t> shape, ViewKind kind,
                         std::mt19937_64& rng) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int64_t> base_shape = shape;
  Layout layout;
  if (kind == ViewKind::kPadded) layout.pad.assign(rank, 2);
  if (kind == ViewKind::kMisaligned) {
    layout.pad.assign(rank, 0);
    if (rank >= 2) layout.pad[rank - 2] = 1;
    layout.misalign = kernels::ElementSize(dtype) == 1 ? 3 : 1;
  }
  if (kind == ViewKind::kChannelStride2) base_shape[rank - 1] *= 2;
  if (kind == ViewKind::kChannelOffset) base_shape[rank - 1] += 2;
  if (kind == ViewKind::kBroadcast0 && base_shape[0] > 0) base_shape[0] = 1;
  HeldView h;
  h.tensor = TestTensor(dtype, base_shape, layout);
  h.tensor.FillRandom(rng);
  h.view = h.tensor.view();
  for (int d = 0; d < rank; ++d) h.view.shape[d] = shape[d];
  if (kind == ViewKind::kChannelStride2) h.view.strides[rank - 1] = 2;
  if (kind == ViewKind::kChannelOffset) {
    h.view.data = static_cast<char*>(h.tensor.data()) + kernels::ElementSize(dtype);
  }
  if (kind == ViewKind::kBroadcast0) h.view.strides[0] = 0;
  return h;
}

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_KERNELS_GATHER_REFERENCE_H_
