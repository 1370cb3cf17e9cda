// libFuzzer target: request decoding + validation + execution on the CPU
// backend. Bytes -> tokensel.v1.Op (op_decoder.h) -> server/grpc conversion
// (OpFromProto) -> core::Executor over a CpuBackend and a FakeRegionMapper
// that holds a few registered buffers -> OpResultToProto. Any status is fine;
// crashes, leaks, sanitizer reports and broken invariants are findings:
//  - an OK result's inline outputs are exactly product(shape) * element size
//    bytes each, and together within the executor's inline limit;
//  - after every op the registry still holds its buffers and no lease or
//    mapping leaked (the fake mapper counts live mappings).
//
// The executor runs with the server's per-op work bound (--max_op_elements)
// set to kMaxElements, so every input takes a bounded time unless the work
// estimate (core::EstimateOpWork) misses a cost: a slow input is a finding
// (libFuzzer's -timeout), not noise. RESOURCE_EXHAUSTED is a normal outcome.
#include <cstddef>
#include <cstdint>
#include <string>

#include "google/protobuf/stubs/logging.h"
#include "kernels/dtype.h"
#include "server/backends/cpu_backend.h"
#include "server/core/buffer_registry.h"
#include "server/core/executor.h"
#include "server/grpc/convert.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/op_decoder.h"
#include "tests/server/core/fake_region_mapper.h"

namespace tokensel::fuzz {
namespace {

constexpr uint64_t kMaxInline = 64 << 10;
constexpr uint64_t kMaxElements = 1 << 18;
constexpr size_t kRegistered = std::size(kBufferSizes) + 1;  // + the other session's

class Environment {
 public:
  static core::RegistryLimits RegistryLimits() {
    core::RegistryLimits limits;
    limits.max_buffers_per_session = 16;
    return limits;
  }
  static core::ExecutorLimits ExecutorLimits() {
    core::ExecutorLimits limits;
    limits.max_inline_bytes = kMaxInline;
    limits.max_response_bytes = kMaxInline;
    limits.max_op_work = kMaxElements;
    return limits;
  }

  Environment()
      : registry_(&mapper_, nullptr, RegistryLimits(), nullptr),
        backend_(2),
        executor_(&backend_, &registry_, nullptr, ExecutorLimits(), &budget_) {
    for (size_t i = 0; i < std::size(kBufferSizes); ++i) {
      memory_[i] = {mapper_.AddObject(kBufferNames[i], kBufferSizes[i]), kBufferSizes[i]};
      FUZZ_CHECK(registry_
                     .Register(kSession, kBufferNames[i],
                               mapper_.Spec(kBufferNames[i], 0, kBufferSizes[i]))
                     .ok());
    }
    memory_[kRegistered - 1] = {mapper_.AddObject("others", kOthersSize), kOthersSize};
    FUZZ_CHECK(
        registry_.Register(kOtherSession, "others", mapper_.Spec("others", 0, kOthersSize)).ok());
  }

  // The same bytes before every op, so inputs replay: each 4-byte word holds
  // a small little-endian int32 (plausible indices and segment ids).
  void ResetMemory() {
    for (const auto& [data, size] : memory_) {
      for (uint64_t j = 0; j < size; ++j) {
        data[j] = j % 4 == 0 ? static_cast<uint8_t>((j / 4) % 7) : 0;
      }
    }
  }

  void RunOne(const v1::Op& op) {
    absl::StatusOr<core::OpRequest> request = server::OpFromProto(op);
    if (request.ok()) {
      ResetMemory();
      absl::StatusOr<core::OpResult> result = executor_.Run(kSession, *request);
      if (result.ok()) {
        uint64_t total = 0;
        for (const core::InlineOutput& out : result->outputs) {
          uint64_t elements = 1;
          for (int64_t d : out.shape) {
            FUZZ_CHECK(d >= 0);
            elements *= static_cast<uint64_t>(d);
          }
          FUZZ_CHECK(out.data.size() ==
                     elements * static_cast<uint64_t>(kernels::ElementSize(out.dtype)));
          total += out.data.size();
        }
        FUZZ_CHECK(total <= kMaxInline);
        // The size an Execute checks before running is the size it returns.
        FUZZ_CHECK(executor_.InlineOutputBytes(*request) == total);
        v1::OpResponse response;
        server::OpResultToProto(std::move(*result), &response);
        FUZZ_CHECK(response.outputs_size() >= 0);
      }
    }
    FUZZ_CHECK(registry_.buffer_count() == kRegistered);
    FUZZ_CHECK(mapper_.live_mappings() == static_cast<int>(kRegistered));
    FUZZ_CHECK(budget_.used_bytes() == 0);  // every reservation was given back
  }

 private:
  testing::FakeRegionMapper mapper_;
  core::BufferRegistry registry_;
  backends::CpuBackend backend_;
  // Counts every op's memory as the server does (generous: an input of this
  // fuzzer is refused by the work bound long before).
  core::MemoryBudget budget_{uint64_t{1} << 30, uint64_t{256} << 20, nullptr};
  core::Executor executor_;
  std::pair<uint8_t*, uint64_t> memory_[kRegistered];
};

}  // namespace
}  // namespace tokensel::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto* env = new tokensel::fuzz::Environment();  // lives for the whole run
  // Invalid UTF-8 in string fields is a parse error; do not log each one.
  static auto* silencer = new google::protobuf::LogSilencer();
  (void)silencer;
  tokensel::v1::Op op;
  if (!tokensel::fuzz::DecodeOp(data, size, &op)) return 0;
  env->RunOne(op);
  return 0;
}
