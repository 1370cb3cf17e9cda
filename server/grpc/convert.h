// tokensel.v1 messages <-> the transport-free core request model.
//
// Pure functions, no I/O, thread-safe. Requests convert field by field;
// TensorSpec::inline_data points into the proto message, which must outlive
// the core request. The only errors here are values the core types cannot
// hold (unknown enum values, an unset oneof); everything else (shapes, sizes,
// sources of required inputs) is validated by the core. Errors are
// INVALID_ARGUMENT and name the field with `prefix` prepended
// ("ops[1].gather_tokens.indices.dtype: ...").
#ifndef TOKENSEL_SERVER_GRPC_CONVERT_H_
#define TOKENSEL_SERVER_GRPC_CONVERT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"
#include "server/core/backend.h"
#include "server/core/buffer_registry.h"
#include "server/core/region.h"
#include "server/core/request.h"
#include "server/core/server_description.h"
#include "tokensel/v1/tokensel.pb.h"

namespace tokensel::server {

// DTYPE_UNSPECIFIED -> nullopt; unknown numbers -> INVALID_ARGUMENT.
absl::StatusOr<std::optional<kernels::DType>> DTypeFromProto(int dtype, absl::string_view field);
v1::DType DTypeToProto(kernels::DType dtype);

// dtype/shape/strides copied; oneof data: buffer -> kBuffer, inline_data ->
// kInline (a view into `tensor`), unset -> kNone.
absl::StatusOr<core::TensorSpec> TensorFromProto(const v1::Tensor& tensor, absl::string_view field);

absl::StatusOr<core::SortTokensRequest> OpFromProto(const v1::SortTokensRequest& req,
                                                    absl::string_view prefix = "");
absl::StatusOr<core::GatherTokensRequest> OpFromProto(const v1::GatherTokensRequest& req,
                                                      absl::string_view prefix = "");
absl::StatusOr<core::ScatterTokensRequest> OpFromProto(const v1::ScatterTokensRequest& req,
                                                       absl::string_view prefix = "");
absl::StatusOr<core::GatherBertMaskRequest> OpFromProto(const v1::GatherBertMaskRequest& req,
                                                        absl::string_view prefix = "");
absl::StatusOr<core::SliceGptMaskRequest> OpFromProto(const v1::SliceGptMaskRequest& req,
                                                      absl::string_view prefix = "");
absl::StatusOr<core::SegmentSeqlensRequest> OpFromProto(const v1::SegmentSeqlensRequest& req,
                                                        absl::string_view prefix = "");
absl::StatusOr<core::SampleTokensRequest> OpFromProto(const v1::SampleTokensRequest& req,
                                                      absl::string_view prefix = "");
absl::StatusOr<core::TopKTokensRequest> OpFromProto(const v1::TopKTokensRequest& req,
                                                    absl::string_view prefix = "");
absl::StatusOr<core::MergeTokensRequest> OpFromProto(const v1::MergeTokensRequest& req,
                                                     absl::string_view prefix = "");
absl::StatusOr<core::SplitTokensRequest> OpFromProto(const v1::SplitTokensRequest& req,
                                                     absl::string_view prefix = "");
absl::StatusOr<core::SamplePackedTokensRequest> OpFromProto(
    const v1::SamplePackedTokensRequest& req, absl::string_view prefix = "");

// The oneof `op`; INVALID_ARGUMENT "<prefix>op: no operator set" when unset.
// Field names inside are prefixed with "<prefix><oneof field>." (e.g.
// "gather_tokens.indices").
absl::StatusOr<core::OpRequest> OpFromProto(const v1::Op& op, absl::string_view prefix = "");

// Every op of an Execute, errors prefixed "ops[i].".
absl::StatusOr<std::vector<core::OpRequest>> OpsFromProto(const v1::ExecuteRequest& req);

// The oneof `source` for the sources that need no server state: cuda_ipc.
// host_shm (by name) is PERMISSION_DENIED: the server never opens memory
// with its own rights. `fd` tickets are redeemed by Handlers::Register, not
// here (INVALID_ARGUMENT). INVALID_ARGUMENT naming "source" when unset.
absl::StatusOr<core::RegionSpec> RegionFromProto(const v1::RegisterBufferRequest& req);

// Moves each inline output's bytes into a NamedTensor (dtype, shape, inline_data).
void OpResultToProto(core::OpResult&& result, v1::OpResponse* out);

void BufferInfoToProto(const core::BufferInfo& info, v1::BufferInfo* out);

// What GetServerInfo reports (core/server_description.h).
void ServerInfoToProto(const core::ServerDescription& desc, v1::ServerInfo* out);

}  // namespace tokensel::server

#endif  // TOKENSEL_SERVER_GRPC_CONVERT_H_
