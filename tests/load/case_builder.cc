#include "tests/load/case_builder.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace tokensel::load {

void RandomBytes(uint8_t* data, uint64_t size, std::mt19937_64& rng) {
  uint64_t i = 0;
  for (; i + 8 <= size; i += 8) {
    const uint64_t word = rng();
    std::memcpy(data + i, &word, 8);
  }
  if (i < size) {
    const uint64_t word = rng();
    std::memcpy(data + i, &word, size - i);
  }
}

CaseBuilder::CaseBuilder(CaseMemory memory, std::mt19937_64* rng)
    : memory_(std::move(memory)), rng_(rng) {}

Home CaseBuilder::RandomHome(double p_shm) {
  return std::uniform_real_distribution<double>(0, 1)(*rng_) < p_shm ? Home::kShm : Home::kLocal;
}

Slot CaseBuilder::Place(Home home, DType dtype, std::vector<int64_t> shape, bool strided) {
  const int64_t esize = kernels::ElementSize(dtype);
  const int rank = static_cast<int>(shape.size());
  // Row-major strides with `pad` extra elements per dim (dim 0's padding
  // would not change the layout, so it gets none).
  auto layout = [&](const std::vector<int64_t>& pad, std::vector<int64_t>* strides) {
    strides->assign(rank, 1);
    int64_t stride = 1;
    int64_t last = 0;
    for (int d = rank - 1; d >= 0; --d) {
      (*strides)[d] = stride;
      last += (shape[d] - 1) * stride;
      stride *= shape[d] + pad[d];
    }
    return static_cast<uint64_t>((last + 1) * esize);
  };
  std::vector<int64_t> pad(rank, 0);
  uint64_t misalign = 0;
  if (strided) {
    for (int d = 1; d < rank; ++d) pad[d] = (*rng_)() % 4 == 0 ? 1 + (*rng_)() % 3 : 0;
    misalign = (*rng_)() % 2 == 0 ? (*rng_)() % 8 : 0;
  }
  Slot slot;
  slot.home = home;
  slot.placed.dtype = dtype;
  uint64_t extent = layout(pad, &slot.placed.strides);
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  const uint64_t packed = static_cast<uint64_t>(std::max<int64_t>(1, elements) * esize);
  if (extent > 2 * packed) {  // padding of tiny dims: keep the budget predictable
    std::fill(pad.begin(), pad.end(), 0);
    extent = layout(pad, &slot.placed.strides);
  }
  slot.placed.shape = std::move(shape);
  slot.placed.extent_bytes = extent;
  uint64_t& next = next_[home == Home::kShm ? 0 : 1];
  slot.placed.offset = ((next + 63) & ~uint64_t{63}) + misalign;
  next = slot.placed.offset + extent;
  if (next > memory_.size) {
    std::fprintf(stderr, "CaseBuilder: %llu bytes needed, the area has %llu (size budget bug)\n",
                 static_cast<unsigned long long>(next),
                 static_cast<unsigned long long>(memory_.size));
    std::abort();
  }
  return slot;
}

kernels::TensorView CaseBuilder::View(const Slot& slot) const {
  return slot.placed.View(Base(slot.home));
}

void CaseBuilder::Commit(const Slot& slot) {
  if (slot.home != Home::kShm) return;
  std::memcpy(memory_.shm + slot.placed.offset, memory_.mirror + slot.placed.offset,
              slot.placed.extent_bytes);
}

void CaseBuilder::FillBytes(const Slot& slot) {
  RandomBytes(Base(slot.home) + slot.placed.offset, slot.placed.extent_bytes, *rng_);
  Commit(slot);
}

void CaseBuilder::FillIndices(const Slot& slot, int64_t range, bool unique) {
  itest::FillIndices(View(slot), range, unique, *rng_);
  Commit(slot);
}

void CaseBuilder::FillSegments(const Slot& slot, int64_t max_segments) {
  itest::FillSegments(View(slot), max_segments, *rng_);
  Commit(slot);
}

v1::Tensor CaseBuilder::Input(const Slot& slot) {
  if (slot.home == Home::kShm) return slot.placed.Ref(memory_.buffer);
  ++inline_tensors_;
  return itest::InlineTensor(slot.placed.dtype, slot.placed.shape,
                             slot.placed.PackedBytes(memory_.local));
}

v1::Tensor CaseBuilder::Output(const Slot& slot, const std::string& name) {
  if (slot.home == Home::kShm) return slot.placed.Ref(memory_.buffer);
  ExpectInline(slot, name);
  return itest::InlineOutput();
}

void CaseBuilder::ExpectInline(const Slot& slot, const std::string& name) {
  ++inline_tensors_;
  expected_.push_back({op_index_, name, slot});
}

uint64_t CaseBuilder::remaining() const { return memory_.size - std::max(next_[0], next_[1]); }

}  // namespace tokensel::load
