// AsyncRequests (server/core/async_requests.h): the admission caps, the
// deferred errors, waiting, and the stuck caps of abandoned requests.
#include "server/core/async_requests.h"

#include <deque>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {
namespace {

using ::absl::StatusCode;

// The stuck caps (async_requests.h): per session, then server-wide; only
// for requests that may get stuck; an abandoned ticket frees its admission.
TEST(AsyncRequestsTest, AbandonedTicketsCountAsStuckUnderTheirOwnCaps) {
  core::AsyncRequests async(core::AsyncLimits{2, 3, 2, 3});
  std::vector<core::AsyncRequests::Ticket> held;
  for (const char* s : {"s", "s", "t"}) {
    absl::StatusOr<core::AsyncRequests::Ticket> t = async.Admit(s, "", true);
    ASSERT_OK(t);
    t->Abandon();
    t->Abandon();  // once
    held.push_back(*std::move(t));
  }
  EXPECT_EQ(async.inflight(), 0u);
  EXPECT_EQ(async.stuck(), 3u);
  EXPECT_EQ(async.stuck("s"), 2u);
  EXPECT_THAT(async.Admit("s", "", true).status(),
              StatusIs(StatusCode::kResourceExhausted, "in this session, the limit is 2"));
  EXPECT_THAT(async.Admit("u", "", true).status(),
              StatusIs(StatusCode::kResourceExhausted, "in the server, the limit is 3"));
  for (const char* s : {"s", "u", "u"}) EXPECT_OK(async.Admit(s, "", false)) << s;
  EXPECT_FALSE(async.WaitAll(absl::Milliseconds(1))) << "stuck ones are waited for";
  held[0].Complete(absl::OkStatus());
  EXPECT_EQ(async.stuck("s"), 1u);
  EXPECT_OK(async.Admit("s", "", true));
  held.clear();
  EXPECT_TRUE(async.WaitAll(absl::Milliseconds(1)));
}

TEST(AsyncRequestsTest, CapsDeferredErrorsAndWaiting) {
  core::AsyncRequests async(core::AsyncLimits{2, 3});
  absl::StatusOr<core::AsyncRequests::Ticket> a = async.Admit("s", "", false);
  absl::StatusOr<core::AsyncRequests::Ticket> b = async.Admit("s", "", false);
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(b->number(), 2u);
  EXPECT_THAT(async.Admit("s", "", false).status(), StatusIs(StatusCode::kResourceExhausted));
  a->Complete(absl::InvalidArgumentError("ops[1] (SortTokens): bad ids"));
  b->Complete(absl::InternalError("later"));
  const absl::Status first = async.TakeDeferred("s");
  EXPECT_EQ(first.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(first.message(),
            "deferred from async Execute #1 of this session: ops[1] (SortTokens): bad ids");
  EXPECT_OK(async.TakeDeferred("s"));
  EXPECT_EQ(async.dropped_errors(), 1u);
  // WaitSession returns once the session is idle, or with the check's error.
  absl::StatusOr<core::AsyncRequests::Ticket> c = async.Admit("s", "", false);
  ASSERT_OK(c);
  EXPECT_THAT(async.WaitSession("s", [] { return absl::DeadlineExceededError("late"); }),
              StatusIs(StatusCode::kDeadlineExceeded));
  *c = core::AsyncRequests::Ticket();  // completes (no error) as it goes
  EXPECT_OK(async.WaitSession("s", nullptr));
  // A session that ended forgets its error.
  absl::StatusOr<core::AsyncRequests::Ticket> d = async.Admit("s", "", false);
  ASSERT_OK(d);
  async.EndSession("s");
  d->Complete(absl::InternalError("too late"));
  EXPECT_OK(async.TakeDeferred("s"));
  EXPECT_TRUE(async.WaitAll(absl::ZeroDuration()));
}

// Per peer (the fourth review): one peer with many sessions holds at most
// per_peer in flight and stuck_per_peer stuck, whatever its sessions'
// counts, so it cannot take the server's caps from another peer.
TEST(AsyncRequestsTest, OnePeerCannotTakeTheServersCapsWithManySessions) {
  core::AsyncLimits limits;
  limits.per_session = 2;
  limits.total = 8;
  limits.per_peer = 3;
  limits.stuck_per_session = 2;
  limits.stuck_total = 8;
  limits.stuck_per_peer = 3;
  core::AsyncRequests async(limits);
  std::vector<core::AsyncRequests::Ticket> held;
  for (const char* s : {"p1", "p2", "p3"}) {
    absl::StatusOr<core::AsyncRequests::Ticket> t = async.Admit(s, "uid:1", true);
    ASSERT_OK(t) << s;
    held.push_back(*std::move(t));
  }
  EXPECT_THAT(async.Admit("p4", "uid:1", false).status(),
              StatusIs(StatusCode::kResourceExhausted, "for peer uid:1 (all its sessions)"));
  EXPECT_EQ(async.peer_inflight("uid:1"), 3u);
  EXPECT_EQ(async.inflight("p4"), 0u) << "a refusal leaves no entry";
  // Stuck: the peer's stuck cap (waiting + stuck) applies across its
  // sessions, and a stuck ticket no longer counts in flight for the peer.
  held[0].Abandon();
  held[1].Abandon();
  EXPECT_EQ(async.peer_stuck("uid:1"), 2u);
  EXPECT_EQ(async.peer_inflight("uid:1"), 1u);
  EXPECT_THAT(async.Admit("p5", "uid:1", true).status(),
              StatusIs(StatusCode::kResourceExhausted, "for peer uid:1 (all its sessions)"));
  EXPECT_OK(async.Admit("p5", "uid:1", false)) << "no wait_event: not refused for stuck ones";
  // Another peer is served in full.
  for (const char* s : {"q1", "q1", "q2"}) EXPECT_OK(async.Admit(s, "uid:2", true)) << s;
  held.clear();
  EXPECT_EQ(async.peer_inflight("uid:1"), 0u);
  EXPECT_EQ(async.peer_stuck("uid:1"), 0u);
  EXPECT_TRUE(async.WaitAll(absl::Milliseconds(1)));
}

// The fifth review: the stuck caps held only at admission, and requests
// admitted below them turned stuck later unchecked (one uid: 4 sessions x
// 16 async waits never recorded -> 64 stuck after 60 s, the server-wide
// cap, so every other peer's wait_event was refused). Each request with a
// wait_event now takes a wait slot under the stuck caps, kept when it turns
// stuck: waiting + stuck never exceeds a cap. With the server's defaults.
TEST(AsyncRequestsTest, WaitsThatNeverPassCannotExceedTheStuckCaps) {
  core::AsyncRequests async{core::AsyncLimits()};
  const core::AsyncLimits& l = async.limits();
  std::vector<core::AsyncRequests::Ticket> mine;
  for (const std::string s : {"a1", "a2", "a3", "a4"}) {
    for (uint32_t i = 0; i < l.per_session; ++i) {
      absl::StatusOr<core::AsyncRequests::Ticket> t = async.Admit(s, "uid:1", true);
      if (!t.ok()) {
        EXPECT_THAT(t.status(), StatusIs(StatusCode::kResourceExhausted, "wait_event")) << s;
        break;
      }
      mine.push_back(*std::move(t));
    }
  }
  EXPECT_EQ(mine.size(), l.stuck_per_peer) << "the peer's waits are capped at admission";
  // Another peer still gets its wait slots, in two sessions.
  std::vector<core::AsyncRequests::Ticket> theirs;
  for (const std::string s : {"b1", "b2"}) {
    for (uint32_t i = 0; i < l.stuck_per_session; ++i) {
      absl::StatusOr<core::AsyncRequests::Ticket> t = async.Admit(s, "uid:2", true);
      ASSERT_OK(t) << s << " " << i;
      theirs.push_back(*std::move(t));
    }
  }
  // 60 s later every wait turned stuck: still within every cap.
  for (core::AsyncRequests::Ticket& t : mine) t.Abandon();
  for (core::AsyncRequests::Ticket& t : theirs) t.Abandon();
  EXPECT_EQ(async.peer_stuck("uid:1"), l.stuck_per_peer);
  EXPECT_LE(async.stuck(), l.stuck_total);
  EXPECT_EQ(async.waiting(), 0u);
  // A third peer is served: uid:1 did not take the server's stuck cap.
  absl::StatusOr<core::AsyncRequests::Ticket> third = async.Admit("c", "uid:3", true);
  ASSERT_OK(third);
  EXPECT_THAT(async.Admit("a5", "uid:1", true).status(),
              StatusIs(StatusCode::kResourceExhausted,
                       "16 Executes with a wait_event that has not completed (0 waiting on it, "
                       "16 abandoned while waiting on a wait_event) for peer uid:1 (all its "
                       "sessions), the limit is 16"));
  EXPECT_OK(async.Admit("a5", "uid:1", false)) << "no wait_event: not refused for stuck ones";
  mine.clear();
  theirs.clear();
  EXPECT_EQ(async.stuck(), 0u);
}

// A slot goes back as soon as the wait passed (WaitPassed) or the request
// completed: a long pipeline of waits that pass, each request staying in
// flight long after its wait, is never refused by the stuck caps. A ticket
// whose wait passed (or that never had one) cannot turn stuck.
TEST(AsyncRequestsTest, WaitSlotsGoBackWhenTheWaitPasses) {
  core::AsyncRequests async{core::AsyncLimits()};
  const core::AsyncLimits& l = async.limits();
  std::deque<core::AsyncRequests::Ticket> pipeline;
  for (int i = 0; i < 1000; ++i) {
    absl::StatusOr<core::AsyncRequests::Ticket> t = async.Admit("s", "uid:1", true);
    ASSERT_OK(t) << "step " << i;
    EXPECT_EQ(async.waiting("s"), 1u);
    EXPECT_EQ(async.peer_waiting("uid:1"), 1u);
    t->WaitPassed();
    t->WaitPassed();  // once
    EXPECT_EQ(async.waiting(), 0u);
    pipeline.push_back(*std::move(t));
    if (pipeline.size() == l.per_session - 1) pipeline.pop_front();  // the oldest completes
  }
  EXPECT_EQ(async.inflight("s"), l.per_session - 2);
  pipeline.back().Abandon();
  EXPECT_EQ(async.stuck(), 0u) << "its wait passed: it waits on nothing of the client's";
  absl::StatusOr<core::AsyncRequests::Ticket> plain = async.Admit("s", "uid:1", false);
  ASSERT_OK(plain);
  plain->Abandon();
  EXPECT_EQ(async.stuck(), 0u) << "no wait_event: it cannot stick";
  pipeline.clear();
  // Waits that do not pass hold their slots until the request completes.
  std::vector<core::AsyncRequests::Ticket> waits;
  for (uint32_t i = 0; i < l.stuck_per_session; ++i) {
    absl::StatusOr<core::AsyncRequests::Ticket> t = async.Admit("s", "uid:1", true);
    ASSERT_OK(t);
    waits.push_back(*std::move(t));
  }
  EXPECT_THAT(async.Admit("s", "uid:1", true).status(),
              StatusIs(StatusCode::kResourceExhausted,
                       "(8 waiting on it, 0 abandoned while waiting on a wait_event) in this "
                       "session, the limit is 8"));
  waits[0].Complete(absl::OkStatus());
  EXPECT_EQ(async.waiting("s"), l.stuck_per_session - 1);
  EXPECT_OK(async.Admit("s", "uid:1", true));
  waits.clear();
  plain->Complete(absl::OkStatus());
  EXPECT_TRUE(async.WaitAll(absl::Milliseconds(1)));
  EXPECT_EQ(async.waiting(), 0u);
}

}  // namespace
}  // namespace tokensel::testing
