// The default Backend::BeginRequest (contract: backend.h, RequestLease): host
// staging through the backend's AllocateStaging and synchronous Copy*, the op
// through RunOp. Every call is synchronous, so there is nothing to order.
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/core/backend.h"

namespace tokensel::core {
namespace {

class SyncStagingLease final : public RequestLease {
 public:
  explicit SyncStagingLease(Backend* backend) : backend_(backend) {}

  uint64_t StagingCost(uint64_t bytes) const override { return bytes; }

  absl::StatusOr<Staged> StageInput(const void* src, uint64_t bytes, bool read_back) override {
    ASSIGN_OR_RETURN(Staged staged, Allocate(bytes, read_back));
    RETURN_IF_ERROR(backend_->CopyToStaging(*staging_.back().memory, src, bytes));
    return staged;
  }

  absl::StatusOr<Staged> StageOutput(uint64_t bytes) override {
    return Allocate(bytes, /*read_back=*/true);  // AllocateStaging zero-fills
  }

  absl::Status RunOp(OpArgs args) override { return backend_->RunOp(args); }

  absl::Status ReadBack(size_t slot, void* dst, uint64_t bytes) override {
    if (slot >= staging_.size() || !staging_[slot].read_back) {
      return absl::InvalidArgumentError(absl::StrCat("staging slot ", slot, " is not read back"));
    }
    return backend_->CopyFromStaging(dst, *staging_[slot].memory, bytes);
  }

 private:
  struct Entry {
    std::unique_ptr<Backend::Staging> memory;
    bool read_back;
  };

  absl::StatusOr<Staged> Allocate(uint64_t bytes, bool read_back) {
    ASSIGN_OR_RETURN(std::unique_ptr<Backend::Staging> memory, backend_->AllocateStaging(bytes));
    void* data = memory->data();
    staging_.push_back(Entry{std::move(memory), read_back});
    return Staged{data, staging_.size() - 1};
  }

  Backend* const backend_;
  std::vector<Entry> staging_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RequestLease>> Backend::BeginRequest() {
  return std::make_unique<SyncStagingLease>(this);
}

absl::StatusOr<std::unique_ptr<RequestChain>> Backend::BeginChain(const std::string& /*session*/,
                                                                  const IpcEvents& events,
                                                                  bool /*async*/) {
  return absl::FailedPreconditionError(
      absl::StrCat(events.wait.empty() ? "record_event" : "wait_event",
                   ": CUDA IPC events are not supported by the ", name(), " backend"));
}

}  // namespace tokensel::core
