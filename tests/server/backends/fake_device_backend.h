// FakeDevice: a core::Backend standing for one GPU of a multi-GPU node, for
// the dispatch tests (no device needed). It runs the CPU kernels (its
// "device memory" is host memory: FakeRegionMapper's kCudaDevice regions),
// describes one device (ordinal, UUID), reports the metric label
// "fake:<ordinal>", and records every call made to it. Staging it allocates
// is tagged with it: a copy into or out of another device's staging fails
// INTERNAL, so a request whose staging and op went to different devices
// cannot pass unnoticed. healthy() is settable; a hook runs inside RunOp.
#ifndef TOKENSEL_TESTS_SERVER_BACKENDS_FAKE_DEVICE_BACKEND_H_
#define TOKENSEL_TESTS_SERVER_BACKENDS_FAKE_DEVICE_BACKEND_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/server/core/forwarding_backend.h"

namespace tokensel::testing {

class FakeDevice : public ForwardingBackend {
 public:
  FakeDevice(int ordinal, std::string uuid) : label_(absl::StrCat("fake:", ordinal)) {
    description_.ordinal = ordinal;
    description_.uuid = std::move(uuid);
    description_.name = "Fake GPU";
  }

  absl::string_view name() const override { return "fake"; }
  bool CanAccess(core::MemoryKind) const override { return true; }
  std::vector<core::DeviceDescription> devices() const override { return {description_}; }
  absl::string_view device_label() const override { return label_; }
  bool OnDevice(absl::string_view uuid) const override {
    return absl::EqualsIgnoreCase(uuid, description_.uuid);
  }
  bool healthy() const override { return healthy_.load(); }
  void set_healthy(bool healthy) { healthy_.store(healthy); }
  // Runs at the start of every RunOp (set before any op runs).
  void set_run_hook(std::function<void()> hook) { run_hook_ = std::move(hook); }

  absl::StatusOr<std::unique_ptr<Staging>> AllocateStaging(uint64_t bytes) override {
    ++staging_allocations;
    absl::StatusOr<std::unique_ptr<Staging>> inner = cpu_.AllocateStaging(bytes);
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<Staging>(new Tagged(this, *std::move(inner)));
  }
  absl::Status CopyToStaging(const Staging& dst, const void* src, uint64_t bytes) override {
    ++copies_to_staging;
    const Tagged* t = dynamic_cast<const Tagged*>(&dst);
    if (t == nullptr || t->owner != this) return Foreign("CopyToStaging");
    return cpu_.CopyToStaging(*t->inner, src, bytes);
  }
  absl::Status CopyFromStaging(void* dst, const Staging& src, uint64_t bytes) override {
    ++copies_from_staging;
    const Tagged* t = dynamic_cast<const Tagged*>(&src);
    if (t == nullptr || t->owner != this) return Foreign("CopyFromStaging");
    return cpu_.CopyFromStaging(dst, *t->inner, bytes);
  }
  absl::Status RunOp(core::OpArgs args) override {
    ++runs;
    if (run_hook_) run_hook_();
    return cpu_.RunOp(args);
  }

  // Every call made to this device.
  int calls() const {
    return staging_allocations.load() + copies_to_staging.load() + copies_from_staging.load() +
           runs.load();
  }

  std::atomic<int> staging_allocations{0};
  std::atomic<int> copies_to_staging{0};
  std::atomic<int> copies_from_staging{0};
  std::atomic<int> runs{0};

 private:
  struct Tagged final : Staging {
    Tagged(const FakeDevice* o, std::unique_ptr<Staging> i) : owner(o), inner(std::move(i)) {}
    void* data() const override { return inner->data(); }
    uint64_t size() const override { return inner->size(); }
    const FakeDevice* owner;
    std::unique_ptr<Staging> inner;
  };
  absl::Status Foreign(absl::string_view call) const {
    return absl::InternalError(absl::StrCat(label_, ": ", call, " with staging of another device"));
  }

  core::DeviceDescription description_;
  std::string label_;
  std::atomic<bool> healthy_{true};
  std::function<void()> run_hook_;
};

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_SERVER_BACKENDS_FAKE_DEVICE_BACKEND_H_
