// TensorRef: builds the v1::Tensor of a request, by reference into a
// registered buffer or inline, and reads inline outputs back.
//
//   v1::GatherTokensRequest req;
//   *req.mutable_activations() =
//       TensorRef::InBuffer("acts", 0).Dtype(v1::DTYPE_FLOAT32).Shape({B, S, C}).ToProto();
//   *req.mutable_indices() = TensorRef::InlineValues<int32_t>(ids, {B, R}).ToProto();
//   *req.mutable_out() = TensorRef::InlineOutput().ToProto();
//   ASSIGN_OR_RETURN(v1::OpResponse resp, client.GatherTokens(req));
//   ASSIGN_OR_RETURN(std::vector<float> out, OutputValues<float>(resp, "out"));
//
// Strides are in elements (empty = row-major). Inline data is row-major
// little-endian; ToProto() does not validate shapes (the server does, with a
// message naming the field), Validate() checks what is local.
#ifndef TOKENSEL_CLIENT_TENSOR_REF_H_
#define TOKENSEL_CLIENT_TENSOR_REF_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tokensel/v1/tokensel.pb.h"

namespace tokensel::client {

namespace v1 = ::tokensel::v1;

// Bytes per element; 0 for DTYPE_UNSPECIFIED or an unknown value.
int64_t DTypeSize(v1::DType dtype);

// The v1::DType of a C++ element type (bool, int8/uint8/int16/int32/int64,
// float, double). Half types have no C++ twin: use TensorRef::Inline.
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<bool> {
  static constexpr v1::DType kValue = v1::DTYPE_BOOL;
};
template <>
struct DTypeOf<int8_t> {
  static constexpr v1::DType kValue = v1::DTYPE_INT8;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr v1::DType kValue = v1::DTYPE_UINT8;
};
template <>
struct DTypeOf<int16_t> {
  static constexpr v1::DType kValue = v1::DTYPE_INT16;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr v1::DType kValue = v1::DTYPE_INT32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr v1::DType kValue = v1::DTYPE_INT64;
};
template <>
struct DTypeOf<float> {
  static constexpr v1::DType kValue = v1::DTYPE_FLOAT32;
};
template <>
struct DTypeOf<double> {
  static constexpr v1::DType kValue = v1::DTYPE_FLOAT64;
};

class TensorRef {
 public:
  // By reference: element [0,...,0] at `byte_offset` in registered buffer
  // `buffer`. Set Dtype and Shape (required for inputs and outputs).
  static TensorRef InBuffer(std::string buffer, uint64_t byte_offset = 0);
  // Inline row-major bytes; set Dtype and Shape.
  static TensorRef Inline(std::string bytes);
  // Inline values of a C++ type; dtype is set from T.
  template <typename T>
  static TensorRef InlineValues(absl::Span<const T> values, std::vector<int64_t> shape) {
    std::string bytes(values.size() * sizeof(T), '\0');
    if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
    return Inline(std::move(bytes)).Dtype(DTypeOf<T>::kValue).Shape(std::move(shape));
  }
  // An output asking for its result inline in the response (no data).
  static TensorRef InlineOutput();

  TensorRef& Dtype(v1::DType dtype) &;
  TensorRef&& Dtype(v1::DType dtype) &&;
  TensorRef& Shape(std::vector<int64_t> shape) &;
  TensorRef&& Shape(std::vector<int64_t> shape) &&;
  // Element strides, one per dim; by-reference tensors only.
  TensorRef& Strides(std::vector<int64_t> strides) &;
  TensorRef&& Strides(std::vector<int64_t> strides) &&;

  // Local checks: dtype set and known (unless an inline output), no negative
  // dims, strides match the rank and are >= 0 and only by reference, inline
  // length = product(shape) * element size. INVALID_ARGUMENT naming the part.
  absl::Status Validate() const;

  v1::Tensor ToProto() const;
  void FillProto(v1::Tensor* tensor) const;

 private:
  enum class Kind { kBuffer, kInline, kInlineOutput };
  TensorRef() = default;

  Kind kind_ = Kind::kInlineOutput;
  std::string buffer_;
  uint64_t byte_offset_ = 0;
  std::string bytes_;
  v1::DType dtype_ = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape_;
  std::vector<int64_t> strides_;
};

// The inline output `name` of `response` (NOT_FOUND listing the names present).
absl::StatusOr<const v1::Tensor*> FindOutput(const v1::OpResponse& response,
                                             absl::string_view name);

// The elements of an inline tensor as T (bool tensors: read with CheckInline
// and the bytes). INVALID_ARGUMENT if the dtype is
// not DTypeOf<T> or the data length does not match the shape.
absl::Status CheckInline(const v1::Tensor& tensor, v1::DType dtype);
template <typename T>
absl::StatusOr<std::vector<T>> InlineValuesOf(const v1::Tensor& tensor) {
  static_assert(!std::is_same_v<T, bool>, "read DTYPE_BOOL outputs as uint8_t");
  absl::Status status = CheckInline(tensor, DTypeOf<T>::kValue);
  if (!status.ok()) return status;
  std::vector<T> values(tensor.inline_data().size() / sizeof(T));
  if (!values.empty()) {
    std::memcpy(values.data(), tensor.inline_data().data(), values.size() * sizeof(T));
  }
  return values;
}
// FindOutput + InlineValuesOf.
template <typename T>
absl::StatusOr<std::vector<T>> OutputValues(const v1::OpResponse& response,
                                            absl::string_view name) {
  absl::StatusOr<const v1::Tensor*> tensor = FindOutput(response, name);
  if (!tensor.ok()) return tensor.status();
  return InlineValuesOf<T>(**tensor);
}

}  // namespace tokensel::client

#endif  // TOKENSEL_CLIENT_TENSOR_REF_H_
