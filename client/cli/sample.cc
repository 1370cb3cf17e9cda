// `tokensel sample`: SampleTokens, outputs inline to .npy.
#include "absl/flags/flag.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "client/cli/op_util.h"
#include "common/status_macros.h"
#include "tokensel/client/tensor_ref.h"

ABSL_FLAG(uint64_t, step, 0, "training step (< 2^32), part of the random stream");
ABSL_FLAG(std::string, mask, "", "optional input .npy: attention mask [B,H,Sq,S] (bool/uint8/...)");
ABSL_FLAG(std::string, bert_mask, "",
          "optional output .npy: --mask gathered per layer [L,B,H,R,R]");
ABSL_FLAG(std::string, gpt_mask, "", "optional output .npy: --mask's top-left corner [B,H,R,R]");

namespace tokensel::cli {
namespace {

absl::Status Sample(const client::Client& client) {
  if (OutFlag().empty()) return absl::InvalidArgumentError("--out is required");
  if (BatchFlag() <= 0) return absl::InvalidArgumentError("--batch must be > 0");
  const std::string bert = absl::GetFlag(FLAGS_bert_mask);
  const std::string gpt = absl::GetFlag(FLAGS_gpt_mask);
  v1::SampleTokensRequest req;
  req.set_layers(LayersFlag() == 0 ? 1 : LayersFlag());
  req.set_batch(BatchFlag());
  req.set_original_tokens(OriginalTokensFlag());
  req.set_retained_tokens(RetainedTokensFlag());
  req.set_seed(SeedFlag());
  req.set_step(absl::GetFlag(FLAGS_step));
  const v1::Tensor inline_out = client::TensorRef::InlineOutput().ToProto();
  *req.mutable_ids() = inline_out;
  if (!InverseFlag().empty()) *req.mutable_inverse() = inline_out;
  if (const std::string mask = absl::GetFlag(FLAGS_mask); !mask.empty()) {
    ASSIGN_OR_RETURN(*req.mutable_mask(), ReadInlineInput("mask", mask));
  }
  if (!bert.empty()) *req.mutable_bert_mask() = inline_out;
  if (!gpt.empty()) *req.mutable_gpt_mask() = inline_out;
  ASSIGN_OR_RETURN(v1::OpResponse resp, client.SampleTokens(req));
  RETURN_IF_ERROR(WriteOutput(resp, "ids", OutFlag()));
  if (!InverseFlag().empty()) RETURN_IF_ERROR(WriteOutput(resp, "inverse", InverseFlag()));
  if (!bert.empty()) RETURN_IF_ERROR(WriteOutput(resp, "bert_mask", bert));
  if (!gpt.empty()) RETURN_IF_ERROR(WriteOutput(resp, "gpt_mask", gpt));
  return absl::OkStatus();
}

int RunSample() { return RunInSession("sample", Sample); }

}  // namespace

const Command kSampleCommand = {
    "sample", "SampleTokens: seeded uniform R-of-S subsets per (layer, row)",
    "Draws, for each of --layers x --batch rows, --retained_tokens distinct\n"
    "positions of [0, --original_tokens), ascending; a pure function of (--seed,\n"
    "--step, layer, row). Writes --out (int32 [L,B,R]); optionally --inverse\n"
    "(int32 [L,B,S]) and, given --mask, --bert_mask or --gpt_mask.\n"
    "  tokensel sample --batch=8 --original_tokens=512 --retained_tokens=256 --seed=1 "
    "--out=ids.npy",
    ConnectionFlags({"layers", "batch", "original_tokens", "retained_tokens", "seed", "step", "out",
                     "inverse", "mask", "bert_mask", "gpt_mask"}),
    &RunSample};

}  // namespace tokensel::cli
