// `tokensel demo`'s packed Random-LTD layer (demo_model.h): on the THD
// batch's q_cu_seqlens (just computed by SegmentSeqlens and checked),
// SamplePackedTokens with the fused gather, a stand-in layer on the kept
// tokens, ScatterTokens back; every round trip checked against kernels::cpu
// on the oracle copy.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/cli/demo_model.h"
#include "common/status_macros.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"

namespace tokensel::cli {

using demo_internal::AddOne;
using demo_internal::Ref;
using kernels::DType;

absl::Status DemoWorker::PackedLayer(uint64_t step) {
  const int64_t total = shapes_.thd_batch * shapes_.thd_tokens;  // T (with padding)
  const int64_t n = shapes_.thd_batch * shapes_.thd_segments;    // N sequences
  const int64_t c = shapes_.thd_channels;
  const std::string where = absl::StrCat("thd step ", step, " packed layer");

  kernels::SamplePackedTokensArgs args;  // the oracle's
  args.cu_seqlens = View(true, "q_cu_seqlens", DType::kInt32, {n + 1});
  args.total_tokens = total;
  args.keep_num = 1;
  args.keep_den = 2;
  args.min_tokens = 1;
  args.layers = 1;
  args.seed = seed_ + 1000003;
  args.step = step;
  // T' sizes the outputs: from the oracle's cu_seqlens (the arena's equals
  // it: SegmentSeqlens was just checked).
  int32_t* cu = reinterpret_cast<int32_t*>(oracle_.data() + Offset("q_cu_seqlens"));
  RETURN_IF_ERROR(kernels::CheckPackedCuSeqlens(cu, n + 1, total));
  const int64_t kept = kernels::PackedKeptTokens(cu, n + 1, args);

  // Layer in: sample and gather the kept rows, one round trip.
  v1::ExecuteRequest in;
  auto* sample = in.add_ops()->mutable_sample_packed_tokens();
  *sample->mutable_cu_seqlens() = Ref(Offset("q_cu_seqlens"), DType::kInt32, {n + 1});
  sample->set_total_tokens(total);
  sample->set_kept_tokens(kept);
  sample->set_keep_num(args.keep_num);
  sample->set_keep_den(args.keep_den);
  sample->set_min_tokens(args.min_tokens);
  sample->set_layers(1);
  sample->set_seed(args.seed);
  sample->set_step(step);
  *sample->mutable_activations() = Ref(Offset("thd_act"), DType::kFloat16, {total, c});
  *sample->mutable_cu_seqlens_kept() = Ref(Offset("thd_cu_kept"), DType::kInt32, {n + 1});
  *sample->mutable_ids() = Ref(Offset("thd_ids"), DType::kInt32, {1, kept});
  *sample->mutable_positions() = Ref(Offset("thd_positions"), DType::kInt32, {1, kept});
  *sample->mutable_out() = Ref(Offset("thd_kept"), DType::kFloat16, {kept, c});
  RETURN_IF_ERROR(Execute("thd layer in: SamplePacked+Gather", in));

  args.cu_seqlens_kept = View(true, "thd_cu_kept", DType::kInt32, {n + 1});
  args.ids = View(true, "thd_ids", DType::kInt32, {1, kept});
  args.positions = View(true, "thd_positions", DType::kInt32, {1, kept});
  args.activations = View(true, "thd_act", DType::kFloat16, {total, c});
  args.out = View(true, "thd_kept", DType::kFloat16, {kept, c});
  RETURN_IF_ERROR(kernels::cpu::SamplePackedTokens(args, nullptr));
  RETURN_IF_ERROR(Check(absl::StrCat(where, " sample+gather (T'=", kept, ")")));

  AddOne(View(false, "thd_kept", DType::kFloat16, {kept, c}));
  AddOne(View(true, "thd_kept", DType::kFloat16, {kept, c}));

  // Layer out: the pack is one row of ScatterTokens.
  v1::ExecuteRequest out;
  auto* scatter = out.add_ops()->mutable_scatter_tokens();
  *scatter->mutable_all() = Ref(Offset("thd_act"), DType::kFloat16, {1, total, c});
  *scatter->mutable_layer() = Ref(Offset("thd_kept"), DType::kFloat16, {1, kept, c});
  *scatter->mutable_indices() = Ref(Offset("thd_ids"), DType::kInt32, {1, kept});
  scatter->set_batch_first(true);
  RETURN_IF_ERROR(Execute("thd layer out: Scatter", out));
  RETURN_IF_ERROR(
      kernels::cpu::ScatterTokens({View(true, "thd_act", DType::kFloat16, {1, total, c}),
                                   View(true, "thd_kept", DType::kFloat16, {1, kept, c}),
                                   View(true, "thd_ids", DType::kInt32, {1, kept}), true},
                                  nullptr));
  return Check(absl::StrCat(where, " scatter"));
}

}  // namespace tokensel::cli
