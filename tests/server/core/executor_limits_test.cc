// Executor bounds that protect the server from its clients: every allocation
// reserved in the MemoryBudget before it is made, whole responses sized
// before anything runs, lost (truncated) memory, and cooperative stops.
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>
#include <variant>

#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/stop.h"
#include "tests/server/core/executor_test_util.h"
#include "tests/server/core/forwarding_backend.h"

namespace tokensel::testing {
namespace {

using absl::StatusCode;
using kernels::DType;

// The CPU backend with a scratch size the test chooses and a hook inside
// every Run; counts the runs.
class ScriptedBackend : public ForwardingBackend {
 public:
  uint64_t scratch = 0;
  std::function<void()> during_run;
  std::function<void()> after_run;
  std::atomic<int> runs{0};

  uint64_t OpScratchBytes(core::OpArgs args) const override {
    if (!std::holds_alternative<const kernels::GatherTokensArgs*>(args)) {
      return cpu_.OpScratchBytes(args);
    }
    return scratch;
  }
  absl::Status RunOp(core::OpArgs args) override {
    if (!std::holds_alternative<const kernels::GatherTokensArgs*>(args)) return cpu_.RunOp(args);
    ++runs;
    if (during_run) during_run();
    absl::Status status = cpu_.RunOp(args);
    if (after_run) after_run();
    return status;
  }
};

// A stop token the test fires.
class ManualToken : public kernels::StopToken {
 public:
  std::atomic<bool> fired{false};
  absl::Status Check() const override {
    return fired.load() ? absl::CancelledError("the client cancelled the call") : absl::OkStatus();
  }
};

// The default (synchronous) lease, wrapped to note what the budget still
// counts when the lease ends: its staging must be counted until then (on
// CUDA the lease's blocks return to their pools, after a drain, only there).
class ObservedLease final : public core::RequestLease {
 public:
  ObservedLease(std::unique_ptr<core::RequestLease> inner, std::function<void()> on_end)
      : inner_(std::move(inner)), on_end_(std::move(on_end)) {}
  ~ObservedLease() override {
    inner_.reset();
    on_end_();
  }
  uint64_t StagingCost(uint64_t bytes) const override { return inner_->StagingCost(bytes); }
  absl::StatusOr<Staged> StageInput(const void* src, uint64_t bytes, bool read_back) override {
    ++*inputs;
    return inner_->StageInput(src, bytes, read_back);
  }
  absl::StatusOr<Staged> StageOutput(uint64_t bytes) override {
    ++*outputs;
    return inner_->StageOutput(bytes);
  }
  int* inputs = nullptr;   // StageInput calls
  int* outputs = nullptr;  // StageOutput calls
  absl::Status RunOp(core::OpArgs args) override { return inner_->RunOp(args); }
  absl::Status ReadBack(size_t slot, void* dst, uint64_t bytes) override {
    return inner_->ReadBack(slot, dst, bytes);
  }

 private:
  std::unique_ptr<core::RequestLease> inner_;
  std::function<void()> on_end_;
};

class LeaseObservingBackend : public ScriptedBackend {
 public:
  std::function<void()> on_lease_end = [] {};
  int inputs = 0;
  int outputs = 0;
  absl::StatusOr<std::unique_ptr<core::RequestLease>> BeginRequest() override {
    ASSIGN_OR_RETURN(std::unique_ptr<core::RequestLease> inner, core::Backend::BeginRequest());
    auto lease = std::make_unique<ObservedLease>(std::move(inner), on_lease_end);
    lease->inputs = &inputs;
    lease->outputs = &outputs;
    return lease;
  }
};

class ExecutorLimitsTest : public ExecutorTest {
 protected:
  // GatherTokens acts fp32 [2,8,4] by buffer, idx int32 [2,3], out inline
  // (96 bytes) unless `out_in_buffer`.
  core::GatherTokensRequest Gather(bool out_in_buffer = false) {
    if (buffers_.count("acts") == 0) {
      AddBuffer("acts", 2 * 8 * 4 * 4);
      AddBuffer("idx", 2 * 3 * 4);
      AddBuffer("out", 2 * 3 * 4 * 4);
      FillIds(View(Buf("idx", 0, DType::kInt32, {2, 3})), 8, false, rng_);
    }
    core::GatherTokensRequest req;
    req.activations = Buf("acts", 0, DType::kFloat32, {2, 8, 4});
    req.indices = Buf("idx", 0, DType::kInt32, {2, 3});
    if (out_in_buffer) req.out = Buf("out", 0, DType::kFloat32, {2, 3, 4});
    return req;
  }
};

TEST_F(ExecutorLimitsTest, ScratchBeyondTheRequestBoundIsRefusedBeforeRunning) {
  ScriptedBackend backend;
  core::MemoryBudget budget(/*total=*/1 << 20, /*per_request=*/4096, nullptr);
  core::Executor executor(&backend, &registry_, nullptr, Limits(), &budget);
  backend.scratch = 4096;  // by buffer: no staging, so 4096 fits exactly
  EXPECT_OK(executor.Run(session_, Gather(/*out_in_buffer=*/true)));
  backend.scratch = 4097;
  const Memory before = Snapshot();
  EXPECT_THAT(executor.Run(session_, Gather(/*out_in_buffer=*/true)),
              StatusIs(StatusCode::kResourceExhausted, "scratch of GatherTokens: needs 4097"));
  EXPECT_EQ(backend.runs.load(), 1);
  EXPECT_TRUE(Snapshot() == before);
  EXPECT_EQ(budget.used_bytes(), 0u);
}

TEST_F(ExecutorLimitsTest, TheServerWideBudgetIsSharedByRequestsInFlight) {
  ScriptedBackend backend;
  core::MemoryBudget budget(/*total=*/10000, /*per_request=*/10000, nullptr);
  core::Executor executor(&backend, &registry_, nullptr, Limits(), &budget);
  core::MemoryBudget::Reservation other = budget.Open();
  ASSERT_OK(other.Grow(9000, "another request"));
  backend.scratch = 1001;
  EXPECT_THAT(executor.Run(session_, Gather(true)),
              StatusIs(StatusCode::kResourceExhausted, "requests in flight hold 9000"));
  EXPECT_EQ(backend.runs.load(), 0);
  backend.scratch = 1000;
  EXPECT_OK(executor.Run(session_, Gather(true)));
  EXPECT_EQ(budget.used_bytes(), 9000u);  // the run gave its scratch back
}

TEST_F(ExecutorLimitsTest, InlineStagingIsCountedAndResultsStayReserved) {
  ScriptedBackend backend;
  core::MemoryBudget budget(/*total=*/1 << 20, /*per_request=*/1 << 20, nullptr);
  core::Executor executor(&backend, &registry_, nullptr, Limits(), &budget);
  backend.scratch = 5000;
  uint64_t during = 0;
  backend.during_run = [&] { during = budget.used_bytes(); };
  core::MemoryBudget::Reservation memory = budget.Open();
  absl::StatusOr<core::OpResult> result =
      executor.Run(session_, Gather(), core::RunOptions{nullptr, &memory});
  ASSERT_OK(result);
  EXPECT_EQ(during, 5000u + 96u);  // scratch + staging of the 96-byte inline out
  // After the op: only the inline result (96 bytes) is held, by the caller's
  // reservation, until the caller drops it.
  EXPECT_EQ(memory.bytes(), 96u);
  EXPECT_EQ(budget.used_bytes(), 96u);
  memory = core::MemoryBudget::Reservation();
  EXPECT_EQ(budget.used_bytes(), 0u);
}

TEST_F(ExecutorLimitsTest, StagingStaysCountedUntilTheLeaseEnds) {
  LeaseObservingBackend backend;
  core::MemoryBudget budget(/*total=*/1 << 20, /*per_request=*/1 << 20, nullptr);
  core::Executor executor(&backend, &registry_, nullptr, Limits(), &budget);
  uint64_t at_end = 0;
  backend.on_lease_end = [&] { at_end = budget.used_bytes(); };
  // Success: the 96-byte inline result (held by the caller) and its 96-byte
  // staging, still counted when the lease gives the staging back.
  core::MemoryBudget::Reservation memory = budget.Open();
  ASSERT_OK(executor.Run(session_, Gather(), core::RunOptions{nullptr, &memory}));
  EXPECT_EQ(at_end, 96u + 96u);
  EXPECT_EQ(budget.used_bytes(), 96u);
  memory = core::MemoryBudget::Reservation();
  // Failure after staging (stopped before the op): the staging is counted
  // until the lease ends, then nothing is.
  ManualToken token;
  token.fired = true;
  EXPECT_THAT(executor.Run(session_, Gather(), core::RunOptions{&token, nullptr}),
              StatusIs(StatusCode::kCancelled));
  EXPECT_EQ(at_end, 96u);
  EXPECT_EQ(budget.used_bytes(), 0u);
}

TEST_F(ExecutorLimitsTest, AnEmptyInlineInputIsStagedAsAnInput) {
  // Indices [2,0] inline with no bytes: the default string_view, whose
  // data() is null, must still be an input (not a zeroed output).
  LeaseObservingBackend backend;
  core::Executor executor(&backend, &registry_, nullptr, Limits());
  core::GatherTokensRequest req = Gather();
  const HostTensor acts = RandomHost(DType::kFloat32, {2, 8, 4}, rng_);
  req.activations = Inline(acts);
  req.indices = Inline(HostTensor{});
  req.indices.dtype = DType::kInt32;
  req.indices.shape = {2, 0};
  req.indices.inline_data = absl::string_view();
  ASSERT_OK(executor.Run(session_, req));
  EXPECT_EQ(backend.inputs, 2);   // activations, indices
  EXPECT_EQ(backend.outputs, 1);  // out
}

TEST_F(ExecutorLimitsTest, InlineInputsTooLargeForTheRequestAreRefused) {
  ScriptedBackend backend;
  core::MemoryBudget budget(/*total=*/1 << 20, /*per_request=*/1000, nullptr);
  core::Executor executor(&backend, &registry_, nullptr, Limits(), &budget);
  core::GatherTokensRequest req = Gather(true);
  const HostTensor acts = RandomHost(DType::kFloat32, {2, 8, 16}, rng_);  // 1024 bytes
  req.activations = Inline(acts);
  EXPECT_THAT(executor.Run(session_, req),
              StatusIs(StatusCode::kResourceExhausted, "staging for activations"));
  EXPECT_EQ(backend.runs.load(), 0);
  EXPECT_EQ(budget.used_bytes(), 0u);
}

TEST_F(ExecutorLimitsTest, AResponseIsSizedBeforeAnyOpRuns) {
  core::ExecutorLimits limits = Limits();
  limits.max_response_bytes = 2 * 96;  // two inline gathers fit, three do not
  core::Executor executor(&backend_, &registry_, nullptr, limits);
  core::ScatterTokensRequest first;  // would write `acts` if it ran
  Gather();
  AddBuffer("layer", 2 * 3 * 4 * 4);
  AddBuffer("uidx", 2 * 3 * 4);
  FillIds(View(Buf("uidx", 0, DType::kInt32, {2, 3})), 8, /*unique_rows=*/true, rng_);
  first.all = Buf("acts", 0, DType::kFloat32, {2, 8, 4});
  first.layer = Buf("layer", 0, DType::kFloat32, {2, 3, 4});
  first.indices = Buf("uidx", 0, DType::kInt32, {2, 3});
  const std::vector<core::OpRequest> three = {first, Gather(), Gather(), Gather()};
  const Memory before = Snapshot();
  EXPECT_THAT(executor.RunAll(session_, three),
              StatusIs(StatusCode::kResourceExhausted, "limit of one response"));
  EXPECT_TRUE(Snapshot() == before) << "an op ran before the response was sized";
  const std::vector<core::OpRequest> two = {first, Gather(), Gather()};
  absl::StatusOr<std::vector<core::OpResult>> ran = executor.RunAll(session_, two);
  ASSERT_OK(ran);
  EXPECT_EQ(ran->size(), 3u);
  EXPECT_EQ(executor.InlineOutputBytes(Gather()), 96u);
  EXPECT_EQ(executor.InlineOutputBytes(Gather(/*out_in_buffer=*/true)), 0u);
}

TEST_F(ExecutorLimitsTest, LostMemoryFailsTheOpAndUnregistersTheBuffer) {
  ScriptedBackend backend;
  core::Executor executor(&backend, &registry_, nullptr, Limits());
  core::GatherTokensRequest req = Gather(true);
  backend.during_run = [&] { mapper_.Fault("acts"); };  // the owner truncates mid-op
  EXPECT_THAT(executor.Run(session_, req),
              StatusIs(StatusCode::kFailedPrecondition,
                       "buffer 'acts': its memory was lost while the op ran"));
  EXPECT_THAT(registry_.Acquire(session_, "acts"), StatusIs(StatusCode::kNotFound));
  EXPECT_OK(registry_.Acquire(session_, "idx").status());  // the others stay
}

TEST_F(ExecutorLimitsTest, AFiredStopTokenEndsTheOpAndTheList) {
  ScriptedBackend backend;
  core::Executor executor(&backend, &registry_, nullptr, Limits());
  ManualToken token;
  token.fired = true;
  EXPECT_THAT(executor.Run(session_, Gather(true), core::RunOptions{&token, nullptr}),
              StatusIs(StatusCode::kCancelled));
  EXPECT_EQ(backend.runs.load(), 0);
  // The client gives up while op 0 runs: op 1 never starts.
  token.fired = false;
  backend.after_run = [&] { token.fired = true; };
  const std::vector<core::OpRequest> ops = {Gather(true), Gather(true), Gather(true)};
  EXPECT_THAT(executor.RunAll(session_, ops, core::RunOptions{&token, nullptr}),
              StatusIs(StatusCode::kCancelled, "ops[1] (GatherTokens)"));
  EXPECT_EQ(backend.runs.load(), 1);
}

}  // namespace
}  // namespace tokensel::testing
