// AsyncRequests (server/core/async_requests.h): the admission caps, the
// deferred errors, waiting, and the stuck caps of abandoned requests.
#include "server/core/async_requests.h"

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
  limits.stuck_per_peer = 2;
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
  // Stuck: the peer's stuck cap applies across its sessions, and a stuck
  // ticket no longer counts in flight for the peer.
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

}  // namespace
}  // namespace tokensel::testing
