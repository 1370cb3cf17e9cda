// Metadata validation of SortTokens (ops.h) and its data-error messages
// (validate_sort.h).
#include "kernels/validate_sort.h"

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/ops.h"
#include "kernels/validate.h"

namespace tokensel::kernels {
namespace {

constexpr int64_t kMaxOriginalTokens = std::numeric_limits<int32_t>::max();

// `v` has the leading (row) dims of `ids`.
absl::Status CheckRowDims(const TensorView& v, absl::string_view field, const TensorView& ids) {
  for (int d = 0; d + 1 < ids.rank; ++d) {
    RETURN_IF_ERROR(CheckDim(v, field, d, "row", ids.shape[d], absl::StrCat("ids dim ", d)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSortTokens(const SortTokensArgs& args) {
  const TensorView& ids = args.ids;
  RETURN_IF_ERROR(CheckView(ids, "ids"));
  RETURN_IF_ERROR(CheckIndexDType(ids, "ids"));
  const int64_t s = args.original_tokens;
  if (s < 1 || s > kMaxOriginalTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("original_tokens: S = ", s, " is outside [1, ", kMaxOriginalTokens, "]"));
  }
  const int64_t r = ids.shape[ids.rank - 1];
  if (r < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ids: R must be >= 1 (shape ", ids.ShapeString(), ")"));
  }
  if (r > s) {
    return absl::InvalidArgumentError(
        absl::StrCat("ids: R = ", r, " exceeds original_tokens S = ", s, " (R must be <= S)"));
  }
  // The sorted ids go to `out`, or back to `ids` when `out` is absent or is
  // exactly the ids view; any other overlap with ids is an error.
  const bool in_place = !args.out.has_value() || SameView(*args.out, ids);
  if (in_place) {
    RETURN_IF_ERROR(CheckNonOverlapping(ids, "ids"));
  } else {
    const TensorView& out = *args.out;
    RETURN_IF_ERROR(CheckView(out, "out", ids.rank));
    RETURN_IF_ERROR(CheckSameDType(out, "out", ids, "ids"));
    RETURN_IF_ERROR(CheckRowDims(out, "out", ids));
    RETURN_IF_ERROR(CheckDim(out, "out", ids.rank - 1, "R", r, "ids R"));
    RETURN_IF_ERROR(CheckNonOverlapping(out, "out"));
    RETURN_IF_ERROR(CheckDisjoint(out, "out", ids, "ids"));
  }
  if (args.inverse.has_value()) {
    const TensorView& inv = *args.inverse;
    RETURN_IF_ERROR(CheckView(inv, "inverse", ids.rank));
    RETURN_IF_ERROR(CheckDType(inv, "inverse", {DType::kInt32}));
    RETURN_IF_ERROR(CheckRowDims(inv, "inverse", ids));
    RETURN_IF_ERROR(CheckDim(inv, "inverse", ids.rank - 1, "S", s, "original_tokens"));
    RETURN_IF_ERROR(CheckNonOverlapping(inv, "inverse"));
    RETURN_IF_ERROR(CheckDisjoint(inv, "inverse", ids, "ids"));
    if (!in_place) RETURN_IF_ERROR(CheckDisjoint(inv, "inverse", *args.out, "out"));
  }
  return absl::OkStatus();
}

absl::Status SortIdStatus(const TensorView& ids, int64_t original_tokens, const SortIdError& e) {
  const int64_t r = ids.shape[ids.rank - 1];
  const int64_t linear = e.row * r + e.position;
  if (e.first_position < 0) {
    return IndexOutOfRange(ids, "ids", linear, e.value, original_tokens);
  }
  return DuplicateIndex(ids, "ids", linear, e.value, e.row * r + e.first_position);
}

}  // namespace tokensel::kernels
