// RequestChecker: a load thread's bookkeeping. Counts every RPC into the
// thread's LoadReport (see load_report.h for the keys) and checks each
// request-carrying RPC's results:
//  - OK: one OpResponse per op; every inline output the CaseBuilder expects
//    (name, dtype, shape, bytes equal to the oracle's) and no other; the
//    whole region equal to the mirror byte for byte;
//  - RESOURCE_EXHAUSTED with `allow_exhausted`: counted as `exhausted`, and
//    the region must be exactly what it was before the request
//    (SnapshotIfNeeded() copies it just before sending);
//  - anything else: an error, counted by code.
// After any failure the mirror is resynchronised from the region, so later
// requests are checked on their own. The first 10 failures per thread are
// printed to stderr with the thread, the request kind and the first
// difference. Not thread-safe: one checker per thread.
#ifndef TOKENSEL_TESTS_LOAD_REQUEST_CHECKER_H_
#define TOKENSEL_TESTS_LOAD_REQUEST_CHECKER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "tests/load/case_builder.h"
#include "tests/load/load_report.h"
#include "tokensel/v1/tokensel.pb.h"

namespace tokensel::load {

class RequestChecker {
 public:
  RequestChecker(int thread_index, bool allow_exhausted)
      : index_(thread_index), allow_exhausted_(allow_exhausted) {}

  // The region (written by the server), its mirror and the local area, each
  // `size` bytes; before any Conclude.
  void Attach(uint8_t* shm, uint8_t* mirror, const uint8_t* local, uint64_t size);

  // Copies the region just before a request, when refusals are expected.
  void SnapshotIfNeeded();
  // Counts one RPC without op results (session, buffer, housekeeping). A
  // non-empty `mismatch` on an OK status counts a mismatch. Returns `status`.
  absl::Status Counted(absl::string_view method, const absl::Status& status,
                       const std::string& mismatch = "");
  // Counts one request-carrying RPC and checks it (see the file comment).
  // `results`: one per op, in order (null = missing). True if OK and right.
  bool Conclude(absl::string_view method, const absl::Status& status, absl::Duration latency,
                const CaseBuilder& b, const std::vector<const v1::OpResponse*>& results,
                absl::string_view what);

  LoadReport& report() { return report_; }
  const LoadReport& report() const { return report_; }
  // Latencies of Conclude()d RPCs in microseconds, by status code name.
  const std::map<std::string, std::vector<int64_t>>& latencies_us() const { return latencies_; }

 private:
  void CountError(const absl::Status& status, absl::string_view what);
  void Mismatch(absl::string_view what, const std::string& why);
  // Empty if every expected output and the region match, else why not.
  std::string Check(const CaseBuilder& b, const std::vector<const v1::OpResponse*>& results) const;
  void Resync();  // mirror := region

  const int index_;
  const bool allow_exhausted_;
  uint8_t* shm_ = nullptr;
  uint8_t* mirror_ = nullptr;
  const uint8_t* local_ = nullptr;
  uint64_t size_ = 0;
  std::vector<uint8_t> before_;
  bool have_before_ = false;
  int logged_ = 0;
  LoadReport report_;
  std::map<std::string, std::vector<int64_t>> latencies_;
};

}  // namespace tokensel::load

#endif  // TOKENSEL_TESTS_LOAD_REQUEST_CHECKER_H_
