// ValidateSampleTokens: metadata checks for SampleTokens (ops.h, op 7). The op
// reads no index data, so after this passes nothing can fail: every error of
// the op (including those of the mask ops it calls) is reported here.
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

absl::Status CheckCount(int64_t value, absl::string_view field, int64_t max,
                        absl::string_view why) {
  if (value >= 0 && value <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", value, " is out of range [0, ", max, "] (", why, ")"));
}

// Every output is disjoint from every other output and from the mask input.
struct NamedView {
  const TensorView* view;
  absl::string_view field;
};

absl::Status CheckOutputs(const SampleTokensArgs& args) {
  NamedView outs[4];
  int n = 0;
  outs[n++] = {&args.ids, "ids"};
  if (args.inverse) outs[n++] = {&*args.inverse, "inverse"};
  if (args.bert_mask) outs[n++] = {&*args.bert_mask, "bert_mask"};
  if (args.gpt_mask) outs[n++] = {&*args.gpt_mask, "gpt_mask"};
  for (int i = 0; i < n; ++i) {
    RETURN_IF_ERROR(CheckNonOverlapping(*outs[i].view, outs[i].field));
    for (int j = 0; j < i; ++j) {
      RETURN_IF_ERROR(CheckDisjoint(*outs[i].view, outs[i].field, *outs[j].view, outs[j].field));
    }
    if (args.mask) RETURN_IF_ERROR(CheckDisjoint(*outs[i].view, outs[i].field, *args.mask, "mask"));
  }
  return absl::OkStatus();
}

absl::Status CheckMasks(const SampleTokensArgs& args) {
  const int64_t L = args.layers, B = args.batch;
  const int64_t S = args.original_tokens, R = args.retained_tokens;
  const bool want_mask = args.bert_mask.has_value() || args.gpt_mask.has_value();
  if (!args.mask) {
    if (args.bert_mask) {
      return absl::InvalidArgumentError("bert_mask: requires mask [B,H,Sq,S] to gather from");
    }
    if (args.gpt_mask) {
      return absl::InvalidArgumentError("gpt_mask: requires mask [B,H,S,S] to slice");
    }
    return absl::OkStatus();
  }
  if (!want_mask) {
    return absl::InvalidArgumentError(
        "mask: given but neither bert_mask nor gpt_mask is requested");
  }
  const TensorView& mask = *args.mask;
  RETURN_IF_ERROR(CheckView(mask, "mask", 4));
  RETURN_IF_ERROR(CheckDim(mask, "mask", 0, "B", B, "batch"));
  RETURN_IF_ERROR(CheckDim(mask, "mask", 3, "S", S, "original_tokens"));
  const int64_t H = mask.shape[1];
  if (args.bert_mask) {
    if (H < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("mask: dim 1 (H) is ", H, ", expected >= 1 for bert_mask"));
    }
    if (mask.shape[2] != 1 && mask.shape[2] != S) {
      return absl::InvalidArgumentError(absl::StrCat("mask: dim 2 (Sq) is ", mask.shape[2],
                                                     ", expected 1 or ", S,
                                                     " (original_tokens) for bert_mask"));
    }
    const TensorView& out = *args.bert_mask;
    RETURN_IF_ERROR(CheckView(out, "bert_mask", 5));
    RETURN_IF_ERROR(CheckSameDType(out, "bert_mask", mask, "mask"));
    RETURN_IF_ERROR(CheckDim(out, "bert_mask", 0, "L", L, "layers"));
    RETURN_IF_ERROR(CheckDim(out, "bert_mask", 1, "B", B, "batch"));
    RETURN_IF_ERROR(CheckDim(out, "bert_mask", 2, "H", H, "mask H"));
    RETURN_IF_ERROR(CheckDim(out, "bert_mask", 3, "R", R, "retained_tokens"));
    RETURN_IF_ERROR(CheckDim(out, "bert_mask", 4, "R", R, "retained_tokens"));
  }
  if (args.gpt_mask) {
    RETURN_IF_ERROR(CheckDim(mask, "mask", 2, "S", S, "original_tokens, for gpt_mask"));
    const TensorView& out = *args.gpt_mask;
    RETURN_IF_ERROR(CheckView(out, "gpt_mask", 4));
    RETURN_IF_ERROR(CheckSameDType(out, "gpt_mask", mask, "mask"));
    RETURN_IF_ERROR(CheckDim(out, "gpt_mask", 0, "B", B, "batch"));
    RETURN_IF_ERROR(CheckDim(out, "gpt_mask", 1, "H", H, "mask H"));
    RETURN_IF_ERROR(CheckDim(out, "gpt_mask", 2, "R", R, "retained_tokens"));
    RETURN_IF_ERROR(CheckDim(out, "gpt_mask", 3, "R", R, "retained_tokens"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSampleTokens(const SampleTokensArgs& args) {
  constexpr int64_t kMaxWord = static_cast<int64_t>(kSampleMaxCounterWord);
  RETURN_IF_ERROR(CheckCount(args.layers, "layers", kMaxWord, "a Philox counter word"));
  RETURN_IF_ERROR(CheckCount(args.batch, "batch", kMaxWord, "a Philox counter word"));
  RETURN_IF_ERROR(CheckCount(args.original_tokens, "original_tokens",
                             std::numeric_limits<int32_t>::max(), "int32 ids"));
  if (args.retained_tokens < 0 || args.retained_tokens > args.original_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("retained_tokens: ", args.retained_tokens,
                                                   " is out of range [0, ", args.original_tokens,
                                                   "] (original_tokens)"));
  }
  if (args.step > kSampleMaxCounterWord) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: ", args.step, " is out of range [0, 2^32) (a Philox counter word)"));
  }

  RETURN_IF_ERROR(CheckView(args.ids, "ids", 3));
  RETURN_IF_ERROR(CheckIndexDType(args.ids, "ids"));
  RETURN_IF_ERROR(CheckDim(args.ids, "ids", 0, "L", args.layers, "layers"));
  RETURN_IF_ERROR(CheckDim(args.ids, "ids", 1, "B", args.batch, "batch"));
  RETURN_IF_ERROR(CheckDim(args.ids, "ids", 2, "R", args.retained_tokens, "retained_tokens"));
  if (args.inverse) {
    const TensorView& inv = *args.inverse;
    RETURN_IF_ERROR(CheckView(inv, "inverse", 3));
    RETURN_IF_ERROR(CheckDType(inv, "inverse", {DType::kInt32}));
    RETURN_IF_ERROR(CheckDim(inv, "inverse", 0, "L", args.layers, "layers"));
    RETURN_IF_ERROR(CheckDim(inv, "inverse", 1, "B", args.batch, "batch"));
    RETURN_IF_ERROR(CheckDim(inv, "inverse", 2, "S", args.original_tokens, "original_tokens"));
  }
  RETURN_IF_ERROR(CheckMasks(args));
  RETURN_IF_ERROR(CheckOutputs(args));

  // The mask ops re-validate when called; running their checks here too keeps
  // "nothing written on error" even if their rules are stricter than ours.
  if (args.bert_mask) {
    RETURN_IF_ERROR(
        ValidateGatherBertMask(GatherBertMaskArgs{*args.mask, args.ids, *args.bert_mask}));
  }
  if (args.gpt_mask) {
    RETURN_IF_ERROR(ValidateSliceGptMask(SliceGptMaskArgs{*args.mask, *args.gpt_mask}));
  }
  return absl::OkStatus();
}

}  // namespace tokensel::kernels
