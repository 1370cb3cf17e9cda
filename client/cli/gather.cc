// `tokensel gather`: GatherTokens on inline .npy files.
#include "absl/flags/flag.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "client/cli/op_util.h"
#include "common/status_macros.h"
#include "tokensel/client/tensor_ref.h"

ABSL_FLAG(std::string, activations, "", "input .npy: [B,S,C] (or [S,B,C] with --seq_first)");

namespace tokensel::cli {
namespace {

absl::Status Gather(const client::Client& client) {
  if (OutFlag().empty()) return absl::InvalidArgumentError("--out is required");
  v1::GatherTokensRequest req;
  ASSIGN_OR_RETURN(*req.mutable_activations(),
                   ReadInlineInput("activations", absl::GetFlag(FLAGS_activations)));
  ASSIGN_OR_RETURN(*req.mutable_indices(), ReadInlineInput("indices", IndicesFlag()));
  *req.mutable_out() = client::TensorRef::InlineOutput().ToProto();
  req.set_batch_first(!SeqFirstFlag());
  ASSIGN_OR_RETURN(v1::OpResponse resp, client.GatherTokens(req));
  return WriteOutput(resp, "out", OutFlag());
}

int RunGather() { return RunInSession("gather", Gather); }

}  // namespace

const Command kGatherCommand = {
    "gather", "GatherTokens: out[b,r,:] = activations[b,indices[b,r],:]",
    "Gathers the rows named by --indices ([B,R]) from --activations and writes\n"
    "--out ([B,R,C], or [R,B,C] with --seq_first). Any dtype; tensors inline.\n"
    "  tokensel gather --activations=x.npy --indices=idx.npy --out=part.npy",
    ConnectionFlags({"activations", "indices", "out", "seq_first"}), &RunGather};

}  // namespace tokensel::cli
