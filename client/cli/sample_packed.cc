// `tokensel packed`: SamplePackedTokens on an inline cu_seqlens .npy (and,
// for the fused gather, an activations .npy), outputs inline to .npy.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "client/cli/op_util.h"
#include "common/status_macros.h"
#include "tokensel/client/tensor_ref.h"

ABSL_DECLARE_FLAG(uint64_t, step);            // sample.cc
ABSL_DECLARE_FLAG(std::string, activations);  // gather.cc
ABSL_FLAG(std::string, cu_seqlens, "", "input .npy: int32 [N+1] sequence boundaries of the pack");
ABSL_FLAG(std::string, keep, "1/2", "fraction of each sequence kept, num/den (0 <= num <= den)");
ABSL_FLAG(int64_t, min_tokens, 0, "tokens kept per sequence at least (capped at its length)");
ABSL_FLAG(int64_t, total_tokens, -1,
          "T, the packed length (-1 = --activations' dim 0, else cu_seqlens' last value)");
ABSL_FLAG(std::string, cu_seqlens_kept_out, "", "optional output .npy: int32 [N+1] of the kept");
ABSL_FLAG(std::string, positions_out, "",
          "optional output .npy: int32 [L,T'] each kept token's position in its sequence");
ABSL_FLAG(std::string, gathered_out, "",
          "optional output .npy: [T',C] the kept rows of --activations (--layers 1)");

namespace tokensel::cli {
namespace {

absl::Status ParseKeep(const std::string& text, v1::SamplePackedTokensRequest* req) {
  const std::vector<std::string> parts = absl::StrSplit(text, '/');
  int64_t num = 0, den = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &num) || !absl::SimpleAtoi(parts[1], &den)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--keep: '", text, "' is not num/den (e.g. 1/2)"));
  }
  req->set_keep_num(num);
  req->set_keep_den(den);
  return absl::OkStatus();
}

absl::Status Packed(const client::Client& client) {
  if (OutFlag().empty()) return absl::InvalidArgumentError("--out is required");
  const std::string cu_path = absl::GetFlag(FLAGS_cu_seqlens);
  if (cu_path.empty()) return absl::InvalidArgumentError("--cu_seqlens is required");
  v1::SamplePackedTokensRequest req;
  ASSIGN_OR_RETURN(*req.mutable_cu_seqlens(), ReadInlineInput("cu_seqlens", cu_path));
  RETURN_IF_ERROR(ParseKeep(absl::GetFlag(FLAGS_keep), &req));
  req.set_min_tokens(absl::GetFlag(FLAGS_min_tokens));
  req.set_layers(LayersFlag() == 0 ? 1 : LayersFlag());
  req.set_seed(SeedFlag());
  req.set_step(absl::GetFlag(FLAGS_step));
  const std::string gathered = absl::GetFlag(FLAGS_gathered_out);
  if (const std::string acts = absl::GetFlag(FLAGS_activations); !acts.empty()) {
    ASSIGN_OR_RETURN(*req.mutable_activations(), ReadInlineInput("activations", acts));
  } else if (!gathered.empty()) {
    return absl::InvalidArgumentError("--gathered_out needs --activations");
  }
  if (const int64_t total = absl::GetFlag(FLAGS_total_tokens); total >= 0) {
    req.set_total_tokens(total);
  } else if (!req.has_activations()) {
    // No padding: T is the last boundary (the request's inline bytes).
    const std::string& data = req.cu_seqlens().inline_data();
    if (data.size() < sizeof(int32_t)) {
      return absl::InvalidArgumentError("--cu_seqlens: needs at least one value ([N+1], N >= 0)");
    }
    int32_t last = 0;
    std::memcpy(&last, data.data() + data.size() - sizeof(int32_t), sizeof(last));
    req.set_total_tokens(last);
  }
  const v1::Tensor inline_out = client::TensorRef::InlineOutput().ToProto();
  *req.mutable_ids() = inline_out;
  *req.mutable_cu_seqlens_kept() = inline_out;
  const std::string kept_out = absl::GetFlag(FLAGS_cu_seqlens_kept_out);
  const std::string positions = absl::GetFlag(FLAGS_positions_out);
  if (!positions.empty()) *req.mutable_positions() = inline_out;
  if (!InverseFlag().empty()) *req.mutable_inverse() = inline_out;
  if (!gathered.empty()) *req.mutable_out() = inline_out;
  ASSIGN_OR_RETURN(v1::OpResponse resp, client.SamplePackedTokens(req));
  RETURN_IF_ERROR(WriteOutput(resp, "ids", OutFlag()));
  if (!kept_out.empty()) RETURN_IF_ERROR(WriteOutput(resp, "cu_seqlens_kept", kept_out));
  if (!positions.empty()) RETURN_IF_ERROR(WriteOutput(resp, "positions", positions));
  if (!InverseFlag().empty()) RETURN_IF_ERROR(WriteOutput(resp, "inverse", InverseFlag()));
  if (!gathered.empty()) RETURN_IF_ERROR(WriteOutput(resp, "out", gathered));
  return absl::OkStatus();
}

int RunPacked() { return RunInSession("packed", Packed); }

}  // namespace

const Command kPackedCommand = {
    "packed", "SamplePackedTokens: Random-LTD token dropping for a packed (THD) batch",
    "Keeps, per sequence of --cu_seqlens, a seeded uniform subset of\n"
    "min(n, max(--min_tokens, ceil(n * --keep))) tokens, ascending; a pure function of\n"
    "(--seed, --step, layer, sequence). Writes the kept positions in the pack as --out\n"
    "(int32 [L,T']); optionally --cu_seqlens_kept_out, --positions_out (for RoPE),\n"
    "--inverse (int32 [L,T]) and, with --activations [T,C], --gathered_out.\n"
    "  tokensel packed --cu_seqlens=cu.npy --keep=1/2 --seed=1 --out=ids.npy "
    "--cu_seqlens_kept_out=cu_kept.npy",
    ConnectionFlags({"cu_seqlens", "keep", "min_tokens", "total_tokens", "layers", "seed", "step",
                     "activations", "out", "cu_seqlens_kept_out", "positions_out", "inverse",
                     "gathered_out"}),
    &RunPacked};

}  // namespace tokensel::cli
