// `tokensel topk`: TopKTokens on an inline .npy.
#include "absl/flags/flag.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "client/cli/op_util.h"
#include "common/status_macros.h"
#include "tokensel/client/tensor_ref.h"

ABSL_FLAG(std::string, scores, "", "input .npy: float16|float32 [..., S]");

namespace tokensel::cli {
namespace {

absl::Status TopK(const client::Client& client) {
  if (OutFlag().empty()) return absl::InvalidArgumentError("--out is required");
  v1::TopKTokensRequest req;
  ASSIGN_OR_RETURN(*req.mutable_scores(), ReadInlineInput("scores", absl::GetFlag(FLAGS_scores)));
  req.set_retained_tokens(RetainedTokensFlag());
  *req.mutable_ids() = client::TensorRef::InlineOutput().ToProto();
  ASSIGN_OR_RETURN(v1::OpResponse resp, client.TopKTokens(req));
  return WriteOutput(resp, "ids", OutFlag());
}

int RunTopK() { return RunInSession("topk", TopK); }

}  // namespace

const Command kTopKCommand = {
    "topk", "TopKTokens: the R highest-scoring positions per row, ascending",
    "Writes --out, int32 [..., R]: per row of --scores the --retained_tokens\n"
    "positions with the highest scores, in ascending position order (ties to the\n"
    "lower position, NaN lowest).\n"
    "  tokensel topk --scores=s.npy --retained_tokens=128 --out=ids.npy",
    ConnectionFlags({"scores", "retained_tokens", "out"}), &RunTopK};

}  // namespace tokensel::cli
