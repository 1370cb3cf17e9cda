#include "client/cli/op_util.h"

#include <cstdio>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "common/status_macros.h"
#include "tokensel/client/tensor_ref.h"

ABSL_FLAG(std::string, out, "", "output .npy path (the op's main result)");
ABSL_FLAG(std::string, inverse, "",
          "optional .npy path for the int32 inverse map [..., S] (sort, sample)");
ABSL_FLAG(std::string, indices, "", "input .npy: int32|int64 [B,R] token indices");
ABSL_FLAG(bool, seq_first, false, "activations are [S,B,C] (default [B,S,C])");
ABSL_FLAG(int64_t, original_tokens, 0, "S, tokens per sequence (0 = the command's default)");
ABSL_FLAG(int64_t, retained_tokens, 0, "R, tokens kept per row (0 = the command's default)");
ABSL_FLAG(int64_t, layers, 0, "L layers (0 = the command's default: sample 1, bench 1, demo 12)");
ABSL_FLAG(int64_t, batch, 0, "B, sequences per batch (0 = the command's default)");
ABSL_FLAG(uint64_t, seed, 0, "random seed");

namespace tokensel::cli {

std::string OutFlag() { return absl::GetFlag(FLAGS_out); }
std::string InverseFlag() { return absl::GetFlag(FLAGS_inverse); }
std::string IndicesFlag() { return absl::GetFlag(FLAGS_indices); }
bool SeqFirstFlag() { return absl::GetFlag(FLAGS_seq_first); }
int64_t OriginalTokensFlag() { return absl::GetFlag(FLAGS_original_tokens); }
int64_t RetainedTokensFlag() { return absl::GetFlag(FLAGS_retained_tokens); }
int64_t LayersFlag() { return absl::GetFlag(FLAGS_layers); }
int64_t BatchFlag() { return absl::GetFlag(FLAGS_batch); }
uint64_t SeedFlag() { return absl::GetFlag(FLAGS_seed); }

v1::DType ToProto(kernels::DType dtype) {
  return static_cast<v1::DType>(static_cast<int>(dtype) + 1);
}

absl::StatusOr<kernels::DType> FromProto(v1::DType dtype) {
  const int k = static_cast<int>(dtype) - 1;
  if (k < 0 || k >= kernels::kNumDTypes) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", v1::DType_Name(dtype)));
  }
  return static_cast<kernels::DType>(k);
}

v1::Tensor InlineTensor(const NpyArray& array) {
  return client::TensorRef::Inline(array.data)
      .Dtype(ToProto(array.dtype))
      .Shape(array.shape)
      .ToProto();
}

absl::StatusOr<v1::Tensor> ReadInlineInput(const std::string& flag, const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " is required"));
  ASSIGN_OR_RETURN(NpyArray array, ReadNpy(path));
  return InlineTensor(array);
}

absl::StatusOr<NpyArray> OutputArray(const v1::OpResponse& response, const std::string& name) {
  ASSIGN_OR_RETURN(const v1::Tensor* tensor, client::FindOutput(response, name));
  NpyArray array;
  ASSIGN_OR_RETURN(array.dtype, FromProto(tensor->dtype()));
  array.shape.assign(tensor->shape().begin(), tensor->shape().end());
  array.data = tensor->inline_data();
  if (static_cast<uint64_t>(array.NumElements() * kernels::ElementSize(array.dtype)) !=
      array.data.size()) {
    return absl::InternalError(absl::StrCat("output '", name, "' has ", array.data.size(),
                                            " bytes for shape [", absl::StrJoin(array.shape, ","),
                                            "]"));
  }
  return array;
}

absl::Status WriteOutput(const v1::OpResponse& response, const std::string& name,
                         const std::string& path) {
  ASSIGN_OR_RETURN(NpyArray array, OutputArray(response, name));
  RETURN_IF_ERROR(WriteNpy(path, array));
  std::printf("wrote %s %s[%s]\n", path.c_str(),
              std::string(kernels::DTypeName(array.dtype)).c_str(),
              absl::StrJoin(array.shape, ",").c_str());
  return absl::OkStatus();
}

int RunInSession(const char* command,
                 const std::function<absl::Status(const client::Client&)>& call) {
  absl::StatusOr<client::Client> client = ConnectFromFlags();
  if (!client.ok()) return Fail(command, client.status());
  absl::StatusOr<std::unique_ptr<client::Session>> session =
      OpenSession(*client, absl::StrCat("tokensel-cli-", command));
  if (!session.ok()) return Fail(command, session.status());
  const absl::Status status = call((*session)->client());
  if (!status.ok()) return Fail(command, status);
  return kExitOk;
}

}  // namespace tokensel::cli
