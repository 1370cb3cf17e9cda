// The requests `tokensel bench` sends: per worker, one prebuilt request per
// op of the mix, by reference into the worker's own registered shm region
// or with every tensor inline (outputs then come back inline).
//
// Shapes (BenchShapes): gather/scatter act [B,S,C] dtype, indices [B,R];
// sort ids [L,B,R] int32 (out separate, so every call sorts unsorted rows);
// seqlens segment ids [B,S] with NS segments, causal, packed; topk float32
// scores [B,S] -> [B,R]; sample [L,B,R] from S; packed: SamplePackedTokens
// on a pack of T = B*S tokens in B*NS sequences of random lengths, keep
// R/S, with the fused gather of the kept rows of [T,C] dtype into [T',C]
// (and cu_seqlens_kept, ids, positions); ping: the null RPC.
//
// bytes(): the tensor bytes one call reads plus writes (what bytes/s counts).
#ifndef TOKENSEL_CLIENT_CLI_BENCH_WORKLOAD_H_
#define TOKENSEL_CLIENT_CLI_BENCH_WORKLOAD_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"
#include "tokensel/client/client.h"
#include "tokensel/client/session.h"
#include "tokensel/client/shared_region.h"
#include "tokensel/v1/tokensel.pb.h"

namespace tokensel::cli {

enum class BenchOp {
  kPing,
  kGather,
  kScatter,
  kSort,
  kSeqlens,
  kTopK,
  kSample,
  kMerge,
  kSplit,
  kPacked
};
inline constexpr int kNumBenchOps = 10;

absl::string_view BenchOpName(BenchOp op);
absl::StatusOr<BenchOp> ParseBenchOp(absl::string_view name);

// "gather:3,sort:1" (weights >= 1; a bare name weighs 1) -> the op sequence
// each worker cycles through, interleaved smoothly
// (gather,gather,sort,gather for 3:1).
absl::StatusOr<std::vector<BenchOp>> ParseMix(absl::string_view mix);

struct BenchShapes {
  int64_t batch = 8;
  int64_t seq = 512;       // S (and T of seqlens)
  int64_t retained = 256;  // R
  int64_t channels = 768;  // C
  int64_t layers = 1;      // L
  int64_t segments = 16;   // NS
  kernels::DType dtype = kernels::DType::kFloat16;
};

class Workload {
 public:
  // Builds the requests of `ops` (duplicates allowed) for worker `worker`.
  // By reference: creates a sealed memfd region and registers it as buffer
  // "bench-w<worker>" in `session`.
  static absl::StatusOr<std::unique_ptr<Workload>> Create(const std::vector<BenchOp>& ops,
                                                          const BenchShapes& shapes, int worker,
                                                          uint64_t seed, bool by_reference,
                                                          client::Session* session);

  // One call of `op` through `client` (session-bound). Checks that inline
  // outputs came back when expected (INTERNAL otherwise).
  absl::Status Run(BenchOp op, const client::Client& client) const;
  int64_t bytes(BenchOp op) const { return bytes_[static_cast<int>(op)]; }

 private:
  Workload() = default;

  std::optional<client::SharedRegion> region_;
  bool by_reference_ = false;
  v1::GatherTokensRequest gather_;
  v1::ScatterTokensRequest scatter_;
  v1::SortTokensRequest sort_;
  v1::SegmentSeqlensRequest seqlens_;
  v1::TopKTokensRequest topk_;
  v1::SampleTokensRequest sample_;
  v1::MergeTokensRequest merge_;
  v1::SplitTokensRequest split_;
  v1::SamplePackedTokensRequest packed_;
  int64_t bytes_[kNumBenchOps] = {};
};

}  // namespace tokensel::cli

#endif  // TOKENSEL_CLIENT_CLI_BENCH_WORKLOAD_H_
