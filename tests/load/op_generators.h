// Random operator requests for the load worker, one generator per tokensel
// operator, each with its CPU-oracle result recorded through a CaseBuilder
// (tests/load/case_builder.h). GatherTokens' expected result comes from the
// naive reference of tests/kernels instead (independent of kernels/), so a
// kernel bug shows up as a mismatch rather than as agreement.
//
//   CaseBuilder b(memory, &rng);
//   v1::Op op = BuildOp(OpKind::kGather, b, /*shm_only=*/false);
//   // send `op`; then the region must equal the mirror and b.expected()
//   // lists the inline outputs with their oracle values.
//
// Shapes are random, small to medium (every tensor at most kMaxTensorBytes
// packed), dtypes random among those each op accepts, tensors randomly by
// reference (strided, misaligned) or inline, optional outputs randomly
// present, absent (default inline) or inline. Every generated request is
// valid: if the oracle rejects one, the generator has a bug and the process
// aborts with the oracle's message. One op needs at most kMaxOpFootprint
// bytes of each of the builder's areas (checked).
#ifndef TOKENSEL_TESTS_LOAD_OP_GENERATORS_H_
#define TOKENSEL_TESTS_LOAD_OP_GENERATORS_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "tests/load/case_builder.h"
#include "tokensel/v1/tokensel.pb.h"

namespace tokensel::load {

enum class OpKind {
  kSortTokens,
  kGatherTokens,
  kScatterTokens,
  kGatherBertMask,
  kSliceGptMask,
  kSegmentSeqlensSelf,
  kSegmentSeqlensCross,
  kTopKTokens,
  kSampleTokens,
  kMergeTokens,
  kSplitTokens,
  kSamplePackedTokens,
};
inline constexpr int kNumOpKinds = 12;

inline constexpr int64_t kMaxTensorBytes = 32 << 10;
// A tensor's placement takes at most 2 * packed + 72 bytes (see
// CaseBuilder::Place); an op has at most four tensors near kMaxTensorBytes
// and small ones besides. BuildOp aborts if an op ever needs more.
inline constexpr uint64_t kMaxOpFootprint = 320 << 10;

// "SortTokens", ..., "SegmentSeqlensSelf", "SegmentSeqlensCross", ...
absl::string_view OpKindName(OpKind kind);
// The RPC method (and v1::Op oneof case) that runs `kind`.
absl::string_view OpMethod(OpKind kind);

// One op of `kind`, inputs filled, oracle applied. `shm_only`: every tensor
// by reference (no inline data or outputs).
v1::Op BuildOp(OpKind kind, CaseBuilder& b, bool shm_only);

}  // namespace tokensel::load

#endif  // TOKENSEL_TESTS_LOAD_OP_GENERATORS_H_
