// LoadThread: one client thread of the load worker (tests/load/load_worker.cc).
//
// Setup() gives the thread its own connection (a channel with a private
// subchannel pool), its own session, and its own POSIX shm region
// (<shm_prefix>load-<pid>-<index>, random bytes) registered as "arena", with
// a local mirror of it, then runs Prime() (the server touches every page,
// so its resident memory does not grow later as random ops reach new
// offsets of the region). Nothing else writes that region, so after every
// request the region must equal the mirror the CPU oracle maintains (see
// tests/load/case_builder.h): every result is checked, by reference
// (whole-region comparison) and inline (bytes, dtype, shape).
//
// Run() loops until `deadline` or `max_requests` RPCs, picking at random:
//   - one operator RPC (any of the 8, SegmentSeqlens self or cross), by
//     reference and/or inline;
//   - an Execute of 2-4 random ops;
//   - a Random-LTD layer step: Execute(SampleTokens, GatherTokens), a
//     stand-in layer edits the gathered rows in the region, then
//     Execute(ScatterTokens, GatherBertMask) on the same ids;
//   - a Stream of 2-6 requests (ops or Executes), written ahead of reading;
//   - buffer churn: register a second buffer over a random sub-range of the
//     region, run an op on it, unregister it;
//   - housekeeping: ListBuffers (must list exactly "arena"), KeepAlive, Ping.
// With `big`, every request instead is an Execute of 16 by-reference 1 MiB
// gathers (the back-pressure run); with `allow_exhausted`, RESOURCE_EXHAUSTED
// answers are expected: counted as `exhausted`, and the region must be
// exactly as before the request.
//
// Close() ends the session (CloseSession). The destructor unmaps and
// unlinks the region. Counting and checking: request_checker.h; counters:
// report() (see load_report.h); latencies: latencies_us() by status code
// name. A thread object is used by one thread at a time.
#ifndef TOKENSEL_TESTS_LOAD_LOAD_THREAD_H_
#define TOKENSEL_TESTS_LOAD_LOAD_THREAD_H_

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "tests/load/case_builder.h"
#include "tests/load/load_report.h"
#include "tests/load/request_checker.h"
#include "tests/server/integration/client_util.h"
#include "tests/testing/shm_region.h"

namespace tokensel::load {

struct LoadThreadOptions {
  std::string target;      // "unix:///path/tokensel.sock"
  std::string shm_prefix;  // the server's --shm_prefix
  uint64_t region_bytes = 1 << 20;
  bool big = false;
  bool allow_exhausted = false;
  absl::Duration rpc_deadline = absl::Seconds(60);
};

class LoadThread {
 public:
  LoadThread(int index, LoadThreadOptions options, uint64_t seed);

  absl::Status Setup();
  void Run(absl::Time deadline, int64_t max_requests);
  absl::Status Close();

  const LoadReport& report() const { return checker_.report(); }
  const std::map<std::string, std::vector<int64_t>>& latencies_us() const {
    return checker_.latencies_us();
  }

 private:
  // A gather reading the first half of the region and writing the second:
  // the server's mapping of the region is resident before the load starts.
  void Prime();
  // One action of the mix.
  void SingleOp();
  void ExecuteOps();
  void LtdStep();
  void StreamOps();
  void Churn();
  void Housekeeping();
  void BigExecute();

  CaseMemory Memory() { return Memory(0, "arena"); }
  CaseMemory Memory(uint64_t offset, std::string buffer);

  const int index_;
  const LoadThreadOptions options_;
  std::mt19937_64 rng_;
  std::unique_ptr<itest::Client> client_;
  testing::TestShm shm_;
  std::vector<uint8_t> mirror_, local_;
  int64_t churn_ = 0;
  bool big_act_filled_ = false;
  RequestChecker checker_;
};

}  // namespace tokensel::load

#endif  // TOKENSEL_TESTS_LOAD_LOAD_THREAD_H_
