// `tokensel sort`: SortTokens on an inline .npy.
#include "absl/flags/flag.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "client/cli/op_util.h"
#include "common/status_macros.h"
#include "tokensel/client/tensor_ref.h"

ABSL_FLAG(std::string, ids, "", "input .npy: int32|int64 [..., R], unique ids in [0, S) per row");

namespace tokensel::cli {
namespace {

absl::Status Sort(const client::Client& client) {
  if (OutFlag().empty()) return absl::InvalidArgumentError("--out is required");
  v1::SortTokensRequest req;
  ASSIGN_OR_RETURN(*req.mutable_ids(), ReadInlineInput("ids", absl::GetFlag(FLAGS_ids)));
  req.set_original_tokens(OriginalTokensFlag());
  *req.mutable_out() = client::TensorRef::InlineOutput().ToProto();
  if (!InverseFlag().empty()) *req.mutable_inverse() = client::TensorRef::InlineOutput().ToProto();
  ASSIGN_OR_RETURN(v1::OpResponse resp, client.SortTokens(req));
  RETURN_IF_ERROR(WriteOutput(resp, "out", OutFlag()));
  if (!InverseFlag().empty()) RETURN_IF_ERROR(WriteOutput(resp, "inverse", InverseFlag()));
  return absl::OkStatus();
}

int RunSort() { return RunInSession("sort", Sort); }

}  // namespace

const Command kSortCommand = {
    "sort", "SortTokens: sort each row of token ids (.npy in, .npy out)",
    "Sorts each row of --ids (unique ids in [0, --original_tokens)) ascending and\n"
    "writes --out; --inverse also writes the int32 inverse map (rank of each\n"
    "position, -1 if absent). Tensors travel inline.\n"
    "  tokensel sort --ids=ids.npy --original_tokens=512 --out=sorted.npy",
    ConnectionFlags({"ids", "original_tokens", "out", "inverse"}), &RunSort};

}  // namespace tokensel::cli
