// AsyncRequests (server/core/async_requests.h): the admission caps, the
// deferred errors, waiting, and the stuck caps of abandoned requests.
#include "server/core/async_requests.h"

#include <algorithm>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {
namespace {

using ::absl::StatusCode;

// The stuck caps (async_requests.h): per session, then server-wide; only
// for requests that may get stuck; an abandoned ticket counts as stuck, not
// in flight, and keeps its admission (the second read of the seventh
// review, finding 3).
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
  // Stuck ones keep their admission: the session's (2) and the server's (3)
  // are taken.
  EXPECT_THAT(async.Admit("s", "", false).status(),
              StatusIs(StatusCode::kResourceExhausted,
                       "2 Executes with events outstanding (0 in flight: answered before "
                       "completion, or waiting on a client event; 2 stuck"));
  EXPECT_THAT(async.Admit("u", "", false).status(),
              StatusIs(StatusCode::kResourceExhausted, "in the server, the limit is 3"));
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
  // sessions; a stuck ticket counts as stuck, not in flight, and still
  // takes the peer's admission.
  held[0].Abandon();
  held[1].Abandon();
  EXPECT_EQ(async.peer_stuck("uid:1"), 2u);
  EXPECT_EQ(async.peer_inflight("uid:1"), 1u);
  EXPECT_THAT(async.Admit("p5", "uid:1", true).status(),
              StatusIs(StatusCode::kResourceExhausted, "for peer uid:1 (all its sessions)"));
  EXPECT_THAT(async.Admit("p5", "uid:1", false).status(),
              StatusIs(StatusCode::kResourceExhausted, "1 in flight"))
      << "stuck ones count";
  held[2].Complete(absl::OkStatus());
  EXPECT_OK(async.Admit("p5", "uid:1", false)) << "2 stuck + 1 in flight <= 3";
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
// wait_event now takes a wait slot under the wait caps, kept when it turns
// stuck: waiting + stuck never exceeds a cap. With the server's defaults
// (the seventh review's numbers: 8 per session, 64 per peer, 256 in all).
TEST(AsyncRequestsTest, WaitsThatNeverPassCannotExceedTheStuckCaps) {
  core::AsyncRequests async{core::AsyncLimits()};
  const core::AsyncLimits& l = async.limits();
  ASSERT_EQ(l.stuck_per_session, 8u);
  ASSERT_EQ(l.stuck_per_peer, 64u);
  ASSERT_EQ(l.stuck_total, 256u);
  // Admits waits for `peer` in new sessions "<peer>/0", "<peer>/1", ... (at
  // most `per_session_asked` each) until `count` were admitted or one is
  // refused (its status in `*refused`).
  std::map<std::string, int> sessions_of;
  auto fill = [&](const std::string& peer, uint32_t count, uint32_t per_session_asked,
                  std::vector<core::AsyncRequests::Ticket>* out, absl::Status* refused) {
    for (uint32_t n = 0; n < count;) {
      const std::string session = absl::StrCat(peer, "/", sessions_of[peer]++);
      for (uint32_t i = 0; i < per_session_asked && n < count; ++i, ++n) {
        absl::StatusOr<core::AsyncRequests::Ticket> t = async.Admit(session, peer, true);
        if (!t.ok()) {
          *refused = t.status();
          return;
        }
        out->push_back(*std::move(t));
      }
    }
  };
  std::vector<core::AsyncRequests::Ticket> mine;
  absl::Status refused;
  // Asking 16 per session: the session's cap (8) refuses the 9th.
  fill("uid:1", 16, 16, &mine, &refused);
  EXPECT_THAT(refused, StatusIs(StatusCode::kResourceExhausted, "in this session, the limit is 8"));
  EXPECT_EQ(mine.size(), 8u);
  // Many sessions: the peer's cap.
  refused = absl::OkStatus();
  fill("uid:1", 1000, 8, &mine, &refused);
  EXPECT_THAT(refused, StatusIs(StatusCode::kResourceExhausted, "for peer uid:1"));
  EXPECT_EQ(mine.size(), l.stuck_per_peer) << "the peer's waits are capped at admission";
  // Another peer still gets its wait slots, in two sessions.
  std::vector<core::AsyncRequests::Ticket> theirs;
  refused = absl::OkStatus();
  fill("uid:2", 2 * l.stuck_per_session, l.stuck_per_session, &theirs, &refused);
  ASSERT_OK(refused);
  // 60 s later every wait turned stuck: still within every cap.
  for (core::AsyncRequests::Ticket& t : mine) t.Abandon();
  for (core::AsyncRequests::Ticket& t : theirs) t.Abandon();
  EXPECT_EQ(async.peer_stuck("uid:1"), l.stuck_per_peer);
  EXPECT_LE(async.stuck(), l.stuck_total);
  EXPECT_EQ(async.waiting(), 0u);
  // A third peer is served: uid:1 did not take the server's wait cap.
  absl::StatusOr<core::AsyncRequests::Ticket> third = async.Admit("c", "uid:3", true);
  ASSERT_OK(third);
  EXPECT_THAT(async.Admit("uid:1/x", "uid:1", true).status(),
              StatusIs(StatusCode::kResourceExhausted,
                       "64 Executes with a wait_event that has not completed (0 waiting on it, "
                       "64 abandoned while waiting on a wait_event) for peer uid:1 (all its "
                       "sessions), the limit is 64"));
  EXPECT_THAT(async.Admit("uid:1/x", "uid:1", false).status(),
              StatusIs(StatusCode::kResourceExhausted, "for peer uid:1"))
      << "its stuck ones keep its admission";
  EXPECT_OK(async.Admit("c", "uid:3", false)) << "not another peer's";
  // The server's cap, by construction too: more peers fill it (waiting and
  // stuck mixed), and the first wait beyond it is refused, whoever asks.
  std::vector<core::AsyncRequests::Ticket> others;
  for (int peer = 4; refused.ok() || !absl::StrContains(refused.message(), "in the server");
       ++peer) {
    refused = absl::OkStatus();
    ASSERT_LT(peer, 20) << "the server's cap never refused";
    fill(absl::StrCat("uid:", peer), l.stuck_per_peer, l.stuck_per_session, &others, &refused);
    if (peer % 2 == 0) {
      for (core::AsyncRequests::Ticket& t : others) t.Abandon();
    }
  }
  EXPECT_THAT(refused, StatusIs(StatusCode::kResourceExhausted, "in the server, the limit is 256"));
  EXPECT_EQ(async.waiting() + async.stuck(), l.stuck_total);
  EXPECT_THAT(async.Admit("d", "uid:99", true).status(),
              StatusIs(StatusCode::kResourceExhausted, "in the server, the limit is 256"));
  *third = core::AsyncRequests::Ticket();
  EXPECT_OK(async.Admit("d", "uid:99", true)) << "a slot given back is taken again";
  mine.clear();
  theirs.clear();
  others.clear();
  EXPECT_EQ(async.stuck(), 0u);
}

// The second read of the seventh review, finding 3: a stuck request left
// the admission caps, so one peer with per_peer (64) stuck Executes, each
// holding its memory reservation (up to the per-request bound) for as long
// as it leaves its events unrecorded, was admitted 64 more; what stuck
// requests pin was not bounded by what admission lets in flight pin. Now a
// peer's in flight + stuck stays within per_peer: with its cap's worth
// stuck it admits nothing more, with or without a wait_event, while
// another peer is served.
TEST(AsyncRequestsTest, APeerWithItsCapOfStuckRequestsAdmitsNoMoreAnotherPeerDoes) {
  core::AsyncRequests async{core::AsyncLimits()};
  const core::AsyncLimits& l = async.limits();
  ASSERT_EQ(l.per_peer, l.stuck_per_peer);  // the defaults: the whole cap can turn stuck
  std::vector<core::AsyncRequests::Ticket> stuck;
  for (uint32_t i = 0; i < l.per_peer; ++i) {
    const std::string session = absl::StrCat("s", i / l.stuck_per_session);
    absl::StatusOr<core::AsyncRequests::Ticket> t = async.Admit(session, "uid:1", true);
    ASSERT_OK(t) << i;
    stuck.push_back(*std::move(t));
  }
  for (core::AsyncRequests::Ticket& t : stuck) t.Abandon();  // 60 s later
  EXPECT_EQ(async.peer_stuck("uid:1"), l.per_peer);
  EXPECT_EQ(async.peer_inflight("uid:1"), 0u);
  for (bool wait : {false, true}) {
    EXPECT_THAT(async.Admit("fresh", "uid:1", wait).status(),
                StatusIs(StatusCode::kResourceExhausted, "for peer uid:1 (all its sessions)"))
        << "wait_event " << wait << ": admitted beyond the peer's cap";
  }
  EXPECT_LE(async.peer_inflight("uid:1") + async.peer_stuck("uid:1"), l.per_peer);
  // Another peer: in flight, and with a wait_event.
  absl::StatusOr<core::AsyncRequests::Ticket> other = async.Admit("o", "uid:2", false);
  ASSERT_OK(other);
  ASSERT_OK(async.Admit("o", "uid:2", true));
  // One of the peer's events completes: one admission back.
  stuck.pop_back();
  EXPECT_OK(async.Admit("fresh", "uid:1", false));
  stuck.clear();
  EXPECT_EQ(async.stuck(), 0u);
}

// The seventh review: the wait caps count *pending* waits, so at 16 per
// peer and 64 per server they refused well-behaved pipelines (one uid is
// every worker of a job). 3 peers x 16 workers (sessions), each keeping 2
// steps queued ahead of its events (96 waits pending, 32 per peer), whose
// waits all pass (in a random interleaving) and whose requests complete a
// step later: never refused with the defaults.
TEST(AsyncRequestsTest, PipelinedWaitsThatPassAreNeverRefused) {
  core::AsyncRequests async{core::AsyncLimits()};
  struct Worker {
    std::string session;
    std::string peer;
    std::deque<core::AsyncRequests::Ticket> waiting;  // oldest first
    std::deque<core::AsyncRequests::Ticket> passed;   // still in flight
  };
  std::vector<Worker> workers(3 * 16);
  for (size_t i = 0; i < workers.size(); ++i) {
    workers[i].peer = absl::StrCat("uid:", i / 16);
    workers[i].session = absl::StrCat("s", i);
  }
  std::mt19937 rng(7);
  uint32_t most_waiting = 0;
  for (int step = 0; step < 20000; ++step) {
    Worker& w = workers[rng() % workers.size()];
    if (w.waiting.size() < 2) {
      absl::StatusOr<core::AsyncRequests::Ticket> t = async.Admit(w.session, w.peer, true);
      ASSERT_OK(t) << "step " << step << ", " << w.session << " with " << w.waiting.size()
                   << " waits queued, " << async.peer_waiting(w.peer) << " for its peer, "
                   << async.waiting() << " in the server";
      w.waiting.push_back(*std::move(t));
      most_waiting = std::max(most_waiting, async.waiting());
      continue;
    }
    // Its oldest wait passes (the completion thread saw the marker); the
    // request before it completes.
    w.waiting.front().WaitPassed();
    w.passed.push_back(std::move(w.waiting.front()));
    w.waiting.pop_front();
    if (w.passed.size() > 1) {
      w.passed.front().Complete(absl::OkStatus());
      w.passed.pop_front();
    }
  }
  EXPECT_GT(most_waiting, 64u) << "the test must queue more than the old server-wide cap";
  EXPECT_EQ(async.rejected(), 0u);
  EXPECT_EQ(async.stuck(), 0u);
  workers.clear();
  EXPECT_TRUE(async.WaitAll(absl::Milliseconds(1)));
}

// The server's flags --max_waits_per_session <= --max_waits_per_peer <=
// --max_waits, all > 0 (Server::Start refuses others with this status).
TEST(AsyncRequestsTest, TheWaitCapsMustNestAndBePositive) {
  EXPECT_OK(core::AsyncLimits().CheckWaitCaps());
  auto caps = [](uint32_t session, uint32_t peer, uint32_t total) {
    core::AsyncLimits l;
    l.stuck_per_session = session;
    l.stuck_per_peer = peer;
    l.stuck_total = total;
    return l.CheckWaitCaps();
  };
  EXPECT_OK(caps(1, 1, 1));
  EXPECT_OK(caps(8, 8, 300));
  EXPECT_THAT(caps(0, 64, 256),
              StatusIs(StatusCode::kInvalidArgument,
                       "0 < --max_waits_per_session <= --max_waits_per_peer <= --max_waits, not "
                       "0, 64, 256"));
  EXPECT_THAT(caps(65, 64, 256), StatusIs(StatusCode::kInvalidArgument, "not 65, 64, 256"));
  EXPECT_THAT(caps(8, 257, 256), StatusIs(StatusCode::kInvalidArgument, "not 8, 257, 256"));
  EXPECT_THAT(caps(8, 64, 0), StatusIs(StatusCode::kInvalidArgument, "not 8, 64, 0"));
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
