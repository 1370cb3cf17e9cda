// Eventually(done): polls `done` until it returns true or the timeout passes
// (default 60 s, reached only by a broken build or a hung machine); returns
// the last answer. Tests wait for an event this way instead of sleeping a
// fixed time and then asserting, which a loaded CI machine can outlast.
#ifndef TOKENSEL_TESTS_TESTING_EVENTUALLY_H_
#define TOKENSEL_TESTS_TESTING_EVENTUALLY_H_

#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tokensel::testing {

inline bool Eventually(const std::function<bool()>& done,
                       absl::Duration timeout = absl::Seconds(60)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_TESTING_EVENTUALLY_H_
