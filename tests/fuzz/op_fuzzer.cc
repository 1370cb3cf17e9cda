// libFuzzer target: request decoding + validation + execution on the CPU
// backend. Bytes -> tokensel.v1.Op (op_decoder.h) -> server/grpc conversion
// (OpFromProto) -> core::Executor over a CpuBackend and a FakeRegionMapper
// that holds a few registered buffers -> OpResultToProto. Any status is fine;
// crashes, leaks, sanitizer reports and broken invariants are findings:
//  - an OK result's inline outputs are exactly product(shape) * element size
//    bytes each, and together within the executor's inline limit, and the
//    response carries each of them under its name, bytes unchanged;
//  - nothing is written on error: every registered buffer is byte for byte
//    what it was before a failed op (the fuzzer installs no stop token, so
//    no error may leave a partial write);
//  - bounds: a buffer the op does not name (the other session's among them)
//    is never written, whatever the outcome;
//  - determinism: the same request on the same memory gives the same status,
//    the same inline outputs and the same memory;
//  - after every op the registry still holds its buffers and no lease or
//    mapping leaked (the fake mapper counts live mappings).
//
// The executor runs with the server's per-op work bound (--max_op_elements)
// set to kMaxElements, so every input takes a bounded time unless the work
// estimate (core::EstimateOpWork) misses a cost: a slow input is a finding
// (libFuzzer's -timeout), not noise. RESOURCE_EXHAUSTED is a normal outcome.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "google/protobuf/message.h"
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

  // Every buffer's bytes, in memory_ order.
  std::vector<std::vector<uint8_t>> Snapshot() const {
    std::vector<std::vector<uint8_t>> copy;
    for (const auto& [data, size] : memory_) copy.emplace_back(data, data + size);
    return copy;
  }

  // One run from the reset memory; checks what holds for a single run and
  // returns the outcome for the determinism check.
  struct Outcome {
    absl::Status status;
    std::vector<core::InlineOutput> outputs;
    std::vector<std::vector<uint8_t>> memory;
  };
  Outcome RunChecked(const core::OpRequest& request, const std::set<std::string>& named) {
    ResetMemory();
    const std::vector<std::vector<uint8_t>> before = Snapshot();
    absl::StatusOr<core::OpResult> result = executor_.Run(kSession, request);
    Outcome outcome{result.status(), {}, Snapshot()};
    for (size_t i = 0; i < kRegistered; ++i) {
      const char* name = i + 1 == kRegistered ? "others" : kBufferNames[i];
      // Nothing written on error; never a buffer the op does not name.
      if (!result.ok() || named.count(name) == 0) FUZZ_CHECK(outcome.memory[i] == before[i]);
    }
    if (!result.ok()) return outcome;
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
    FUZZ_CHECK(executor_.InlineOutputBytes(request) == total);
    outcome.outputs = result->outputs;
    v1::OpResponse response;
    server::OpResultToProto(std::move(*result), &response);
    FUZZ_CHECK(response.outputs_size() == static_cast<int>(outcome.outputs.size()));
    for (int i = 0; i < response.outputs_size(); ++i) {
      const core::InlineOutput& want = outcome.outputs[static_cast<size_t>(i)];
      FUZZ_CHECK(response.outputs(i).name() == want.name);
      FUZZ_CHECK(response.outputs(i).tensor().inline_data() == want.data);
      FUZZ_CHECK(response.outputs(i).tensor().shape_size() == static_cast<int>(want.shape.size()));
    }
    return outcome;
  }

  void RunOne(const v1::Op& op) {
    absl::StatusOr<core::OpRequest> request = server::OpFromProto(op);
    if (request.ok()) {
      std::set<std::string> named;
      CollectBufferNames(op, &named);
      const Outcome first = RunChecked(*request, named);
      const Outcome second = RunChecked(*request, named);
      FUZZ_CHECK(first.status == second.status);
      FUZZ_CHECK(first.memory == second.memory);
      FUZZ_CHECK(first.outputs.size() == second.outputs.size());
      for (size_t i = 0; i < first.outputs.size(); ++i) {
        FUZZ_CHECK(first.outputs[i].name == second.outputs[i].name);
        FUZZ_CHECK(first.outputs[i].dtype == second.outputs[i].dtype);
        FUZZ_CHECK(first.outputs[i].shape == second.outputs[i].shape);
        FUZZ_CHECK(first.outputs[i].data == second.outputs[i].data);
      }
    }
    FUZZ_CHECK(registry_.buffer_count() == kRegistered);
    FUZZ_CHECK(mapper_.live_mappings() == static_cast<int>(kRegistered));
    FUZZ_CHECK(budget_.used_bytes() == 0);  // every reservation was given back
  }

 private:
  // The buffer names of every BufferSlice anywhere in `m`.
  static void CollectBufferNames(const google::protobuf::Message& m, std::set<std::string>* out) {
    if (const auto* slice = dynamic_cast<const v1::BufferSlice*>(&m)) {
      out->insert(slice->buffer());
      return;
    }
    const google::protobuf::Reflection* r = m.GetReflection();
    std::vector<const google::protobuf::FieldDescriptor*> fields;
    r->ListFields(m, &fields);
    for (const google::protobuf::FieldDescriptor* f : fields) {
      if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(m, f); ++i) {
          CollectBufferNames(r->GetRepeatedMessage(m, f, i), out);
        }
      } else {
        CollectBufferNames(r->GetMessage(m, f), out);
      }
    }
  }

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
