// Validation of SamplePackedTokens (ops.h, op 11): the metadata checks, the
// data check of a private copy of cu_seqlens, and T' with the dims that
// depend on it. Shared by the CPU twin and the CUDA twin's error messages.
#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "kernels/ops.h"
#include "kernels/sample_math.h"
#include "kernels/validate.h"

namespace tokensel::kernels {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxWord = static_cast<int64_t>(kSampleMaxCounterWord);

absl::Status CheckInt32(const TensorView& v, absl::string_view field, int rank) {
  RETURN_IF_ERROR(CheckView(v, field, rank));
  return CheckDType(v, field, {DType::kInt32});
}

absl::Status CheckKeepRule(const SamplePackedTokensArgs& a) {
  if (a.keep_den < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep_den: ", a.keep_den, " is out of range, expected >= 1"));
  }
  if (a.keep_num < 0 || a.keep_num > a.keep_den) {
    return absl::InvalidArgumentError(absl::StrCat("keep_num: ", a.keep_num,
                                                   " is out of range [0, ", a.keep_den,
                                                   "] (keep_den: keep at most every token)"));
  }
  if (a.min_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("min_tokens: ", a.min_tokens, " is negative"));
  }
  return absl::OkStatus();
}

absl::Status CheckCounts(const SamplePackedTokensArgs& a) {
  if (a.total_tokens < 0 || a.total_tokens > kInt32Max) {
    return absl::InvalidArgumentError(absl::StrCat("total_tokens: ", a.total_tokens,
                                                   " is out of range [0, 2147483647] (int32 ids)"));
  }
  if (a.layers < 0 || a.layers > kMaxWord) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layers: ", a.layers, " is out of range [0, 4294967295] (a Philox counter word)"));
  }
  if (a.step > kSampleMaxCounterWord) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: ", a.step, " is out of range [0, 2^32) (a Philox counter word)"));
  }
  return CheckKeepRule(a);
}

struct NamedView {
  const TensorView* view = nullptr;
  absl::string_view field;
};

// Outputs are pairwise disjoint and disjoint from both inputs.
absl::Status CheckOverlaps(const SamplePackedTokensArgs& a) {
  NamedView outs[5];
  int n = 0;
  outs[n++] = {&a.cu_seqlens_kept, "cu_seqlens_kept"};
  outs[n++] = {&a.ids, "ids"};
  if (a.positions) outs[n++] = {&*a.positions, "positions"};
  if (a.inverse) outs[n++] = {&*a.inverse, "inverse"};
  if (a.out) outs[n++] = {&*a.out, "out"};
  for (int i = 0; i < n; ++i) {
    RETURN_IF_ERROR(CheckNonOverlapping(*outs[i].view, outs[i].field));
    for (int j = 0; j < i; ++j) {
      RETURN_IF_ERROR(CheckDisjoint(*outs[i].view, outs[i].field, *outs[j].view, outs[j].field));
    }
    RETURN_IF_ERROR(CheckDisjoint(*outs[i].view, outs[i].field, a.cu_seqlens, "cu_seqlens"));
    if (a.activations) {
      RETURN_IF_ERROR(CheckDisjoint(*outs[i].view, outs[i].field, *a.activations, "activations"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSamplePackedScalars(const SamplePackedTokensArgs& a) { return CheckCounts(a); }

absl::Status ValidateSamplePackedTokens(const SamplePackedTokensArgs& a) {
  RETURN_IF_ERROR(CheckCounts(a));
  RETURN_IF_ERROR(CheckInt32(a.cu_seqlens, "cu_seqlens", 1));
  const int64_t n_plus_1 = a.cu_seqlens.shape[0];
  if (n_plus_1 < 1) {
    return absl::InvalidArgumentError(
        "cu_seqlens: dim 0 (N+1) is 0, expected >= 1 (N = 0 is an empty batch: [0])");
  }
  if (n_plus_1 - 1 > kMaxWord + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cu_seqlens: dim 0 (N+1) is ", n_plus_1,
                     ", more than 2^32 sequences (the sequence index is a Philox counter word)"));
  }
  const int64_t L = a.layers, T = a.total_tokens;
  // Tasks (layer, sequence) are counted in int64.
  if (n_plus_1 > 1 && L > std::numeric_limits<int64_t>::max() / (n_plus_1 - 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layers: ", L, " x ", n_plus_1 - 1, " sequences exceeds 2^63 tasks"));
  }
  RETURN_IF_ERROR(CheckInt32(a.cu_seqlens_kept, "cu_seqlens_kept", 1));
  RETURN_IF_ERROR(
      CheckDim(a.cu_seqlens_kept, "cu_seqlens_kept", 0, "N+1", n_plus_1, "cu_seqlens N+1"));
  RETURN_IF_ERROR(CheckInt32(a.ids, "ids", 2));
  RETURN_IF_ERROR(CheckDim(a.ids, "ids", 0, "L", L, "layers"));
  if (a.positions) {
    RETURN_IF_ERROR(CheckInt32(*a.positions, "positions", 2));
    RETURN_IF_ERROR(CheckDim(*a.positions, "positions", 0, "L", L, "layers"));
  }
  if (a.inverse) {
    RETURN_IF_ERROR(CheckInt32(*a.inverse, "inverse", 2));
    RETURN_IF_ERROR(CheckDim(*a.inverse, "inverse", 0, "L", L, "layers"));
    RETURN_IF_ERROR(CheckDim(*a.inverse, "inverse", 1, "T", T, "total_tokens"));
  }
  if (a.activations) {
    RETURN_IF_ERROR(CheckView(*a.activations, "activations", 2));
    RETURN_IF_ERROR(CheckDim(*a.activations, "activations", 0, "T", T, "total_tokens"));
  }
  if (a.out) {
    if (!a.activations) {
      return absl::InvalidArgumentError("out: requires activations [T,C] to gather from");
    }
    if (L != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "out: the fused gather needs layers == 1 (one set of ids), got layers = ", L));
    }
    RETURN_IF_ERROR(CheckView(*a.out, "out", 2));
    RETURN_IF_ERROR(CheckSameDType(*a.out, "out", *a.activations, "activations"));
    RETURN_IF_ERROR(CheckDim(*a.out, "out", 1, "C", a.activations->shape[1], "activations C"));
  }
  return CheckOverlaps(a);
}

absl::Status PackedCuStartError(int64_t cu0) {
  return absl::InvalidArgumentError(
      absl::StrCat("cu_seqlens: cu_seqlens[0] is ", cu0, ", expected 0"));
}

absl::Status PackedCuDecreasingError(int64_t i, int64_t cu_i, int64_t cu_next) {
  return absl::InvalidArgumentError(absl::StrCat("cu_seqlens: decreasing at sequence i = ", i,
                                                 ": cu_seqlens[", i, "] = ", cu_i, " > cu_seqlens[",
                                                 i + 1, "] = ", cu_next));
}

absl::Status PackedCuPastEndError(int64_t i, int64_t cu_next, int64_t total_tokens) {
  return absl::InvalidArgumentError(absl::StrCat("cu_seqlens: sequence i = ", i,
                                                 " ends at cu_seqlens[", i + 1, "] = ", cu_next,
                                                 ", past total_tokens T = ", total_tokens));
}

absl::Status CheckPackedCuSeqlens(const int32_t* cu, int64_t n_plus_1, int64_t total_tokens) {
  if (n_plus_1 < 1) return absl::OkStatus();
  if (cu[0] != 0) return PackedCuStartError(cu[0]);
  for (int64_t i = 0; i + 1 < n_plus_1; ++i) {
    if (cu[i + 1] < cu[i]) return PackedCuDecreasingError(i, cu[i], cu[i + 1]);
  }
  const int64_t last = cu[n_plus_1 - 1];
  if (last > total_tokens) {
    // Report the first sequence that ends past T (cu is non-decreasing).
    int64_t i = 0;
    while (cu[i + 1] <= total_tokens) ++i;
    return PackedCuPastEndError(i, cu[i + 1], total_tokens);
  }
  return absl::OkStatus();
}

int64_t PackedKeptTokens(const int32_t* cu, int64_t n_plus_1, const SamplePackedTokensArgs& a) {
  int64_t kept = 0;
  for (int64_t i = 0; i + 1 < n_plus_1; ++i) {
    kept += PackedKeep(int64_t{cu[i + 1]} - cu[i], a.keep_num, a.keep_den, a.min_tokens);
  }
  return kept;
}

absl::Status CheckPackedKeptDims(const SamplePackedTokensArgs& a, int64_t kept_tokens) {
  constexpr absl::string_view kWhy = "the kept tokens T' = sum of r_i over cu_seqlens";
  RETURN_IF_ERROR(CheckDim(a.ids, "ids", 1, "T'", kept_tokens, kWhy));
  if (a.positions) RETURN_IF_ERROR(CheckDim(*a.positions, "positions", 1, "T'", kept_tokens, kWhy));
  if (a.out) RETURN_IF_ERROR(CheckDim(*a.out, "out", 0, "T'", kept_tokens, kWhy));
  return absl::OkStatus();
}

}  // namespace tokensel::kernels
