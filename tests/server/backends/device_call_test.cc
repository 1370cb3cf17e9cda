// OnDeviceChecked (server/core/device_switch.h) over a fake device switch
// ops: the event paths' call runs with the backend's device current, the
// caller's device comes back after it, and a failed switch is told apart
// from a call that answered cudaErrorInvalidDevice (the client's event of
// another device) because the call did not run. SynchronizeOnDevice
// (server/backends/cuda_device_switch.h, CudaBackend::Drain): a failed
// switch is reported, and the stream is synchronized all the same.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backends/cuda_device_switch.h"
#include "server/core/device_switch.h"

namespace tokensel::backends {
namespace {

using core::DeviceCall;
using core::DeviceSwitch;
using core::OnDeviceChecked;

using ::testing::ElementsAre;

constexpr int kInvalidDevice = 101;  // cudaErrorInvalidDevice

// The calling thread's CUDA device state: a context and a current device.
class Thread final : public DeviceSwitch {
 public:
  bool HasCurrentContext() override { return has_context; }
  bool GetDevice(int* device) override {
    *device = current;
    return true;
  }
  bool SetDevice(int device) override {
    log.push_back(absl::StrCat("set ", device));
    if (device == refuse) return false;
    current = device;
    has_context = true;
    return true;
  }
  void RestoreFailed(int device) override {
    log.push_back(absl::StrCat("restore failed ", device));
  }

  bool has_context = true;
  int current = 1;
  int refuse = -1;
  std::vector<std::string> log;
};

TEST(DeviceCallTest, TheCallRunsOnTheDeviceAndTheCallersDeviceComesBack) {
  Thread thread;  // a request thread whose current device is 1
  int ran_on = -1;
  const DeviceCall call = OnDeviceChecked(thread, 0, [&] {
    ran_on = thread.current;
    return 0;
  });
  EXPECT_TRUE(call.switched);
  EXPECT_EQ(call.result, 0);
  EXPECT_EQ(ran_on, 0);
  EXPECT_EQ(thread.current, 1) << "the caller's device restored";
  EXPECT_THAT(thread.log, ElementsAre("set 0", "set 1"));
}

TEST(DeviceCallTest, AFailedSwitchRunsNothingAndIsNotTheCallsInvalidDevice) {
  Thread thread;
  thread.refuse = 2;
  bool ran = false;
  const DeviceCall refused = OnDeviceChecked(thread, 2, [&] {
    ran = true;
    return 0;
  });
  EXPECT_FALSE(refused.switched);
  EXPECT_FALSE(ran) << "nothing runs on the wrong device";
  EXPECT_EQ(thread.current, 1);
  // The call itself answering cudaErrorInvalidDevice (a client's event of
  // another device) is a call that ran: the caller classifies it.
  const DeviceCall answered = OnDeviceChecked(thread, 0, [] { return kInvalidDevice; });
  EXPECT_TRUE(answered.switched);
  EXPECT_EQ(answered.result, kInvalidDevice);
  EXPECT_EQ(thread.current, 1);
}

TEST(DeviceCallTest, AFailedRestoreIsReportedAndAThreadWithoutAContextIsLeftAlone) {
  Thread thread;
  thread.refuse = 1;  // the way back fails
  const DeviceCall call = OnDeviceChecked(thread, 0, [] { return 0; });
  EXPECT_TRUE(call.switched);
  EXPECT_THAT(thread.log, ElementsAre("set 0", "set 1", "restore failed 1"));
  // A fresh thread (no context: cudaGetDevice would say 0) is not switched
  // back to 0, whose context would be created for nothing.
  Thread fresh;
  fresh.has_context = false;
  fresh.current = 0;
  EXPECT_TRUE(OnDeviceChecked(fresh, 1, [] { return 0; }).switched);
  EXPECT_THAT(fresh.log, ElementsAre("set 1"));
}

// The sixth review: Drain ignored a failed cudaSetDevice. Now the failure
// is seen (switched false, for Drain to log and fail the request), and the
// stream's synchronization still runs, exactly once: its blocks go back to
// the pools right after the drain.
TEST(DeviceCallTest, ADrainReportsAFailedSwitchAndSynchronizesAllTheSame) {
  Thread thread;
  int syncs = 0;
  const DeviceCall ok = SynchronizeOnDevice(thread, 0, [&] {
    ++syncs;
    EXPECT_EQ(thread.current, 0) << "synchronized with the device current";
    return 0;
  });
  EXPECT_TRUE(ok.switched);
  EXPECT_EQ(syncs, 1);
  EXPECT_EQ(thread.current, 1);
  thread.refuse = 2;
  const DeviceCall refused = SynchronizeOnDevice(thread, 2, [&] {
    ++syncs;
    return 0;
  });
  EXPECT_FALSE(refused.switched) << "the failed switch is reported";
  EXPECT_EQ(refused.result, 0) << "the synchronization's own answer";
  EXPECT_EQ(syncs, 2) << "synchronized without the switch";
  EXPECT_EQ(thread.current, 1);
  EXPECT_THAT(thread.log, ElementsAre("set 0", "set 1", "set 2"));
}

}  // namespace
}  // namespace tokensel::backends
