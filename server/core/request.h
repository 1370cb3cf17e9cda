// The transport-free request model: what a client asked for, before any
// buffer is resolved. server/grpc converts tokensel.v1 messages into these;
// the Executor resolves them into kernels::TensorViews and runs them.
//
// Each operator's request type and everything the core knows about it live
// in its home, server/core/ops/<op>.h (contract: ops/op.h); this header lists
// them and holds the generic loops over them.
#ifndef TOKENSEL_SERVER_CORE_REQUEST_H_
#define TOKENSEL_SERVER_CORE_REQUEST_H_

#include <cstdint>
#include <variant>
#include <vector>

#include "absl/strings/string_view.h"
#include "server/core/ops/gather_bert_mask.h"
#include "server/core/ops/gather_tokens.h"
#include "server/core/ops/merge_split_tokens.h"
#include "server/core/ops/sample_packed_tokens.h"
#include "server/core/ops/sample_tokens.h"
#include "server/core/ops/scatter_tokens.h"
#include "server/core/ops/segment_seqlens.h"
#include "server/core/ops/slice_gpt_mask.h"
#include "server/core/ops/sort_tokens.h"
#include "server/core/ops/top_k_tokens.h"
#include "server/core/tensor_spec.h"

namespace tokensel::core {

// Every operator, in API order (the `op` metric label is pre-created for each).
using OpRequest = std::variant<SortTokensRequest, GatherTokensRequest, ScatterTokensRequest,
                               GatherBertMaskRequest, SliceGptMaskRequest, SegmentSeqlensRequest,
                               SampleTokensRequest, TopKTokensRequest, MergeTokensRequest,
                               SplitTokensRequest, SamplePackedTokensRequest>;

// The operator's API name ("SortTokens", ...), also the `op` metric label.
absl::string_view OpName(const OpRequest& op);

// Every operator's name, in OpRequest order.
std::vector<absl::string_view> AllOpNames();

// An upper estimate of an op's work in elements, from metadata alone
// (negative dims count 0; saturating at UINT64_MAX): what the op reads and
// writes element by element. Each op states its formula in its home
// (ops/<op>.h): copies count the elements they copy, not the whole inputs
// they copy from; ops with per-row bitmaps count rows * (S / 64 + 1); the
// others the sum of their tensors' shapes. Every operator runs in O(work), so
// bounding it bounds the time and scratch of one request, even with
// zero-strided views whose shapes are huge and whose bytes are few. The
// heaviest ops per element (SampleTokens, TopKTokens: about 10 ns per element
// on one core here) set the default bound: docs/server.md, --max_op_elements.
uint64_t EstimateOpWork(const OpRequest& op);

struct OpResult {
  std::vector<InlineOutput> outputs;
  uint64_t bytes_moved = 0;  // bytes read + written by the op (for metrics)
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_REQUEST_H_
