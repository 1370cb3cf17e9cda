// .npy files (NumPy format versions 1.0, 2.0 and 3.0) for the CLI's one-off
// ops: C-order, little-endian arrays of the dtypes tokensel shares with numpy.
//
//   ASSIGN_OR_RETURN(NpyArray ids, ReadNpy("ids.npy"));
//   RETURN_IF_ERROR(WriteNpy("out.npy", result));
//
// Accepted descr strings (numpy has no bfloat16 or fp8, so those cannot be
// read or written):
//   '|b1' bool, '|i1' int8, '|u1' uint8, '<i2' int16, '<f2' float16,
//   '<f4' float32, '<i4' int32, '<f8' float64, '<i8' int64
// ('=' is accepted for '<' since this host is little-endian; '|', '<' and '='
// for the 1-byte types). Big-endian data, Fortran order, structured dtypes,
// pickled objects and a data section whose length is not exactly
// product(shape) * element size are INVALID_ARGUMENT with the reason.
#ifndef TOKENSEL_CLIENT_CLI_NPY_H_
#define TOKENSEL_CLIENT_CLI_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"

namespace tokensel::cli {

struct NpyArray {
  kernels::DType dtype = kernels::DType::kFloat32;
  std::vector<int64_t> shape;  // empty = a scalar (one element)
  std::string data;            // row-major little-endian bytes

  int64_t NumElements() const;
};

// The numpy descr of `dtype` ("<f4", "|b1", ...), or INVALID_ARGUMENT for
// dtypes numpy cannot represent (bfloat16, float8).
absl::StatusOr<std::string> NpyDescr(kernels::DType dtype);

// Parses a whole .npy file held in memory.
absl::StatusOr<NpyArray> ParseNpy(absl::string_view file);
// The .npy bytes of `array` (version 1.0, or 2.0 when the header needs it;
// header padded so the data starts at a multiple of 64 bytes).
absl::StatusOr<std::string> SerializeNpy(const NpyArray& array);

// File wrappers; errors name the path (NOT_FOUND when it does not exist).
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);
absl::Status WriteNpy(const std::string& path, const NpyArray& array);

}  // namespace tokensel::cli

#endif  // TOKENSEL_CLIENT_CLI_NPY_H_
