// The transport-free request model: what a client asked for, before any
// buffer is resolved. server/grpc converts tokensel.v1 messages into these;
// the Executor resolves them into kernels::TensorViews and runs them.
#ifndef TOKENSEL_SERVER_CORE_REQUEST_H_
#define TOKENSEL_SERVER_CORE_REQUEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/string_view.h"
#include "kernels/dtype.h"
#include "kernels/ops.h"

namespace tokensel::core {

// A tensor named in a request (mirror of tokensel.v1.Tensor).
struct TensorSpec {
  enum class Source : uint8_t {
    kNone,    // outputs only: return the result inline
    kBuffer,  // a registered buffer, zero-copy
    kInline,  // bytes carried by the request (row-major)
  };
  Source source = Source::kNone;
  std::optional<kernels::DType> dtype;  // absent = DTYPE_UNSPECIFIED
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements; empty = row-major
  std::string buffer;            // kBuffer
  uint64_t byte_offset = 0;      // kBuffer
  // kInline: points into the transport message, valid for the whole call.
  absl::string_view inline_data;
};

struct SortTokensRequest {
  TensorSpec ids;
  int64_t original_tokens = 0;
  std::optional<TensorSpec> out;
  std::optional<TensorSpec> inverse;
};

struct GatherTokensRequest {
  TensorSpec activations;
  TensorSpec indices;
  std::optional<TensorSpec> out;
  bool batch_first = true;
};

struct ScatterTokensRequest {
  TensorSpec all;
  TensorSpec layer;
  TensorSpec indices;
  bool batch_first = true;
};

struct GatherBertMaskRequest {
  TensorSpec mask;
  TensorSpec indices;
  std::optional<TensorSpec> out;
};

struct SliceGptMaskRequest {
  TensorSpec mask;
  int64_t retained_tokens = 0;
  std::optional<TensorSpec> out;
};

struct SegmentSeqlensRequest {
  TensorSpec segment_ids_q;
  std::optional<TensorSpec> segment_pos_q;
  std::optional<TensorSpec> segment_ids_kv;
  std::optional<TensorSpec> segment_pos_kv;
  int64_t max_segments = 0;
  kernels::AttnMaskType mask = kernels::AttnMaskType::kPadding;
  bool packed = false;
  // Outputs; absent = inline. kv_* only with segment_ids_kv; *_packed_*,
  // *_cu_seqlens only with `packed`.
  std::optional<TensorSpec> q_seqlen, q_offset, kv_seqlen, kv_offset;
  std::optional<TensorSpec> q_packed_seqlens, q_packed_offsets, q_cu_seqlens;
  std::optional<TensorSpec> kv_packed_seqlens, kv_packed_offsets, kv_cu_seqlens;
};

struct SampleTokensRequest {
  int64_t layers = 0;
  int64_t batch = 0;
  int64_t original_tokens = 0;
  int64_t retained_tokens = 0;
  uint64_t seed = 0;
  uint64_t step = 0;
  std::optional<TensorSpec> ids;  // absent = inline int32
  std::optional<TensorSpec> inverse;
  std::optional<TensorSpec> mask;
  std::optional<TensorSpec> bert_mask;
  std::optional<TensorSpec> gpt_mask;
};

struct TopKTokensRequest {
  TensorSpec scores;
  int64_t retained_tokens = 0;
  std::optional<TensorSpec> ids;  // absent = inline int32
};

using OpRequest =
    std::variant<SortTokensRequest, GatherTokensRequest, ScatterTokensRequest,
                 GatherBertMaskRequest, SliceGptMaskRequest, SegmentSeqlensRequest,
                 SampleTokensRequest, TopKTokensRequest>;

// The operator's API name ("SortTokens", ...), also the `op` metric label.
absl::string_view OpName(const OpRequest& op);

// An upper estimate of an op's work in elements, from metadata alone
// (negative dims count 0; saturating at UINT64_MAX): what the op reads and
// writes element by element. Copies count the elements they copy, not the
// whole inputs they copy from (GatherTokens B*R*C + indices, ScatterTokens
// layer + indices, GatherBertMask L*B*H*R*R + indices, SliceGptMask B*H*R*R);
// SampleTokens counts L * B * max(S, 1) (its cost is per position whatever R
// is); SegmentSeqlens B * sides * (NS + 1) (its staging and outputs, given or
// inline) on top of its tensors; SortTokens and ScatterTokens rows * (S / 64
// + 1) (the CUDA kernels' per-row bitmaps of S bits; on the CPU such rows are
// checked by sorting when S dwarfs R); the others the sum of their tensors'
// shapes. Every operator runs in O(work), so bounding it bounds the time and
// scratch of one request, even with zero-strided views whose shapes are huge
// and whose bytes are few. The heaviest ops per element (SampleTokens,
// TopKTokens: about 10 ns per element on one core here) set the default
// bound: docs/server.md, --max_op_elements.
uint64_t EstimateOpWork(const OpRequest& op);

// An output returned inline: row-major bytes.
struct InlineOutput {
  std::string name;  // the request field it answers: "out", "inverse", "q_seqlen", ...
  kernels::DType dtype = kernels::DType::kInt32;
  std::vector<int64_t> shape;
  std::string data;
};

struct OpResult {
  std::vector<InlineOutput> outputs;
  uint64_t bytes_moved = 0;  // bytes read + written by the op (for metrics)
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_REQUEST_H_
