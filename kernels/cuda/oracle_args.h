// The args the <Op>Finish of the index ops hands the CPU oracle on the
// invalid-data path (status.cuh, FinishWithCpuOracle): the indices (ids)
// replaced by their snapshot in the workspace, and the payload views shrunk
// to what the CPU op's validation still accepts. Host code without CUDA
// includes, so host tests check that the CPU op gives the same message on
// these args as on the full ones (tests/kernels/cuda/oracle_args_test.cc).
//
// Why shrink: FinishWithCpuOracle gives every view a host buffer of its
// extent. For the payload (activations, all, mask, out, inverse) that is as
// large as the client's buffers, allocated on a path any client can take by
// sending one bad index, and counted by no memory budget. The CPU ops check
// every index before they touch the payload, and their messages depend on
// the indices and the index limit only, so the payload can go:
//   GatherTokens, ScatterTokens, MergeTokens, SplitTokens: C = 0 (empty
//     payload views);
//   GatherBertMask: the mask becomes one broadcast element of [B,1,1,S], out
//     a compact [L,B,1,R,R] (H >= 1 is required, R is tied to the indices);
//   SortTokens: no inverse.
// `snapshot` is the snapshot section (SnapshotView's data), device memory
// until FinishWithCpuOracle copies it; the payload views keep their device
// data pointers, which FinishWithCpuOracle replaces with host buffers.
#ifndef TOKENSEL_KERNELS_CUDA_ORACLE_ARGS_H_
#define TOKENSEL_KERNELS_CUDA_ORACLE_ARGS_H_

#include "kernels/ops.h"

namespace tokensel::kernels::cuda {

GatherTokensArgs GatherTokensOracleArgs(const GatherTokensArgs& args, void* snapshot);
ScatterTokensArgs ScatterTokensOracleArgs(const ScatterTokensArgs& args, void* snapshot);
GatherBertMaskArgs GatherBertMaskOracleArgs(const GatherBertMaskArgs& args, void* snapshot);
SortTokensArgs SortTokensOracleArgs(const SortTokensArgs& args, void* snapshot);
MergeTokensArgs MergeTokensOracleArgs(const MergeTokensArgs& args, void* snapshot);
SplitTokensArgs SplitTokensOracleArgs(const SplitTokensArgs& args, void* snapshot);

}  // namespace tokensel::kernels::cuda

#endif  // TOKENSEL_KERNELS_CUDA_ORACLE_ARGS_H_
