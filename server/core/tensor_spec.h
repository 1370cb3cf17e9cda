// The transport-free description of one tensor of a request, and of one
// result returned inline. server/grpc converts tokensel.v1.Tensor into a
// TensorSpec; the Resolver (resolve.h) turns it into a kernels::TensorView.
#ifndef TOKENSEL_SERVER_CORE_TENSOR_SPEC_H_
#define TOKENSEL_SERVER_CORE_TENSOR_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "kernels/dtype.h"

namespace tokensel::core {

// A tensor named in a request (mirror of tokensel.v1.Tensor).
struct TensorSpec {
  enum class Source : uint8_t {
    kNone,    // outputs only: return the result inline
    kBuffer,  // a registered buffer, zero-copy
    kInline,  // bytes carried by the request (row-major)
  };
  Source source = Source::kNone;
  std::optional<kernels::DType> dtype;  // absent = DTYPE_UNSPECIFIED
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements; empty = row-major
  std::string buffer;            // kBuffer
  uint64_t byte_offset = 0;      // kBuffer
  // kInline: points into the transport message, valid for the whole call.
  absl::string_view inline_data;
};

// An output returned inline: row-major bytes.
struct InlineOutput {
  std::string name;  // the request field it answers: "out", "inverse", "q_seqlen", ...
  kernels::DType dtype = kernels::DType::kInt32;
  std::vector<int64_t> shape;
  std::string data;
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_TENSOR_SPEC_H_
