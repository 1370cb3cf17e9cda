// Element types. Every data op of tokensel copies bytes, so for data tensors
// the dtype only fixes the element size (1, 2, 4 or 8 bytes); index and score
// tensors are interpreted (int32/int64 indices, fp32/fp16/bf16 scores).
#ifndef TOKENSEL_KERNELS_DTYPE_H_
#define TOKENSEL_KERNELS_DTYPE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/hd.h"

namespace tokensel::kernels {

enum class DType : uint8_t {
  kBool = 0,
  kInt8,
  kUInt8,
  kFloat8E4M3,
  kFloat8E5M2,
  kFloat16,
  kBFloat16,
  kInt16,
  kFloat32,
  kInt32,
  kFloat64,
  kInt64,
};
inline constexpr int kNumDTypes = 12;

// Size of one element in bytes: 1, 2, 4 or 8.
TOKENSEL_HD constexpr int64_t ElementSize(DType dtype) {
  switch (dtype) {
    case DType::kBool:
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
      return 1;
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt16:
      return 2;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
  }
  return 0;
}

// Lower-case names as numpy/torch spell them ("float16", "bfloat16", "int32",
// "float8_e4m3fn", "float8_e5m2", "bool", ...).
absl::string_view DTypeName(DType dtype);
absl::StatusOr<DType> ParseDType(absl::string_view name);

constexpr bool IsIndexDType(DType d) { return d == DType::kInt32 || d == DType::kInt64; }
constexpr bool IsScoreDType(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16;
}

}  // namespace tokensel::kernels

#endif  // TOKENSEL_KERNELS_DTYPE_H_
