#include "kernels/dtype.h"

#include <array>
#include <string>

#include "absl/strings/str_cat.h"

namespace tokensel::kernels {
namespace {

constexpr std::array<absl::string_view, kNumDTypes> kNames = {
    "bool",     "int8",  "uint8",   "float8_e4m3fn", "float8_e5m2", "float16",
    "bfloat16", "int16", "float32", "int32",         "float64",     "int64",
};

}  // namespace

absl::string_view DTypeName(DType dtype) {
  const auto i = static_cast<size_t>(dtype);
  return i < kNames.size() ? kNames[i] : absl::string_view("invalid");
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] == name) return static_cast<DType>(i);
  }
  if (name == "half" || name == "fp16") return DType::kFloat16;
  if (name == "bf16") return DType::kBFloat16;
  if (name == "float" || name == "fp32") return DType::kFloat32;
  if (name == "double" || name == "fp64") return DType::kFloat64;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name, "'"));
}

}  // namespace tokensel::kernels
