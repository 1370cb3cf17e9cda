// Operator arguments shared by the CPU (kernels/cpu) and CUDA (kernels/cuda)
// implementations, and the metadata validation every implementation runs
// first. The full contracts, with test vectors, are in docs/ops.md (copied from
// the project spec); this header states what a caller must know.
//
// Conventions for every op:
//  - Views may be strided in every dimension (strides >= 0, in elements) and
//    need no particular alignment. Inputs may broadcast (stride 0); outputs
//    must not overlap themselves or any input (INVALID_ARGUMENT).
//  - Validate<Op>() checks ranks, dims, dtypes, strides, extents and overlap
//    without reading tensor data. The implementations then check the data
//    (index ranges, duplicates, segment structure) before writing anything:
//    on any error nothing has been written. The one exception is a stop
//    (CANCELLED / DEADLINE_EXCEEDED from the caller's stop token, see
//    kernels/cpu/stop.h): a stopped op may have written part of its outputs
//    (never after a partial validation).
//  - Inputs may be memory a client keeps rewriting during the call: every
//    value that decides an address or a size is read once into private
//    memory (or checked where it is used), so such a client gets
//    INVALID_ARGUMENT or garbage in its own outputs, never an access outside
//    the views.
//  - Errors are INVALID_ARGUMENT with a message naming the field, the
//    multi-index of the first offending element (lowest row, then lowest
//    position) and its value, identical for every implementation.
#ifndef TOKENSEL_KERNELS_OPS_H_
#define TOKENSEL_KERNELS_OPS_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "kernels/tensor_view.h"

namespace tokensel::kernels {

// 1. SortTokens (DeepSpeed token_sort_). Comparison-free counting sort.
//   ids:      int32|int64 [..., R], R >= 1; rows = all leading dims. Each row
//             must hold R unique ids in [0, original_tokens).
//   out:      optional, same shape and dtype as ids; absent = sort in place.
//   inverse:  optional int32 [..., S]: inverse[row, s] = rank of s in the
//             sorted row, or -1 when s is absent.
struct SortTokensArgs {
  TensorView ids;
  int64_t original_tokens = 0;  // S, 1 <= R <= S <= INT32_MAX
  std::optional<TensorView> out;
  std::optional<TensorView> inverse;
};
absl::Status ValidateSortTokens(const SortTokensArgs& args);

// 2. GatherTokens (DeepSpeed token_gather).
//   activations: any dtype, [B,S,C] (batch_first) or [S,B,C].
//   indices:     int32|int64 [B,R], each in [0, S); need not be sorted/unique.
//   out:         same dtype, [B,R,C] (batch_first) or [R,B,C].
//   batch_first: out[b,r,:] = act[b,idx[b,r],:]; else out[r,b,:] = act[idx[b,r],b,:].
struct GatherTokensArgs {
  TensorView activations;
  TensorView indices;
  TensorView out;
  bool batch_first = true;
};
absl::Status ValidateGatherTokens(const GatherTokensArgs& args);

// 3. ScatterTokens (DeepSpeed token_scatter_), in place on `all`.
//   all:     [B,S,C] / [S,B,C], written.
//   layer:   same dtype as all, [B,R,C] / [R,B,C].
//   indices: int32|int64 [B,R], in [0, S) and unique within each row.
//   batch_first: all[b,idx[b,r],:] = layer[b,r,:]; else all[idx[b,r],b,:] = layer[r,b,:].
struct ScatterTokensArgs {
  TensorView all;
  TensorView layer;
  TensorView indices;
  bool batch_first = true;
};
absl::Status ValidateScatterTokens(const ScatterTokensArgs& args);

// 4. GatherBertMask (DeepSpeed mask_gather_bert, with the layer offset fixed).
//   mask:    any dtype, [B,H,Sq,S], H >= 1, Sq in {1, S}.
//   indices: int32|int64 [L,B,R], in [0, S).
//   out:     same dtype as mask, [L,B,H,R,R]:
//            out[l,b,h,i,j] = mask[b, h, Sq==1 ? 0 : idx[l,b,i], idx[l,b,j]].
struct GatherBertMaskArgs {
  TensorView mask;
  TensorView indices;
  TensorView out;
};
absl::Status ValidateGatherBertMask(const GatherBertMaskArgs& args);

// 5. SliceGptMask (DeepSpeed mask_gather_gpt): the top-left R x R corner.
//   mask: any dtype, [B,H,S,S];  out: same dtype, [B,H,R,R] with R <= S (R from out).
struct SliceGptMaskArgs {
  TensorView mask;
  TensorView out;
};
absl::Status ValidateSliceGptMask(const SliceGptMaskArgs& args);

// 6. SegmentSeqlens (Transformer Engine THD seqlens/offsets), O(T) per row.
enum class AttnMaskType : uint8_t { kPadding = 0, kCausal, kCausalBottomRight };

// The layout varlen attention kernels want, for one side (all int32):
//   seqlens    [B*NS]:   non-zero seqlens of all rows compacted, fill 0;
//   offsets    [B*(NS+1)]: offsets + b*T compacted, fill B*T;
//   cu_seqlens [B*NS+1]: [0, cumsum(seqlens)].
struct PackedSeqlens {
  TensorView seqlens;
  TensorView offsets;
  TensorView cu_seqlens;
};

// Per side outputs (int32): seqlen [B,NS] indexed by segment id (slot j = id
// j+1, fill 0) and offset [B,NS+1] in order of appearance (fill -1); packed
// optional.
struct SegmentSeqlensSide {
  TensorView seqlen;
  TensorView offset;
  std::optional<PackedSeqlens> packed;
};

//   segment_ids_q  int32|int64 [B,Tq]; ids in [0, NS], 0 = padding, each id one
//                  contiguous run, ids strictly increasing along a row.
//   segment_pos_q  int32|int64 [B,Tq], >= 0 on non-padding tokens. Required
//                  for cross-attention with CAUSAL / CAUSAL_BOTTOM_RIGHT;
//                  ignored for self-attention (every mask keeps every token).
//   segment_ids_kv / segment_pos_kv: [B,Tkv]; absent = self-attention.
//   q, kv: outputs. kv outputs are required iff segment_ids_kv is given.
struct SegmentSeqlensArgs {
  TensorView segment_ids_q;
  std::optional<TensorView> segment_pos_q;
  std::optional<TensorView> segment_ids_kv;
  std::optional<TensorView> segment_pos_kv;
  int64_t max_segments = 0;  // NS in [1, INT32_MAX - 1]
  AttnMaskType mask = AttnMaskType::kPadding;
  SegmentSeqlensSide q;
  std::optional<SegmentSeqlensSide> kv;
};
absl::Status ValidateSegmentSeqlens(const SegmentSeqlensArgs& args);
// The bound on max_segments alone (part of ValidateSegmentSeqlens; the server
// checks it before deriving output shapes from it).
absl::Status ValidateMaxSegments(int64_t max_segments);

// 7. SampleTokens: per row (l, b) a uniform random R-subset of [0, S), in
// ascending order; a pure function of (seed, step, l, b) via Philox4x32-10
// (kernels/philox.h), identical on every backend and thread count.
//   ids:     int32|int64 [L,B,R], 0 <= R <= S.
//   inverse: optional int32 [L,B,S] (as in SortTokens).
//   Optionally a mask per layer: bert_mask gathers (GatherBertMask with these
//   ids), gpt_mask slices (SliceGptMask with this R); both need `mask`.
struct SampleTokensArgs {
  int64_t layers = 0;           // L
  int64_t batch = 0;            // B
  int64_t original_tokens = 0;  // S <= INT32_MAX
  int64_t retained_tokens = 0;  // R
  uint64_t seed = 0;
  uint64_t step = 0;  // < 2^32
  TensorView ids;
  std::optional<TensorView> inverse;
  std::optional<TensorView> mask;       // [B,H,Sq,S] (bert) or [B,H,S,S] (gpt)
  std::optional<TensorView> bert_mask;  // [L,B,H,R,R]
  std::optional<TensorView> gpt_mask;   // [B,H,R,R]
};
absl::Status ValidateSampleTokens(const SampleTokensArgs& args);

// 8. TopKTokens: the R highest-scoring positions of each row, in ascending
// position order. Ties go to the lower position; NaN ranks lowest; -0 == +0.
//   scores: fp32|fp16|bf16 [..., S];  ids: int32|int64 [..., R], 0 <= R <= S.
struct TopKTokensArgs {
  TensorView scores;
  TensorView ids;
};
absl::Status ValidateTopKTokens(const TopKTokensArgs& args);

// 9. MergeTokens (Random-LTD's scatter without the clone).
//   x:       [B,S,C] / [S,B,C], the layer's input (every token).
//   layer:   same dtype, [B,R,C] / [R,B,C], the retained tokens after the layer.
//   indices: int32|int64 [B,R], in [0, S) and unique within each row.
//   out:     same dtype and shape as x: out[b,s,:] = layer[b,r,:] where
//            indices[b,r] == s, else x[b,s,:]; every row written once.
//            `out` may be `x` itself (the same view: then the op is
//            ScatterTokens on x); otherwise it overlaps neither x nor layer.
struct MergeTokensArgs {
  TensorView x;
  TensorView layer;
  TensorView indices;
  TensorView out;
  bool batch_first = true;
};
absl::Status ValidateMergeTokens(const MergeTokensArgs& args);

// 10. SplitTokens (MergeTokens' adjoint: the backward of the Random-LTD pair).
//   grad:       [B,S,C] / [S,B,C].
//   indices:    int32|int64 [B,R], in [0, S) and unique within each row.
//   layer_grad: same dtype, [B,R,C] / [R,B,C] = GatherTokens(grad, indices).
//   rest_grad:  same dtype and shape as grad: grad with the rows named by
//               indices set to all-zero bytes (+0.0), every other row copied.
//               May be `grad` itself (the same view: rows zeroed in place,
//               after layer_grad read them); otherwise disjoint from grad.
//   layer_grad overlaps neither grad nor rest_grad.
struct SplitTokensArgs {
  TensorView grad;
  TensorView indices;
  TensorView layer_grad;
  TensorView rest_grad;
  bool batch_first = true;
};
absl::Status ValidateSplitTokens(const SplitTokensArgs& args);

// 11. SamplePackedTokens (Random-LTD for packed THD batches, fused).
//   cu_seqlens: int32 [N+1], N >= 0: sequence i is tokens [cu[i], cu[i+1])
//               of a packed batch of total_tokens (T) tokens; valid data has
//               cu[0] == 0, cu non-decreasing, cu[N] <= T (checked on a
//               private snapshot: errors name the first bad i and values).
//   Per sequence n_i = cu[i+1] - cu[i] and
//     r_i = min(n_i, max(min_tokens, ceil(n_i * keep_num / keep_den)))
//   (PackedKeep, kernels/sample_math.h); T' = sum of r_i.
//   cu_seqlens_kept: int32 [N+1], the prefix sums of r_i.
//   ids:       int32 [L,T']: in layer l, entries [cu_kept[i], cu_kept[i+1])
//              are SampleTokens' row (l, b = i) of (S = n_i, R = r_i), plus
//              cu[i]: a uniform random r_i-subset, ascending, a pure function
//              of (seed, step, l, i, n_i, r_i). A dim 1 other than T' is
//              INVALID_ARGUMENT once the data is read (PackedKeptTokens
//              computes T' for a caller that sizes outputs).
//   positions: optional int32 [L,T']: ids - cu[i] (for RoPE).
//   inverse:   optional int32 [L,T]: the rank in [0,T') of a kept token, -1
//              for a dropped one and for every token at or past cu[N].
//   activations: optional [T,C], any dtype and strides; out: optional [T',C]
//              of the same dtype, the kept tokens (rows ids[0]); needs
//              activations and L == 1.
//   Outputs overlap neither one another nor the inputs.
struct SamplePackedTokensArgs {
  TensorView cu_seqlens;
  int64_t total_tokens = 0;  // T <= INT32_MAX (activations' dim 0 when given)
  int64_t keep_num = 0;      // 0 <= keep_num <= keep_den
  int64_t keep_den = 1;      // >= 1
  int64_t min_tokens = 0;    // >= 0
  int64_t layers = 0;        // L < 2^32
  uint64_t seed = 0;
  uint64_t step = 0;  // < 2^32
  TensorView cu_seqlens_kept;
  TensorView ids;
  std::optional<TensorView> positions;
  std::optional<TensorView> inverse;
  std::optional<TensorView> activations;
  std::optional<TensorView> out;
};
// Metadata only (the dims that depend on T' are checked with the data).
absl::Status ValidateSamplePackedTokens(const SamplePackedTokensArgs& args);
// Its checks of the scalars alone (T, L, step, the keep rule; the first
// checks ValidateSamplePackedTokens makes), for callers that size outputs
// from cu_seqlens before any view exists.
absl::Status ValidateSamplePackedScalars(const SamplePackedTokensArgs& args);
// The data check of cu_seqlens (a private copy, `n_plus_1` values) against T:
// the first bad i with its values.
absl::Status CheckPackedCuSeqlens(const int32_t* cu, int64_t n_plus_1, int64_t total_tokens);
// Its three messages, from the values alone (the CUDA twin records them on
// the device and formats them here): cu[0] != 0; the first i with
// cu[i + 1] < cu[i]; (cu non-decreasing) the first i with cu[i + 1] > T.
absl::Status PackedCuStartError(int64_t cu0);
absl::Status PackedCuDecreasingError(int64_t i, int64_t cu_i, int64_t cu_next);
absl::Status PackedCuPastEndError(int64_t i, int64_t cu_next, int64_t total_tokens);
// T' of valid cu_seqlens data (the caller checked it with
// CheckPackedCuSeqlens) under the args' keep rule.
int64_t PackedKeptTokens(const int32_t* cu, int64_t n_plus_1, const SamplePackedTokensArgs& args);
// The dims that depend on T' (ids, positions, out): INVALID_ARGUMENT naming
// the tensor, its dim and T'.
absl::Status CheckPackedKeptDims(const SamplePackedTokensArgs& args, int64_t kept_tokens);

// True when `a` and `b` are the same view (data, dtype, shape, and strides
// of every dim of size > 1: the same element addresses): the
// in-place forms of SortTokens (out = ids), MergeTokens (out = x) and
// SplitTokens (rest_grad = grad).
bool SameView(const TensorView& a, const TensorView& b);

// Validate<Op> by argument type, for code generic over the ops.
inline absl::Status Validate(const SortTokensArgs& a) { return ValidateSortTokens(a); }
inline absl::Status Validate(const GatherTokensArgs& a) { return ValidateGatherTokens(a); }
inline absl::Status Validate(const ScatterTokensArgs& a) { return ValidateScatterTokens(a); }
inline absl::Status Validate(const GatherBertMaskArgs& a) { return ValidateGatherBertMask(a); }
inline absl::Status Validate(const SliceGptMaskArgs& a) { return ValidateSliceGptMask(a); }
inline absl::Status Validate(const SegmentSeqlensArgs& a) { return ValidateSegmentSeqlens(a); }
inline absl::Status Validate(const SampleTokensArgs& a) { return ValidateSampleTokens(a); }
inline absl::Status Validate(const TopKTokensArgs& a) { return ValidateTopKTokens(a); }
inline absl::Status Validate(const MergeTokensArgs& a) { return ValidateMergeTokens(a); }
inline absl::Status Validate(const SplitTokensArgs& a) { return ValidateSplitTokens(a); }
inline absl::Status Validate(const SamplePackedTokensArgs& a) {
  return ValidateSamplePackedTokens(a);
}

}  // namespace tokensel::kernels

#endif  // TOKENSEL_KERNELS_OPS_H_
