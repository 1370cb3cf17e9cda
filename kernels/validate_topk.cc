// Metadata validation of TopKTokens (ops.h). TopKTokens has no data errors:
// every score, NaN included, has a rank.
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/ops.h"
#include "kernels/validate.h"

namespace tokensel::kernels {

absl::Status ValidateTopKTokens(const TopKTokensArgs& args) {
  const TensorView& scores = args.scores;
  const TensorView& ids = args.ids;
  RETURN_IF_ERROR(CheckView(scores, "scores"));
  RETURN_IF_ERROR(
      CheckDType(scores, "scores", {DType::kFloat32, DType::kFloat16, DType::kBFloat16}));
  RETURN_IF_ERROR(CheckView(ids, "ids", scores.rank));
  RETURN_IF_ERROR(CheckIndexDType(ids, "ids"));
  const int last = scores.rank - 1;
  const int64_t s = scores.shape[last];
  constexpr int64_t kMaxTokens = std::numeric_limits<int32_t>::max();
  if (s > kMaxTokens) {
    return absl::InvalidArgumentError(absl::StrCat("scores: S = ", s, " exceeds ", kMaxTokens,
                                                   " (shape ", scores.ShapeString(), ")"));
  }
  for (int d = 0; d < last; ++d) {
    RETURN_IF_ERROR(
        CheckDim(ids, "ids", d, "row", scores.shape[d], absl::StrCat("scores dim ", d)));
  }
  const int64_t r = ids.shape[last];
  if (r > s) {
    return absl::InvalidArgumentError(absl::StrCat("ids: R = ", r, " exceeds S = ", s,
                                                   " (scores shape ", scores.ShapeString(),
                                                   "; R must be in [0, S])"));
  }
  RETURN_IF_ERROR(CheckNonOverlapping(ids, "ids"));
  RETURN_IF_ERROR(CheckDisjoint(ids, "ids", scores, "scores"));
  return absl::OkStatus();
}

}  // namespace tokensel::kernels
