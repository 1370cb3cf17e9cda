#include "tokensel/client/tensor_ref.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tokensel::client {

int64_t DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_BOOL:
    case v1::DTYPE_INT8:
    case v1::DTYPE_UINT8:
    case v1::DTYPE_FLOAT8_E4M3FN:
    case v1::DTYPE_FLOAT8_E5M2:
      return 1;
    case v1::DTYPE_FLOAT16:
    case v1::DTYPE_BFLOAT16:
    case v1::DTYPE_INT16:
      return 2;
    case v1::DTYPE_FLOAT32:
    case v1::DTYPE_INT32:
      return 4;
    case v1::DTYPE_FLOAT64:
    case v1::DTYPE_INT64:
      return 8;
    default:
      return 0;
  }
}

TensorRef TensorRef::InBuffer(std::string buffer, uint64_t byte_offset) {
  TensorRef ref;
  ref.kind_ = Kind::kBuffer;
  ref.buffer_ = std::move(buffer);
  ref.byte_offset_ = byte_offset;
  return ref;
}

TensorRef TensorRef::Inline(std::string bytes) {
  TensorRef ref;
  ref.kind_ = Kind::kInline;
  ref.bytes_ = std::move(bytes);
  return ref;
}

TensorRef TensorRef::InlineOutput() { return TensorRef(); }

TensorRef& TensorRef::Dtype(v1::DType dtype) & {
  dtype_ = dtype;
  return *this;
}
TensorRef&& TensorRef::Dtype(v1::DType dtype) && { return std::move(Dtype(dtype)); }
TensorRef& TensorRef::Shape(std::vector<int64_t> shape) & {
  shape_ = std::move(shape);
  return *this;
}
TensorRef&& TensorRef::Shape(std::vector<int64_t> shape) && {
  return std::move(Shape(std::move(shape)));
}
TensorRef& TensorRef::Strides(std::vector<int64_t> strides) & {
  strides_ = std::move(strides);
  return *this;
}
TensorRef&& TensorRef::Strides(std::vector<int64_t> strides) && {
  return std::move(Strides(std::move(strides)));
}

namespace {

// product(shape) * element size, or an error for negative dims / overflow.
absl::StatusOr<uint64_t> ByteLength(const std::vector<int64_t>& shape, int64_t element_size) {
  uint64_t bytes = static_cast<uint64_t>(element_size);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("shape[", i, "] = ", shape[i], " < 0"));
    }
    const uint64_t dim = static_cast<uint64_t>(shape[i]);
    if (dim != 0 && bytes > std::numeric_limits<uint64_t>::max() / dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape [", absl::StrJoin(shape, ","), "] overflows 64 bits"));
    }
    bytes *= dim;
  }
  return bytes;
}

}  // namespace

absl::Status TensorRef::Validate() const {
  if (kind_ == Kind::kInlineOutput) return absl::OkStatus();
  const int64_t element_size = DTypeSize(dtype_);
  if (element_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", v1::DType_Name(dtype_), " is not a tensor element type"));
  }
  absl::StatusOr<uint64_t> bytes = ByteLength(shape_, element_size);
  if (!bytes.ok()) return bytes.status();
  if (kind_ == Kind::kInline) {
    if (!strides_.empty()) {
      return absl::InvalidArgumentError("strides: inline data is row-major, strides must be empty");
    }
    if (bytes_.size() != *bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "inline data has ", bytes_.size(), " bytes, shape [", absl::StrJoin(shape_, ","), "] of ",
          v1::DType_Name(dtype_), " needs ", *bytes));
    }
    return absl::OkStatus();
  }
  if (buffer_.empty()) return absl::InvalidArgumentError("buffer name is empty");
  if (!strides_.empty() && strides_.size() != shape_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("strides has ", strides_.size(), " entries, shape has ", shape_.size()));
  }
  for (size_t i = 0; i < strides_.size(); ++i) {
    if (strides_[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("strides[", i, "] = ", strides_[i], " < 0"));
    }
  }
  return absl::OkStatus();
}

void TensorRef::FillProto(v1::Tensor* tensor) const {
  tensor->Clear();
  if (kind_ == Kind::kInlineOutput && dtype_ == v1::DTYPE_UNSPECIFIED && shape_.empty()) return;
  tensor->set_dtype(dtype_);
  for (int64_t d : shape_) tensor->add_shape(d);
  for (int64_t s : strides_) tensor->add_strides(s);
  if (kind_ == Kind::kBuffer) {
    tensor->mutable_buffer()->set_buffer(buffer_);
    tensor->mutable_buffer()->set_byte_offset(byte_offset_);
  } else if (kind_ == Kind::kInline) {
    tensor->set_inline_data(bytes_);
  }
}

v1::Tensor TensorRef::ToProto() const {
  v1::Tensor tensor;
  FillProto(&tensor);
  return tensor;
}

absl::StatusOr<const v1::Tensor*> FindOutput(const v1::OpResponse& response,
                                             absl::string_view name) {
  std::vector<std::string> names;
  for (const v1::NamedTensor& output : response.outputs()) {
    if (output.name() == name) return &output.tensor();
    names.push_back(output.name());
  }
  return absl::NotFoundError(absl::StrCat("no inline output \"", name, "\" (outputs: [",
                                          absl::StrJoin(names, ", "), "])"));
}

absl::Status CheckInline(const v1::Tensor& tensor, v1::DType dtype) {
  if (tensor.dtype() != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor dtype is ", v1::DType_Name(tensor.dtype()), ", expected ", v1::DType_Name(dtype)));
  }
  if (tensor.data_case() != v1::Tensor::kInlineData) {
    return absl::InvalidArgumentError("tensor has no inline data");
  }
  const std::vector<int64_t> shape(tensor.shape().begin(), tensor.shape().end());
  absl::StatusOr<uint64_t> bytes = ByteLength(shape, DTypeSize(dtype));
  if (!bytes.ok()) return bytes.status();
  if (tensor.inline_data().size() != *bytes) {
    return absl::InvalidArgumentError(absl::StrCat("inline data has ", tensor.inline_data().size(),
                                                   " bytes, shape [", absl::StrJoin(shape, ","),
                                                   "] needs ", *bytes));
  }
  return absl::OkStatus();
}

}  // namespace tokensel::client
