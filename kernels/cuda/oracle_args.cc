// The CPU oracle's args of the index ops (contracts: oracle_args.h).
#include "kernels/cuda/oracle_args.h"

#include <cstdint>

#include "kernels/cuda/workspace_layout.h"

namespace tokensel::kernels::cuda {

GatherTokensArgs GatherTokensOracleArgs(const GatherTokensArgs& args, void* snapshot) {
  GatherTokensArgs host = args;
  host.indices = SnapshotView(args.indices, snapshot);
  host.activations.shape[2] = 0;
  host.out.shape[2] = 0;
  return host;
}

ScatterTokensArgs ScatterTokensOracleArgs(const ScatterTokensArgs& args, void* snapshot) {
  ScatterTokensArgs host = args;
  host.indices = SnapshotView(args.indices, snapshot);
  host.all.shape[2] = 0;
  host.layer.shape[2] = 0;
  return host;
}

MergeTokensArgs MergeTokensOracleArgs(const MergeTokensArgs& args, void* snapshot) {
  MergeTokensArgs host = args;
  host.indices = SnapshotView(args.indices, snapshot);
  host.x.shape[2] = 0;
  host.layer.shape[2] = 0;
  host.out.shape[2] = 0;
  return host;
}

SplitTokensArgs SplitTokensOracleArgs(const SplitTokensArgs& args, void* snapshot) {
  SplitTokensArgs host = args;
  host.indices = SnapshotView(args.indices, snapshot);
  host.grad.shape[2] = 0;
  host.layer_grad.shape[2] = 0;
  host.rest_grad.shape[2] = 0;
  return host;
}

GatherBertMaskArgs GatherBertMaskOracleArgs(const GatherBertMaskArgs& args, void* snapshot) {
  GatherBertMaskArgs host = args;
  host.indices = SnapshotView(args.indices, snapshot);
  const int64_t mask_shape[4] = {args.mask.shape[0], 1, 1, args.mask.shape[3]};
  const int64_t zero_strides[4] = {0, 0, 0, 0};
  host.mask = TensorView::Strided(args.mask.data, args.mask.dtype, mask_shape, zero_strides);
  const int64_t out_shape[5] = {args.out.shape[0], args.out.shape[1], 1, args.out.shape[3],
                                args.out.shape[4]};
  host.out = TensorView::Contiguous(args.out.data, args.out.dtype, out_shape);
  return host;
}

SortTokensArgs SortTokensOracleArgs(const SortTokensArgs& args, void* snapshot) {
  SortTokensArgs host = args;
  host.ids = SnapshotView(args.ids, snapshot);
  host.inverse.reset();
  return host;
}

}  // namespace tokensel::kernels::cuda
