// The training worker `tokensel demo` plays: Random-LTD layer steps of a
// BERT-style (encoder, bert_mask) and a GPT-style (decoder, gpt_mask) model,
// and a packed THD batch, all on one registered shared-memory arena; every
// result is checked against the CPU oracle (kernels::cpu on a copy).
//
// Per layer l of a model step (one step = all layers, step number = the
// SampleTokens step):
//   Execute #1 "layer in":  SampleTokens(L=1, B, S, R_l, seed + l, step,
//                           mask -> bert_mask | gpt_mask) + GatherTokens
//   stand-in layer:         the demo adds 1.0 (fp16) to every gathered
//                           element in shm (and in the oracle copy)
//   Execute #2 "layer out": ScatterTokens back into the activations
// Retention schedule: R_l = S - l * (S/2) / (L-1) rounded to the nearest
// multiple of 16 (clamped to [16, S]): 100% of the tokens at layer 0, 50% at
// the last (S=512, L=12: 512 496 464 448 416 400 368 352 320 304 272 256).
// THD: SegmentSeqlens (causal, packed) of B=4 rows of T=4096 tokens with
// 1..64 random segments and trailing padding; then a packed Random-LTD
// layer on a [B*T, 128] fp16 hidden state laid out by its q_cu_seqlens
// (demo_packed.cc):
//   Execute #1 "thd layer in":  SamplePackedTokens(keep 1/2, min 1 token,
//                               cu_seqlens = q_cu_seqlens) with the fused
//                               gather of the kept rows
//   stand-in layer:             +1.0 on every kept element
//   Execute #2 "thd layer out": ScatterTokens of the kept rows back
//
// After every round trip the whole arena is compared with the oracle's; a
// difference is INTERNAL naming the tensor and the first differing byte.
#ifndef TOKENSEL_CLIENT_CLI_DEMO_MODEL_H_
#define TOKENSEL_CLIENT_CLI_DEMO_MODEL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cli/latency_stats.h"
#include "kernels/tensor_view.h"
#include "tokensel/client/session.h"
#include "tokensel/client/shared_region.h"
#include "tokensel/v1/tokensel.pb.h"

namespace tokensel::cli {

namespace v1 = ::tokensel::v1;

struct DemoShapes {
  int64_t layers = 12;
  int64_t batch = 8;
  int64_t seq = 512;
  int64_t channels = 768;
  int64_t thd_batch = 4;
  int64_t thd_tokens = 4096;
  int64_t thd_segments = 64;
  int64_t thd_channels = 128;  // the packed layer's hidden size
};

// R_l of the schedule above.
int64_t RetainedTokens(int64_t layer, int64_t layers, int64_t seq);

class DemoWorker {
 public:
  // Maps the arena (a sealed memfd), fills activations and masks and
  // registers it as buffer "demo-arena" in `session`; later calls go
  // through session->client().
  static absl::StatusOr<std::unique_ptr<DemoWorker>> Create(client::Session* session,
                                                            const DemoShapes& shapes,
                                                            uint64_t seed);

  // One step of every layer; `gpt` picks the decoder flavour.
  absl::Status ModelStep(bool gpt, uint64_t step);
  // SegmentSeqlens, then PackedLayer(step) on its cu_seqlens.
  absl::Status ThdBatch(uint64_t step);

  // Round-trip latencies (us) by row name, in first-use order.
  const std::vector<std::pair<std::string, LatencyStats>>& latencies() const { return latencies_; }
  int64_t checks() const { return checks_; }

 private:
  struct Slot {
    std::string name;
    uint64_t offset;
    uint64_t bytes;
  };
  DemoWorker(client::SharedRegion region, std::vector<Slot> slots, DemoShapes shapes,
             uint64_t seed);
  kernels::TensorView View(bool oracle, const std::string& slot, kernels::DType dtype,
                           std::initializer_list<int64_t> shape) const;
  uint64_t Offset(const std::string& slot) const;
  // Compares the arena with the oracle after round trip `what`.
  absl::Status Check(const std::string& what);
  LatencyStats& Stats(const std::string& name);
  // Runs `request` through Execute, timing it under `row`.
  absl::Status Execute(const std::string& row, const v1::ExecuteRequest& request);
  absl::Status PackedLayer(uint64_t step);  // demo_packed.cc

  client::Session* session_ = nullptr;

  client::SharedRegion region_;
  std::vector<uint8_t> oracle_;
  DemoShapes shapes_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  std::vector<Slot> slots_;
  std::vector<std::pair<std::string, LatencyStats>> latencies_;
  int64_t checks_ = 0;
};

// Shared by demo_model.cc and demo_packed.cc.
namespace demo_internal {
inline constexpr char kBuffer[] = "demo-arena";
// A view of the arena buffer in a request.
v1::Tensor Ref(uint64_t offset, kernels::DType dtype, std::vector<int64_t> shape);
// The stand-in layer: +1.0 on every fp16 element of `rows`.
void AddOne(const kernels::TensorView& rows);
uint16_t FloatToHalf(float f);
}  // namespace demo_internal

}  // namespace tokensel::cli

#endif  // TOKENSEL_CLIENT_CLI_DEMO_MODEL_H_
