// `tokensel scatter`: ScatterTokens on inline .npy files.
#include "absl/flags/flag.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "client/cli/op_util.h"
#include "common/status_macros.h"

ABSL_FLAG(std::string, all, "", "input .npy: [B,S,C] (or [S,B,C]); the result is written to --out");
ABSL_FLAG(std::string, layer, "", "input .npy: [B,R,C] (or [R,B,C]), same dtype as --all");

namespace tokensel::cli {
namespace {

absl::Status Scatter(const client::Client& client) {
  if (OutFlag().empty()) return absl::InvalidArgumentError("--out is required");
  v1::ScatterTokensRequest req;
  ASSIGN_OR_RETURN(*req.mutable_all(), ReadInlineInput("all", absl::GetFlag(FLAGS_all)));
  ASSIGN_OR_RETURN(*req.mutable_layer(), ReadInlineInput("layer", absl::GetFlag(FLAGS_layer)));
  ASSIGN_OR_RETURN(*req.mutable_indices(), ReadInlineInput("indices", IndicesFlag()));
  req.set_batch_first(!SeqFirstFlag());
  ASSIGN_OR_RETURN(v1::OpResponse resp, client.ScatterTokens(req));
  return WriteOutput(resp, "all", OutFlag());
}

int RunScatter() { return RunInSession("scatter", Scatter); }

}  // namespace

const Command kScatterCommand = {
    "scatter", "ScatterTokens: all[b,indices[b,r],:] = layer[b,r,:]",
    "Writes the rows of --layer into a copy of --all at --indices (unique per row)\n"
    "and saves the result as --out; rows not named keep --all's values.\n"
    "  tokensel scatter --all=x.npy --layer=part.npy --indices=idx.npy --out=y.npy",
    ConnectionFlags({"all", "layer", "indices", "out", "seq_first"}), &RunScatter};

}  // namespace tokensel::cli
