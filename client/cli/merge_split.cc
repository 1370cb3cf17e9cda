// `tokensel merge` and `tokensel split`: MergeTokens and SplitTokens on
// inline .npy files (the Random-LTD pair without the clone).
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "client/cli/op_util.h"
#include "common/status_macros.h"

ABSL_DECLARE_FLAG(std::string, layer);  // scatter.cc
ABSL_FLAG(std::string, x, "", "input .npy: [B,S,C] (or [S,B,C]), the layer's input");
ABSL_FLAG(std::string, grad, "", "input .npy: [B,S,C] (or [S,B,C]), the merged output's gradient");
ABSL_FLAG(std::string, layer_grad_out, "",
          "output .npy: [B,R,C] (or [R,B,C]), grad's retained rows");
ABSL_FLAG(std::string, rest_grad_out, "", "output .npy: grad with the retained rows zeroed");

namespace tokensel::cli {
namespace {

absl::Status Merge(const client::Client& client) {
  if (OutFlag().empty()) return absl::InvalidArgumentError("--out is required");
  v1::MergeTokensRequest req;
  ASSIGN_OR_RETURN(*req.mutable_x(), ReadInlineInput("x", absl::GetFlag(FLAGS_x)));
  ASSIGN_OR_RETURN(*req.mutable_layer(), ReadInlineInput("layer", absl::GetFlag(FLAGS_layer)));
  ASSIGN_OR_RETURN(*req.mutable_indices(), ReadInlineInput("indices", IndicesFlag()));
  req.set_batch_first(!SeqFirstFlag());
  ASSIGN_OR_RETURN(v1::OpResponse resp, client.MergeTokens(req));
  return WriteOutput(resp, "out", OutFlag());
}

absl::Status Split(const client::Client& client) {
  const std::string layer_out = absl::GetFlag(FLAGS_layer_grad_out);
  const std::string rest_out = absl::GetFlag(FLAGS_rest_grad_out);
  if (layer_out.empty() && rest_out.empty()) {
    return absl::InvalidArgumentError("--layer_grad_out or --rest_grad_out is required");
  }
  v1::SplitTokensRequest req;
  ASSIGN_OR_RETURN(*req.mutable_grad(), ReadInlineInput("grad", absl::GetFlag(FLAGS_grad)));
  ASSIGN_OR_RETURN(*req.mutable_indices(), ReadInlineInput("indices", IndicesFlag()));
  req.set_batch_first(!SeqFirstFlag());
  ASSIGN_OR_RETURN(v1::OpResponse resp, client.SplitTokens(req));
  if (!layer_out.empty()) RETURN_IF_ERROR(WriteOutput(resp, "layer_grad", layer_out));
  if (!rest_out.empty()) RETURN_IF_ERROR(WriteOutput(resp, "rest_grad", rest_out));
  return absl::OkStatus();
}

int RunMerge() { return RunInSession("merge", Merge); }
int RunSplit() { return RunInSession("split", Split); }

}  // namespace

const Command kMergeCommand = {
    "merge", "MergeTokens: out[b,s,:] = layer[b,r,:] where indices[b,r] == s, else x[b,s,:]",
    "Merges the rows of --layer into --x at --indices (unique per row), in one pass\n"
    "without a copy of --x, and saves the result as --out.\n"
    "  tokensel merge --x=x.npy --layer=part.npy --indices=idx.npy --out=y.npy",
    ConnectionFlags({"x", "layer", "indices", "out", "seq_first"}), &RunMerge};

const Command kSplitCommand = {
    "split", "SplitTokens: grad's rows at indices, and grad with those rows zeroed",
    "The backward of merge: saves grad's rows at --indices as --layer_grad_out and\n"
    "grad with those rows zeroed as --rest_grad_out (either or both).\n"
    "  tokensel split --grad=g.npy --indices=idx.npy --layer_grad_out=gl.npy "
    "--rest_grad_out=gr.npy",
    ConnectionFlags({"grad", "indices", "layer_grad_out", "rest_grad_out", "seq_first"}),
    &RunSplit};

}  // namespace tokensel::cli
