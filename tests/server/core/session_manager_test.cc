#include "server/core/session_manager.h"

#include <new>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/service_metrics.h"
#include "tests/server/core/metric_reader.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::core {
namespace {

using ::testing::ElementsAre;
using ::testing::MatchesRegex;
using ::testing::UnorderedElementsAre;
using tokensel::testing::StatusIs;

class SessionManagerTest : public ::testing::Test {
 protected:
  // Default TTL 10 s, max 60 s, at most 3 sessions; a clock the test moves.
  SessionManager Make(uint32_t max_sessions = 3, ServiceMetrics* metrics = nullptr,
                      uint32_t per_peer = 1000) {
    SessionLimits limits;
    limits.default_ttl = absl::Seconds(10);
    limits.max_ttl = absl::Seconds(60);
    limits.max_sessions = max_sessions;
    limits.max_sessions_per_peer = per_peer;
    return SessionManager(
        limits,
        [this](const std::string& id) {
          ended_.push_back(id);
          if (on_end_probe_) on_end_probe_();
        },
        metrics, [this] { return now_; });
  }
  void Advance(absl::Duration d) { now_ += d; }

  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
  std::vector<std::string> ended_;
  std::function<void()> on_end_probe_;
};

TEST_F(SessionManagerTest, IdsAre128BitHexAndUnique) {
  SessionManager sessions = Make(/*max_sessions=*/100);
  std::set<std::string> ids;
  for (int i = 0; i < 50; ++i) {
    absl::StatusOr<SessionInfo> info = sessions.Open("worker", absl::ZeroDuration());
    ASSERT_OK(info);
    EXPECT_THAT(info->id, MatchesRegex("[0-9a-f]{32}"));
    EXPECT_EQ(info->client_name, "worker");
    ids.insert(info->id);
  }
  EXPECT_EQ(ids.size(), 50u);
  EXPECT_EQ(sessions.count(), 50u);
}

// set_on_begin (the backend's IpcEventCache caches only for live
// sessions): each opened session begins once, with its id, before Open
// returns it; a refused Open begins nothing; a session's end follows its
// begin.
TEST_F(SessionManagerTest, EachOpenedSessionBeginsBeforeItsIdIsReturned) {
  SessionManager sessions = Make(/*max_sessions=*/2);
  std::vector<std::string> begun;
  sessions.set_on_begin([&](const std::string& id) { begun.push_back(id); });
  absl::StatusOr<SessionInfo> a = sessions.Open("a", absl::Seconds(1));
  ASSERT_OK(a);
  EXPECT_THAT(begun, ElementsAre(a->id));
  absl::StatusOr<SessionInfo> b = sessions.Open("b", absl::ZeroDuration());
  ASSERT_OK(b);
  EXPECT_THAT(sessions.Open("c", absl::ZeroDuration()).status(),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(begun, ElementsAre(a->id, b->id)) << "a refused Open begins nothing";
  Advance(absl::Seconds(2));
  EXPECT_EQ(sessions.ReapExpired(), 1);
  EXPECT_THAT(ended_, ElementsAre(a->id));
  ASSERT_OK(sessions.Close(b->id));
  EXPECT_THAT(ended_, ElementsAre(a->id, b->id));
}

// The seventh review: the begin ran under the manager's lock after the
// insertion, so a begin that threw (std::bad_alloc in the backend's
// BeginSession) left a session whose id the client never learnt holding a
// slot until its lease ran out (and OpenSession's handler does not catch:
// gRPC answered UNIMPLEMENTED). Now the begin runs before
// the insertion: a throw leaves no slot taken (of max_sessions nor of the
// peer's), the id's end follows its (partial) begin, and Open answers
// RESOURCE_EXHAUSTED.
TEST_F(SessionManagerTest, ABeginThatThrowsLeavesNoSessionSlotTaken) {
  SessionManager sessions = Make(/*max_sessions=*/1, nullptr, /*per_peer=*/1);
  std::vector<std::string> begun;
  bool fail = true;
  sessions.set_on_begin([&](const std::string& id) {
    begun.push_back(id);
    if (fail) throw std::bad_alloc();
  });
  EXPECT_THAT(sessions.Open("a", absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kResourceExhausted, "out of memory"));
  EXPECT_EQ(sessions.count(), 0u);
  ASSERT_EQ(begun.size(), 1u);
  EXPECT_THAT(ended_, ElementsAre(begun[0])) << "its end follows its begin";
  fail = false;
  absl::StatusOr<SessionInfo> b = sessions.Open("b", absl::ZeroDuration());
  ASSERT_OK(b) << "the failed Open took the only slot";
  EXPECT_EQ(sessions.count(), 1u);
  EXPECT_THAT(sessions.Touch(begun[0]), StatusIs(absl::StatusCode::kNotFound));
  // The begin runs without the manager's lock (it may call back in).
  size_t seen = 99;
  sessions.set_on_begin([&](const std::string&) { seen = sessions.count(); });
  ASSERT_OK(sessions.Close(b->id));
  ASSERT_OK(sessions.Open("c", absl::ZeroDuration()));
  EXPECT_EQ(seen, 0u);
}

// The second read of the seventh review, NIT 5: an Open that reaps expired
// sessions to make room, then runs out of memory before it reserved its own
// (here: copying the begin callback), still ends the sessions it reaped;
// they were out of the table already, so nothing else would (their buffers,
// tickets and events stayed held until exit).
TEST_F(SessionManagerTest, AnOpenThatThrowsAfterReapingStillEndsTheReapedSessions) {
  SessionManager sessions = Make(/*max_sessions=*/1);
  // A begin callback whose copy fails on demand (the std::function copy in
  // Open's first step).
  struct CopyMayFail {
    bool* fail;
    CopyMayFail(bool* f) : fail(f) {}  // NOLINT(google-explicit-constructor)
    CopyMayFail(const CopyMayFail& other) : fail(other.fail) {
      if (*fail) throw std::bad_alloc();
    }
    void operator()(const std::string&) const {}
  };
  bool fail = false;
  sessions.set_on_begin(CopyMayFail(&fail));
  absl::StatusOr<SessionInfo> a = sessions.Open("a", absl::Seconds(5));
  ASSERT_OK(a);
  Advance(absl::Seconds(6));  // a's lease ran out; the next Open reaps it
  fail = true;
  EXPECT_THAT(sessions.Open("b", absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kResourceExhausted, "out of memory"));
  EXPECT_EQ(sessions.count(), 0u);
  EXPECT_THAT(ended_, ElementsAre(a->id)) << "the reaped session was never ended";
  fail = false;
  ASSERT_OK(sessions.Open("c", absl::ZeroDuration()));
  EXPECT_THAT(ended_, ElementsAre(a->id)) << "ended once";
}

TEST_F(SessionManagerTest, TtlDefaultsAndIsCapped) {
  SessionManager sessions = Make();
  EXPECT_EQ(sessions.Open("a", absl::ZeroDuration())->ttl, absl::Seconds(10));
  EXPECT_EQ(sessions.Open("b", absl::Seconds(30))->ttl, absl::Seconds(30));
  EXPECT_EQ(sessions.Open("c", absl::Hours(5))->ttl, absl::Seconds(60));
}

TEST_F(SessionManagerTest, TouchRenewsTheLease) {
  SessionManager sessions = Make();
  const std::string id = sessions.Open("a", absl::ZeroDuration())->id;
  Advance(absl::Seconds(6));
  absl::StatusOr<absl::Duration> ttl = sessions.Touch(id);
  ASSERT_OK(ttl);
  EXPECT_EQ(*ttl, absl::Seconds(10));
  Advance(absl::Seconds(6));  // 12 s after Open: alive only because of the renewal
  EXPECT_OK(sessions.Touch(id));
  EXPECT_TRUE(ended_.empty());
  Advance(absl::Seconds(10));  // exactly one TTL since the last touch: expired
  EXPECT_THAT(sessions.Touch(id), StatusIs(absl::StatusCode::kNotFound, "expired"));
  EXPECT_THAT(ended_, ElementsAre(id));
  EXPECT_EQ(sessions.count(), 0u);
  EXPECT_THAT(sessions.Touch(id), StatusIs(absl::StatusCode::kNotFound, "unknown"));
  EXPECT_EQ(ended_.size(), 1u);  // ended once
}

TEST_F(SessionManagerTest, ReapExpiredEndsOnlyExpiredSessions) {
  SessionManager sessions = Make();
  const std::string short_id = sessions.Open("a", absl::Seconds(5))->id;
  const std::string long_id = sessions.Open("b", absl::Seconds(20))->id;
  EXPECT_EQ(sessions.ReapExpired(), 0);
  Advance(absl::Seconds(10));
  EXPECT_EQ(sessions.ReapExpired(), 1);
  EXPECT_THAT(ended_, ElementsAre(short_id));
  EXPECT_OK(sessions.Touch(long_id));
  Advance(absl::Seconds(25));
  EXPECT_EQ(sessions.ReapExpired(), 1);
  EXPECT_THAT(ended_, ElementsAre(short_id, long_id));
  EXPECT_EQ(sessions.count(), 0u);
}

TEST_F(SessionManagerTest, CloseEndsOnceAndUnknownIsNotFound) {
  SessionManager sessions = Make();
  const std::string id = sessions.Open("a", absl::ZeroDuration())->id;
  EXPECT_THAT(sessions.Close("0123456789abcdef0123456789abcdef"),
              StatusIs(absl::StatusCode::kNotFound, "session"));
  EXPECT_OK(sessions.Close(id));
  EXPECT_THAT(ended_, ElementsAre(id));
  EXPECT_THAT(sessions.Close(id), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(sessions.Touch(id), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(ended_.size(), 1u);
}

TEST_F(SessionManagerTest, MaxSessionsCountsOnlyLiveLeases) {
  SessionManager sessions = Make(/*max_sessions=*/2);
  const std::string a = sessions.Open("a", absl::Seconds(5))->id;
  ASSERT_OK(sessions.Open("b", absl::Seconds(50)));
  EXPECT_THAT(sessions.Open("c", absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kResourceExhausted, "limit is 2"));
  Advance(absl::Seconds(6));  // a has expired: Open makes room from it
  EXPECT_OK(sessions.Open("c", absl::ZeroDuration()));
  EXPECT_THAT(ended_, ElementsAre(a));
  EXPECT_EQ(sessions.count(), 2u);
}

TEST_F(SessionManagerTest, CloseAllEndsEverySession) {
  SessionManager sessions = Make();
  const std::string a = sessions.Open("a", absl::ZeroDuration())->id;
  const std::string b = sessions.Open("b", absl::ZeroDuration())->id;
  sessions.CloseAll();
  EXPECT_THAT(ended_, UnorderedElementsAre(a, b));
  EXPECT_EQ(sessions.count(), 0u);
}

TEST_F(SessionManagerTest, OnEndRunsOutsideTheLock) {
  SessionManager sessions = Make();
  // on_end calling back into the manager would deadlock under its lock.
  size_t count_seen = 99;
  on_end_probe_ = [&] { count_seen = sessions.count(); };
  const std::string id = sessions.Open("a", absl::ZeroDuration())->id;
  ASSERT_OK(sessions.Open("b", absl::ZeroDuration()));
  EXPECT_OK(sessions.Close(id));
  EXPECT_EQ(count_seen, 1u);
  Advance(absl::Seconds(11));
  EXPECT_EQ(sessions.ReapExpired(), 1);
  EXPECT_EQ(count_seen, 0u);
}

TEST_F(SessionManagerTest, SessionsGauge) {
  ServiceMetrics metrics("test", "cpu");
  SessionManager sessions = Make(3, &metrics);
  const std::string a = sessions.Open("a", absl::ZeroDuration())->id;
  ASSERT_OK(sessions.Open("b", absl::ZeroDuration()));
  EXPECT_EQ(testing::GaugeValue(metrics, "tokensel_sessions"), 2);
  ASSERT_OK(sessions.Close(a));
  EXPECT_EQ(testing::GaugeValue(metrics, "tokensel_sessions"), 1);
  Advance(absl::Minutes(1));
  sessions.ReapExpired();
  EXPECT_EQ(testing::GaugeValue(metrics, "tokensel_sessions"), 0);
}

TEST_F(SessionManagerTest, AQuotaPerPeerLeavesRoomForOthers) {
  SessionManager sessions = Make(/*max_sessions=*/10, nullptr, /*per_peer=*/2);
  const Peer alice = Peer::Unix(1000, 1000, 1);
  const Peer bob = Peer::Unix(1001, 1001, 2);
  ASSERT_OK(sessions.Open("a", absl::ZeroDuration(), alice));
  ASSERT_OK(sessions.Open("a", absl::ZeroDuration(), alice));
  EXPECT_THAT(sessions.Open("a", absl::ZeroDuration(), alice),
              StatusIs(absl::StatusCode::kResourceExhausted, "uid:1000 already has 2"));
  // Another uid, and the same address over TCP, are other peers.
  EXPECT_OK(sessions.Open("b", absl::ZeroDuration(), bob));
  EXPECT_OK(sessions.Open("t", absl::ZeroDuration(), Peer::Tcp("10.0.0.7")));
  // An expired session of alice's makes room for her again.
  Advance(absl::Seconds(11));
  EXPECT_OK(sessions.Open("a", absl::ZeroDuration(), alice));
}

TEST_F(SessionManagerTest, OnlyTheOwnerMayUseASession) {
  SessionManager sessions = Make();
  const Peer alice = Peer::Unix(1000, 1000, 1);
  const std::string id = sessions.Open("a", absl::ZeroDuration(), alice)->id;
  EXPECT_OK(sessions.Touch(id, Peer::Unix(1000, 5, 99)));  // same uid, other process
  EXPECT_THAT(sessions.Touch(id, Peer::Unix(1001, 1000, 1)),
              StatusIs(absl::StatusCode::kPermissionDenied, "another peer"));
  EXPECT_THAT(sessions.Touch(id, Peer::Tcp("127.0.0.1")),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(sessions.Touch(id), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_TRUE(ended_.empty());  // a refused touch does not end it
  EXPECT_EQ(sessions.Open("x", absl::ZeroDuration(), alice)->owner, "uid:1000");
}

TEST_F(SessionManagerTest, APinnedSessionOutlivesItsLease) {
  SessionManager sessions = Make();
  const std::string id = sessions.Open("s", absl::ZeroDuration())->id;
  ASSERT_OK(sessions.Pin(id));
  ASSERT_OK(sessions.Pin(id));
  Advance(absl::Minutes(5));
  EXPECT_EQ(sessions.ReapExpired(), 0);
  EXPECT_OK(sessions.Touch(id));
  sessions.Unpin(id);
  Advance(absl::Minutes(5));
  EXPECT_EQ(sessions.ReapExpired(), 0);  // one pin left
  sessions.Unpin(id);                    // the lease restarts now
  Advance(absl::Seconds(9));
  EXPECT_EQ(sessions.ReapExpired(), 0);
  Advance(absl::Seconds(1));
  EXPECT_EQ(sessions.ReapExpired(), 1);
  EXPECT_THAT(sessions.Pin(id), StatusIs(absl::StatusCode::kNotFound));
  sessions.Unpin(id);  // unknown: nothing happens
}

TEST_F(SessionManagerTest, AnExpiredSessionCannotBePinned) {
  SessionManager sessions = Make();
  const std::string id = sessions.Open("s", absl::ZeroDuration())->id;
  Advance(absl::Seconds(10));
  EXPECT_THAT(sessions.Pin(id), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace tokensel::core
