// RunOnDevice (cuda_vmm_device_scope.h) over fake runtime ops: the caller's
// device is restored only when the caller had a current context; a thread
// without one is never switched to the device cudaGetDevice reports (0),
// which would create GPU 0's primary context in a server that never uses it.
#include "server/memory/cuda_vmm_device_scope.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tokensel::memory {
namespace {

using ::testing::ElementsAre;

class FakeOps final : public DeviceSwitchOps {
 public:
  bool HasCurrentContext() override {
    calls.push_back("has_context");
    return has_context;
  }
  bool GetDevice(int* device) override {
    calls.push_back("get");
    *device = current;  // 0 on a fresh thread, as cudaGetDevice answers
    return true;
  }
  bool SetDevice(int device) override {
    calls.push_back(absl::StrCat("set ", device));
    if (device == refuse) return false;
    current = device;
    has_context = true;
    return true;
  }
  void RestoreFailed(int device) override {
    calls.push_back(absl::StrCat("restore failed ", device));
  }

  bool has_context = false;
  int current = 0;
  int refuse = -1;
  std::vector<std::string> calls;
};

TEST(RunOnDeviceTest, WithoutAContextOnEntryNothingIsRestored) {
  FakeOps ops;  // a fresh thread: no context, cudaGetDevice would say 0
  const int r = RunOnDevice(ops, 3, 101, [&] {
    ops.calls.push_back("call");
    return 0;
  });
  EXPECT_EQ(r, 0);
  // Never "set 0": GPU 0's context is not created.
  EXPECT_THAT(ops.calls, ElementsAre("has_context", "set 3", "call"));
}

TEST(RunOnDeviceTest, TheCallersDeviceIsRestoredWhenItHadAContext) {
  FakeOps ops;
  ops.has_context = true;
  ops.current = 1;
  EXPECT_EQ(RunOnDevice(ops, 2, 101, [] { return 7; }), 7);  // the call's result
  EXPECT_THAT(ops.calls, ElementsAre("has_context", "get", "set 2", "set 1"));
  EXPECT_EQ(ops.current, 1);
  // Already on the device: no switch back.
  ops.calls.clear();
  RunOnDevice(ops, 1, 101, [] { return 0; });
  EXPECT_THAT(ops.calls, ElementsAre("has_context", "get", "set 1"));
}

TEST(RunOnDeviceTest, ADeviceThatCannotBeMadeCurrentSkipsTheCall) {
  FakeOps ops;
  ops.refuse = 5;
  bool ran = false;
  EXPECT_EQ(RunOnDevice(ops, 5, 101,
                        [&] {
                          ran = true;
                          return 0;
                        }),
            101);
  EXPECT_FALSE(ran);
  // A failed restore is reported, the call's result still returned.
  FakeOps restore;
  restore.has_context = true;
  restore.current = 4;
  restore.refuse = -1;
  EXPECT_EQ(RunOnDevice(restore, 2, 101,
                        [&] {
                          restore.refuse = 4;
                          return 0;
                        }),
            0);
  EXPECT_THAT(restore.calls,
              ElementsAre("has_context", "get", "set 2", "set 4", "restore failed 4"));
}

}  // namespace
}  // namespace tokensel::memory
