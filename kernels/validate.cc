#include "kernels/validate.h"

#include <array>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tokensel::kernels {
namespace {

bool MulOverflow(int64_t a, int64_t b, int64_t* out) { return __builtin_mul_overflow(a, b, out); }
bool AddOverflow(int64_t a, int64_t b, int64_t* out) { return __builtin_add_overflow(a, b, out); }

}  // namespace

absl::Status CheckView(const TensorView& v, absl::string_view field) {
  if (v.rank < 1 || v.rank > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": rank ", v.rank, " is outside [1, ", kMaxRank, "]"));
  }
  if (ElementSize(v.dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": invalid dtype"));
  }
  int64_t count = 1;
  for (int d = 0; d < v.rank; ++d) {
    if (v.shape[d] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": dim ", d, " is ", v.shape[d], " (negative)"));
    }
    if (v.strides[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": stride ", d, " is ", v.strides[d],
                                                     " (negative strides are not supported)"));
    }
    if (MulOverflow(count, v.shape[d], &count)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": shape ", v.ShapeString(), " has more than 2^63 elements"));
    }
  }
  // The extent first: its message names the shape and the strides.
  auto extent = ComputeExtent(v, field);
  if (!extent.ok()) return extent.status();
  // Kernels form byte strides (stride * element size) for every dim; the
  // extent check bounds them only for dims of size > 1.
  for (int d = 0; d < v.rank; ++d) {
    if (int64_t bytes = 0; MulOverflow(v.strides[d], ElementSize(v.dtype), &bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": stride ", d, " is ", v.strides[d],
                                                     " elements, more than 2^63 bytes"));
    }
  }
  if (count > 0 && v.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": null data for a non-empty tensor"));
  }
  return absl::OkStatus();
}

absl::Status CheckView(const TensorView& v, absl::string_view field, int rank) {
  if (v.rank != rank) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": rank is ", v.rank, " (shape ",
                                                   v.ShapeString(), "), expected ", rank));
  }
  return CheckView(v, field);
}

absl::StatusOr<ByteExtent> ComputeExtent(const TensorView& v, absl::string_view field) {
  int64_t last = 0;  // element offset of the last element
  for (int d = 0; d < v.rank; ++d) {
    if (v.shape[d] == 0) return ByteExtent{};
    int64_t term = 0;
    if (MulOverflow(v.shape[d] - 1, v.strides[d], &term) || AddOverflow(last, term, &last)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": shape ", v.ShapeString(),
                                                     " with strides ", v.StridesString(),
                                                     " spans more than 2^63 elements"));
    }
  }
  int64_t end = 0;
  if (AddOverflow(last, 1, &end) || MulOverflow(end, ElementSize(v.dtype), &end)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": shape ", v.ShapeString(),
                                                   " with strides ", v.StridesString(),
                                                   " spans more than 2^63 bytes"));
  }
  return ByteExtent{0, end};
}

absl::Status CheckDType(const TensorView& v, absl::string_view field,
                        std::initializer_list<DType> allowed) {
  for (DType d : allowed) {
    if (v.dtype == d) return absl::OkStatus();
  }
  std::string names;
  for (DType d : allowed) absl::StrAppend(&names, names.empty() ? "" : "|", DTypeName(d));
  return absl::InvalidArgumentError(absl::StrCat(field, ": dtype ", DTypeName(v.dtype),
                                                 " is not supported (expected ", names, ")"));
}

absl::Status CheckIndexDType(const TensorView& v, absl::string_view field) {
  return CheckDType(v, field, {DType::kInt32, DType::kInt64});
}

absl::Status CheckSameDType(const TensorView& v, absl::string_view field, const TensorView& other,
                            absl::string_view other_field) {
  if (v.dtype == other.dtype) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": dtype ", DTypeName(v.dtype),
                                                 " differs from ", other_field, " dtype ",
                                                 DTypeName(other.dtype)));
}

absl::Status CheckDim(const TensorView& v, absl::string_view field, int axis,
                      absl::string_view dim_name, int64_t expected, absl::string_view source) {
  if (axis < v.rank && v.shape[axis] == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": dim ", axis, " (", dim_name, ") is ",
                                                 axis < v.rank ? v.shape[axis] : -1, ", expected ",
                                                 expected, " (", source, ")"));
}

absl::Status CheckNonOverlapping(const TensorView& v, absl::string_view field) {
  std::array<int, kMaxRank> order{};
  int n = 0;
  for (int d = 0; d < v.rank; ++d) {
    if (v.shape[d] == 0) return absl::OkStatus();  // empty: writes nothing
    if (v.shape[d] > 1) order[n++] = d;
  }
  for (int i = 1; i < n; ++i) {  // insertion sort by stride (n <= kMaxRank)
    for (int j = i; j > 0 && v.strides[order[j]] < v.strides[order[j - 1]]; --j) {
      std::swap(order[j], order[j - 1]);
    }
  }
  int64_t span = 1;  // elements covered by the dims placed so far
  for (int i = 0; i < n; ++i) {
    const int d = order[i];
    if (v.strides[d] < span) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": output strides ", v.StridesString(), " for shape ", v.ShapeString(),
          " make elements overlap (dim ", d, " stride ", v.strides[d], " < ", span, ")"));
    }
    span = v.strides[d] * v.shape[d];  // fits: CheckView bounded the extent
  }
  return absl::OkStatus();
}

absl::Status CheckDisjoint(const TensorView& out, absl::string_view out_field, const TensorView& in,
                           absl::string_view in_field) {
  auto a = ComputeExtent(out, out_field);
  if (!a.ok()) return a.status();
  auto b = ComputeExtent(in, in_field);
  if (!b.ok()) return b.status();
  if (a->end == 0 || b->end == 0) return absl::OkStatus();
  const auto a0 = reinterpret_cast<uintptr_t>(out.data);
  const auto b0 = reinterpret_cast<uintptr_t>(in.data);
  const uintptr_t a1 = a0 + static_cast<uintptr_t>(a->end);
  const uintptr_t b1 = b0 + static_cast<uintptr_t>(b->end);
  if (a0 < b1 && b0 < a1) {
    return absl::InvalidArgumentError(
        absl::StrCat(out_field, ": overlaps ", in_field, " (outputs must not alias inputs)"));
  }
  return absl::OkStatus();
}

absl::Status IndexOutOfRange(const TensorView& v, absl::string_view field, int64_t linear,
                             int64_t value, int64_t limit) {
  return absl::InvalidArgumentError(absl::StrCat(field, FormatIndex(v, linear), " = ", value,
                                                 " is out of range [0, ", limit, ")"));
}

absl::Status DuplicateIndex(const TensorView& v, absl::string_view field, int64_t linear,
                            int64_t value, int64_t first_linear) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, FormatIndex(v, linear), " = ", value, " duplicates ", field,
                   FormatIndex(v, first_linear), " (indices must be unique within a row)"));
}

}  // namespace tokensel::kernels
