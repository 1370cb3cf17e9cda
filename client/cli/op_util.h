// Shared plumbing of the one-off op subcommands (sort, gather, scatter,
// seqlens, topk, sample): .npy <-> inline tensors, and running one request
// in a fresh session.
#ifndef TOKENSEL_CLIENT_CLI_OP_UTIL_H_
#define TOKENSEL_CLIENT_CLI_OP_UTIL_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cli/npy.h"
#include "kernels/dtype.h"
#include "tokensel/client/client.h"
#include "tokensel/v1/tokensel.pb.h"

namespace tokensel::cli {

namespace v1 = ::tokensel::v1;

// kernels::DType <-> v1::DType (the same order; proto = kernels + 1).
v1::DType ToProto(kernels::DType dtype);
absl::StatusOr<kernels::DType> FromProto(v1::DType dtype);

// The array as an inline input tensor.
v1::Tensor InlineTensor(const NpyArray& array);
// Reads `path` (flag `flag` names it in errors) as an inline input tensor.
// INVALID_ARGUMENT when `path` is empty ("--<flag> is required").
absl::StatusOr<v1::Tensor> ReadInlineInput(const std::string& flag, const std::string& path);

// The inline output `name` of `response` as an array.
absl::StatusOr<NpyArray> OutputArray(const v1::OpResponse& response, const std::string& name);
// OutputArray + WriteNpy(path); prints "wrote <path> <dtype>[shape]" to stdout.
absl::Status WriteOutput(const v1::OpResponse& response, const std::string& name,
                         const std::string& path);

// Connects with the connection flags, opens a session, runs `call` with the
// session-bound client, closes the session. Returns the exit code (prints
// the error as "tokensel <command>: ...").
int RunInSession(const char* command,
                 const std::function<absl::Status(const client::Client&)>& call);

// Shared one-off op flags (defined in op_util.cc).
std::string OutFlag();
std::string InverseFlag();
std::string IndicesFlag();
bool SeqFirstFlag();
int64_t OriginalTokensFlag();
int64_t RetainedTokensFlag();
int64_t LayersFlag();  // 0 = the command's default
int64_t BatchFlag();   // 0 = the command's default
uint64_t SeedFlag();

}  // namespace tokensel::cli

#endif  // TOKENSEL_CLIENT_CLI_OP_UTIL_H_
