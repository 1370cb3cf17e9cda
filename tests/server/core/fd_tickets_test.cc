#include "server/core/fd_tickets.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::core {
namespace {

using tokensel::testing::StatusIs;

// Inspects like the host mapper's contract says (regular file and its size),
// counting calls; maps nothing.
class InspectingMapper : public RegionMapper {
 public:
  absl::StatusOr<FdInfo> Inspect(int fd) const override {
    ++inspected;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError("fd: not a regular file");
    }
    return FdInfo{static_cast<uint64_t>(st.st_size), false};
  }
  absl::StatusOr<std::unique_ptr<MappedRegion>> Map(const RegionSpec&) override {
    return absl::UnimplementedError("not here");
  }
  mutable int inspected = 0;
};

UniqueFd Memfd(uint64_t size) {
  UniqueFd fd(memfd_create("t", MFD_CLOEXEC));
  EXPECT_EQ(ftruncate(fd.get(), static_cast<off_t>(size)), 0);
  return fd;
}

// Whether `fd` is still open in this process.
bool IsOpen(int fd) { return fcntl(fd, F_GETFD) >= 0; }

class FdTicketsTest : public ::testing::Test {
 protected:
  FdTicketsTest()
      : sessions_(
            SessionLimits(), [this](const std::string& id) { tickets_.DropSession(id); }, nullptr,
            [this] { return now_; }),
        tickets_(&sessions_, &mapper_, Limits(), [this] { return now_; }) {
    alice_session_ = sessions_.Open("a", absl::ZeroDuration(), alice_)->id;
  }
  static FdTicketLimits Limits() {
    FdTicketLimits limits;
    limits.max_per_session = 2;
    limits.max_total = 3;
    limits.ttl = absl::Seconds(30);
    return limits;
  }

  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
  const Peer alice_ = Peer::Unix(1000, 1000, 10);
  const Peer bob_ = Peer::Unix(1001, 1001, 11);
  InspectingMapper mapper_;
  SessionManager sessions_;
  FdTickets tickets_;
  std::string alice_session_;
};

TEST_F(FdTicketsTest, ATicketIsRedeemedOnceBySessionThatReceivedIt) {
  UniqueFd fd = Memfd(4096);
  const int raw = fd.get();
  absl::StatusOr<FdReceipt> receipt =
      tickets_.Receive(alice_, alice_session_, FdKind::kHostMemory, std::move(fd));
  ASSERT_OK(receipt);
  EXPECT_THAT(receipt->ticket, ::testing::MatchesRegex("[0-9a-f]{32}"));
  EXPECT_EQ(receipt->object_size, 4096u);
  EXPECT_EQ(tickets_.pending(), 1u);
  // Another session cannot redeem it (and learns nothing more than NOT_FOUND).
  const std::string bob_session = sessions_.Open("b", absl::ZeroDuration(), bob_)->id;
  EXPECT_THAT(tickets_.Redeem(bob_session, receipt->ticket),
              StatusIs(absl::StatusCode::kNotFound, "no such ticket"));
  absl::StatusOr<FdTickets::Redeemed> redeemed = tickets_.Redeem(alice_session_, receipt->ticket);
  ASSERT_OK(redeemed);
  EXPECT_EQ(redeemed->fd->get(), raw);  // the very descriptor received
  EXPECT_EQ(redeemed->kind, FdKind::kHostMemory);
  EXPECT_THAT(tickets_.Redeem(alice_session_, receipt->ticket),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(tickets_.pending(), 0u);
}

TEST_F(FdTicketsTest, OnlyTheSessionsOwnerMayHandOverDescriptors) {
  UniqueFd fd = Memfd(64);
  const int raw = fd.get();
  EXPECT_THAT(tickets_.Receive(bob_, alice_session_, FdKind::kHostMemory, std::move(fd)),
              StatusIs(absl::StatusCode::kPermissionDenied, "another peer"));
  EXPECT_FALSE(IsOpen(raw));        // closed on the error path
  EXPECT_EQ(mapper_.inspected, 0);  // refused before looking at the descriptor
  EXPECT_THAT(tickets_.Receive(alice_, "0123", FdKind::kHostMemory, Memfd(64)),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(tickets_.pending(), 0u);
}

TEST_F(FdTicketsTest, WrongDescriptorsAndKindsAreRefusedWhenTheyArrive) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  UniqueFd read_end(pipe_fds[0]);
  close(pipe_fds[1]);
  EXPECT_THAT(tickets_.Receive(alice_, alice_session_, FdKind::kHostMemory, std::move(read_end)),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a regular file"));
  // No VMM mapper (this fixture's tickets): FAILED_PRECONDITION, precisely.
  EXPECT_THAT(tickets_.Receive(alice_, alice_session_, FdKind::kCudaVmm, Memfd(64)),
              StatusIs(absl::StatusCode::kFailedPrecondition, "cannot map CUDA VMM memory"));
  EXPECT_EQ(mapper_.inspected, 1);  // the host mapper never saw the VMM descriptor
  FdTickets no_host(&sessions_, nullptr, Limits(), [this] { return now_; });
  EXPECT_THAT(no_host.Receive(alice_, alice_session_, FdKind::kHostMemory, Memfd(64)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(tickets_.pending(), 0u);
}

// Each kind goes to its own mapper's Inspect, and only there: a host
// descriptor is never inspected by the VMM mapper nor the other way round.
TEST_F(FdTicketsTest, EachKindIsInspectedByItsOwnMapper) {
  InspectingMapper vmm;
  FdTickets both(&sessions_, &mapper_, &vmm, Limits(), [this] { return now_; });
  ASSERT_TRUE(both.Receive(alice_, alice_session_, FdKind::kCudaVmm, Memfd(64)).ok());
  EXPECT_EQ(vmm.inspected, 1);
  EXPECT_EQ(mapper_.inspected, 0);
  ASSERT_TRUE(both.Receive(alice_, alice_session_, FdKind::kHostMemory, Memfd(64)).ok());
  EXPECT_EQ(vmm.inspected, 1);
  EXPECT_EQ(mapper_.inspected, 1);
}

TEST_F(FdTicketsTest, HeldDescriptorsAreBoundedPerSessionAndInAll) {
  const std::string bob_session = sessions_.Open("b", absl::ZeroDuration(), bob_)->id;
  const std::string carol_session =
      sessions_.Open("c", absl::ZeroDuration(), Peer::Unix(1002, 1, 1))->id;
  ASSERT_OK(tickets_.Receive(alice_, alice_session_, FdKind::kHostMemory, Memfd(8)));
  ASSERT_OK(tickets_.Receive(alice_, alice_session_, FdKind::kHostMemory, Memfd(8)));
  UniqueFd third = Memfd(8);
  const int raw = third.get();
  EXPECT_THAT(tickets_.Receive(alice_, alice_session_, FdKind::kHostMemory, std::move(third)),
              StatusIs(absl::StatusCode::kResourceExhausted, "limit per session is 2"));
  EXPECT_FALSE(IsOpen(raw));
  ASSERT_OK(tickets_.Receive(bob_, bob_session, FdKind::kHostMemory, Memfd(8)));
  EXPECT_THAT(
      tickets_.Receive(Peer::Unix(1002, 1, 1), carol_session, FdKind::kHostMemory, Memfd(8)),
      StatusIs(absl::StatusCode::kResourceExhausted, "the limit is 3"));
  EXPECT_EQ(tickets_.pending(), 3u);
}

TEST_F(FdTicketsTest, UnredeemedTicketsExpireAndCloseTheirDescriptors) {
  UniqueFd fd = Memfd(8);
  const int raw = fd.get();
  absl::StatusOr<FdReceipt> receipt =
      tickets_.Receive(alice_, alice_session_, FdKind::kHostMemory, std::move(fd));
  ASSERT_OK(receipt);
  now_ += absl::Seconds(29);
  EXPECT_EQ(tickets_.ReapExpired(), 0);
  now_ += absl::Seconds(1);
  // Expired: no longer redeemable even before the reaper runs...
  EXPECT_THAT(tickets_.Redeem(alice_session_, receipt->ticket),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE(IsOpen(raw));
  // ...and gone, descriptor closed, once it does.
  EXPECT_EQ(tickets_.ReapExpired(), 1);
  EXPECT_FALSE(IsOpen(raw));
  EXPECT_EQ(tickets_.pending(), 0u);
  // The quota is free again.
  EXPECT_OK(tickets_.Receive(alice_, alice_session_, FdKind::kHostMemory, Memfd(8)));
  EXPECT_OK(tickets_.Receive(alice_, alice_session_, FdKind::kHostMemory, Memfd(8)));
}

TEST_F(FdTicketsTest, AnEndingSessionDropsItsTickets) {
  UniqueFd fd = Memfd(8);
  const int raw = fd.get();
  ASSERT_OK(tickets_.Receive(alice_, alice_session_, FdKind::kHostMemory, std::move(fd)));
  ASSERT_OK(sessions_.Close(alice_session_));  // wired to DropSession above
  EXPECT_FALSE(IsOpen(raw));
  EXPECT_EQ(tickets_.pending(), 0u);
}

TEST_F(FdTicketsTest, TicketsAreDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<FdReceipt> r =
        tickets_.Receive(alice_, alice_session_, FdKind::kHostMemory, Memfd(8));
    ASSERT_OK(r);
    seen.insert(r->ticket);
  }
  EXPECT_EQ(seen.size(), 2u);
}

}  // namespace
}  // namespace tokensel::core

namespace tokensel::core {
namespace {

// RedeemAll (PassedFd.segments): all or none. A repeated ticket, an unknown
// one, one of another session or an expired one names its index and uses up
// none of the others; otherwise the descriptors come back in order.
TEST_F(FdTicketsTest, RedeemAllTakesAllOrNone) {
  FdTicketLimits limits = Limits();
  limits.max_per_session = 8;
  limits.max_total = 8;
  FdTickets tickets(&sessions_, &mapper_, limits, [this] { return now_; });
  std::vector<std::string> mine;
  std::vector<int> raw;
  for (int i = 0; i < 3; ++i) {
    UniqueFd fd = Memfd(64);
    raw.push_back(fd.get());
    auto receipt = tickets.Receive(alice_, alice_session_, FdKind::kHostMemory, std::move(fd));
    ASSERT_OK(receipt);
    mine.push_back(receipt->ticket);
  }
  const std::string bob_session = sessions_.Open("b", absl::ZeroDuration(), bob_)->id;
  auto bobs = tickets.Receive(bob_, bob_session, FdKind::kHostMemory, Memfd(64));
  ASSERT_OK(bobs);

  EXPECT_THAT(tickets.RedeemAll(alice_session_, {mine[0], mine[1], mine[0]}, "fd.segments"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "fd.segments[2].ticket is fd.segments[0].ticket again"));
  EXPECT_THAT(tickets.RedeemAll(alice_session_, {mine[0], bobs->ticket, mine[1]}, "fd.segments"),
              StatusIs(absl::StatusCode::kNotFound, "fd.segments[1].ticket: no such ticket"));
  EXPECT_THAT(tickets.RedeemAll(alice_session_, {mine[0], mine[1], "feed"}, "fd.segments"),
              StatusIs(absl::StatusCode::kNotFound, "fd.segments[2].ticket: no such ticket"));
  EXPECT_EQ(tickets.pending(), 4u);  // none used up
  for (int fd : raw) EXPECT_TRUE(IsOpen(fd));

  auto redeemed = tickets.RedeemAll(alice_session_, {mine[2], mine[0], mine[1]}, "fd.segments");
  ASSERT_OK(redeemed);
  ASSERT_EQ(redeemed->size(), 3u);
  EXPECT_EQ((*redeemed)[0].fd->get(), raw[2]);
  EXPECT_EQ((*redeemed)[1].fd->get(), raw[0]);
  EXPECT_EQ((*redeemed)[2].fd->get(), raw[1]);
  EXPECT_EQ(tickets.pending(), 1u);  // bob's
  // Used once: a second use is NOT_FOUND.
  EXPECT_THAT(tickets.RedeemAll(alice_session_, {mine[0]}, "fd.segments"),
              StatusIs(absl::StatusCode::kNotFound, "fd.segments[0].ticket"));
  // Expired.
  now_ += absl::Seconds(31);
  EXPECT_THAT(tickets.RedeemAll(bob_session, {bobs->ticket}, "fd.segments"),
              StatusIs(absl::StatusCode::kNotFound, "fd.segments[0].ticket"));
}

// The default per-session limit lets one VMM buffer of kMaxVmmSegments
// allocations wait for its RegisterBuffer.
TEST(FdTicketLimitsTest, ASessionMayHoldTheTicketsOfTheLargestVmmBuffer) {
  EXPECT_GE(FdTicketLimits().max_per_session, kMaxVmmSegments);
}

}  // namespace
}  // namespace tokensel::core
