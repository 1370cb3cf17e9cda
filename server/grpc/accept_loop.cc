#include "server/grpc/accept_loop.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/errno_string.h"
#include "common/log.h"
#include "server/grpc/fd_channel_protocol.h"

namespace tokensel::server {
namespace {

// epoll data: kind in the high 32 bits, an index or a descriptor below.
enum Tag : uint64_t { kListenerTag = 1, kWakeTag = 2, kFdConnectionTag = 3 };
uint64_t Data(Tag tag, uint32_t value) { return (uint64_t{tag} << 32) | value; }

constexpr int kAcceptBatch = 64;       // per listener per wake-up
constexpr int kPacketsPerWakeup = 16;  // per fd-channel connection
constexpr absl::Duration kLogInterval = absl::Seconds(10);

UniqueFd OpenSpare() { return UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC)); }

// Who is on `fd`, as the kernel says. False when it cannot tell.
bool Identify(Transport transport, int fd, core::Peer* peer) {
  if (transport != Transport::kTcp) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
    *peer = core::Peer::Unix(cred.uid, cred.gid, cred.pid);
    return true;
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return false;
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, text,
                sizeof(text));
  } else if (addr.ss_family == AF_INET6) {
    const in6_addr& a6 = reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a6)) {  // as gRPC reports it: ipv4:a.b.c.d
      ::inet_ntop(AF_INET, &a6.s6_addr[12], text, sizeof(text));
    } else {
      ::inet_ntop(AF_INET6, &a6, text, sizeof(text));
    }
  } else {
    return false;
  }
  *peer = core::Peer::Tcp(text);
  return true;
}

}  // namespace

AcceptLoop::AcceptLoop(AcceptLoopOptions options, ConnectionTable* table,
                       core::ServiceMetrics* metrics)
    : options_(options), table_(table), metrics_(metrics) {}

AcceptLoop::~AcceptLoop() { Stop(); }

void AcceptLoop::AddListener(Transport transport, UniqueFd listener) {
  listeners_.push_back(Listener{transport, std::move(listener)});
}

absl::Status AcceptLoop::Start(ConnectionSink* sink, core::FdReceiver* receiver) {
  sink_ = sink;
  receiver_ = receiver;
  for (const Listener& l : listeners_) {
    if (l.transport == Transport::kFdChannel && receiver_ == nullptr) {
      return absl::InternalError("accept loop: an fd-channel listener needs an FdReceiver");
    }
  }
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  spare_ = OpenSpare();
  if (!epoll_.valid() || !wake_.valid() || !spare_.valid()) {
    return absl::InternalError(absl::StrCat("accept loop: ", ErrnoString(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = Data(kWakeTag, 0);
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev) != 0) {
    return absl::InternalError(absl::StrCat("accept loop: epoll_ctl: ", ErrnoString(errno)));
  }
  for (size_t i = 0; i < listeners_.size(); ++i) {
    ev.events = EPOLLIN;
    ev.data.u64 = Data(kListenerTag, static_cast<uint32_t>(i));
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listeners_[i].fd.get(), &ev) != 0) {
      return absl::InternalError(absl::StrCat("accept loop: epoll_ctl: ", ErrnoString(errno)));
    }
  }
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void AcceptLoop::Stop() {
  if (stopping_.exchange(true)) {
    return;
  }
  if (wake_.valid()) {
    const uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  for (auto& [fd, connection] : fd_connections_) table_->Remove(fd);
  fd_connections_.clear();
  listeners_.clear();
}

void AcceptLoop::Run() {
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  while (!stopping_.load(std::memory_order_relaxed)) {
    absl::Time now = absl::Now();
    absl::Time next = next_housekeeping_;
    if (paused_) next = std::min(next, paused_until_);
    const int64_t timeout_ms = std::clamp<int64_t>(
        absl::ToInt64Milliseconds(absl::Ceil(next - now, absl::Milliseconds(1))), 0, 1000);
    const int n = ::epoll_wait(epoll_.get(), events, kMaxEvents, static_cast<int>(timeout_ms));
    if (n < 0 && errno != EINTR) {
      TS_LOG(ERROR) << "accept loop: epoll_wait: " << ErrnoString(errno);
      absl::SleepFor(absl::Milliseconds(10));
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64 >> 32;
      const uint32_t value = static_cast<uint32_t>(events[i].data.u64);
      if (tag == kWakeTag) return;
      if (tag == kListenerTag) {
        if (!paused_) AcceptOn(listeners_[value]);
      } else if (tag == kFdConnectionTag) {
        ServeFdConnection(static_cast<int>(value), events[i].events);
      }
    }
    now = absl::Now();
    if (paused_ && now >= paused_until_) ResumeListeners();
    if (now >= next_housekeeping_) Housekeeping(now);
  }
}

void AcceptLoop::AcceptOn(Listener& listener) {
  for (int i = 0; i < kAcceptBatch; ++i) {
    if (!spare_.valid()) spare_ = OpenSpare();
    const int fd = ::accept4(listener.fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if (err == EMFILE || err == ENFILE) {
        RecoverFromFdLimit(listener, err);
        return;
      }
      // ENOBUFS, ENOMEM, ...: transient; try again shortly.
      const absl::Time now = absl::Now();
      if (now >= accept_error_log_.next) {
        TS_LOG(WARNING) << "accept on a " << TransportName(listener.transport)
                        << " listener: " << ErrnoString(err) << "; backing off";
        accept_error_log_.next = now + kLogInterval;
      }
      PauseListeners(now + options_.fd_limit_backoff);
      return;
    }
    UniqueFd connection(fd);
    core::Peer peer;
    if (!Identify(listener.transport, fd, &peer)) continue;  // gone already
    if (std::optional<RefuseReason> reason = table_->Add(fd, listener.transport, peer)) {
      Refuse(*reason, peer, listener.transport);
      continue;  // closed here
    }
    TS_LOG(DEBUG) << "accepted " << TransportName(listener.transport) << " connection fd " << fd
                  << " from " << peer.Principal()
                  << (peer.kind == core::Peer::Kind::kUnix ? absl::StrCat(" pid ", peer.pid) : "");
    if (listener.transport == Transport::kFdChannel) {
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.u64 = Data(kFdConnectionTag, static_cast<uint32_t>(fd));
      if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
        table_->Remove(fd);
        continue;
      }
      fd_connections_[fd] = FdConnection{std::move(connection), std::move(peer), absl::Now()};
      continue;
    }
    if (listener.transport == Transport::kTcp) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    sink_->HandOff(listener.transport, listener.fd.get(), std::move(connection));
  }
}

void AcceptLoop::RecoverFromFdLimit(Listener& listener, int err) {
  // Give up the spare so that one accept can succeed, and close what it
  // returns: the client sees its connection closed instead of waiting in the
  // backlog, and the listener does not stay readable forever.
  spare_.reset();
  const int fd = ::accept4(listener.fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  core::Peer peer;
  if (fd >= 0) {
    Identify(listener.transport, fd, &peer);
    ::close(fd);
  }
  spare_ = OpenSpare();
  Refuse(RefuseReason::kFdLimit, peer, listener.transport);
  TS_LOG(DEBUG) << "accept: " << ErrnoString(err) << "; spare descriptor "
                << (spare_.valid() ? "restored" : "not restored yet");
  PauseListeners(absl::Now() + options_.fd_limit_backoff);
}

void AcceptLoop::PauseListeners(absl::Time until) {
  paused_until_ = until;
  if (paused_) return;
  paused_ = true;
  for (size_t i = 0; i < listeners_.size(); ++i) {
    epoll_event ev{};
    ev.events = 0;
    ev.data.u64 = Data(kListenerTag, static_cast<uint32_t>(i));
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listeners_[i].fd.get(), &ev);
  }
}

void AcceptLoop::ResumeListeners() {
  paused_ = false;
  for (size_t i = 0; i < listeners_.size(); ++i) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = Data(kListenerTag, static_cast<uint32_t>(i));
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listeners_[i].fd.get(), &ev);
  }
}

void AcceptLoop::Refuse(RefuseReason reason, const core::Peer& peer, Transport transport) {
  if (metrics_ != nullptr) metrics_->CountRefusedConnection(RefuseReasonName(reason));
  LogLimit& limit = refuse_log_[static_cast<int>(reason)];
  const absl::Time now = absl::Now();
  if (now < limit.next) {
    ++limit.suppressed;
    return;
  }
  std::string detail;
  switch (reason) {
    case RefuseReason::kMaxConnections:
      detail = absl::StrCat(table_->size(), " connections open, --max_connections ",
                            table_->max_connections());
      break;
    case RefuseReason::kMaxConnectionsPerPeer:
      detail = absl::StrCat(peer.Principal(), " has ", table_->count_for(peer.Principal()),
                            " connections open, --max_connections_per_peer ",
                            table_->max_connections_per_peer());
      break;
    case RefuseReason::kFdLimit:
      detail = "the server is at its descriptor limit (RLIMIT_NOFILE)";
      break;
  }
  TS_LOG(WARNING) << "refused a " << TransportName(transport) << " connection from "
                  << peer.Principal() << ": " << detail << " (" << RefuseReasonName(reason) << "; "
                  << limit.suppressed << " more refused since the last such line)";
  limit.suppressed = 0;
  limit.next = now + kLogInterval;
}

void AcceptLoop::ServeFdConnection(int fd, uint32_t events) {
  auto it = fd_connections_.find(fd);
  if (it == fd_connections_.end()) return;
  FdConnection& connection = it->second;
  if ((events & EPOLLIN) == 0 && (events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) != 0) {
    CloseFdConnection(fd);
    return;
  }
  for (int i = 0; i < kPacketsPerWakeup; ++i) {
    FdChannelPacket packet;
    const FdChannelRead read = ReadFdChannelPacket(fd, &packet);
    if (read == FdChannelRead::kWouldBlock) return;
    if (read == FdChannelRead::kClosed) {
      CloseFdConnection(fd);
      return;
    }
    connection.last_active = absl::Now();
    const v1::FdChannelReply reply =
        HandleFdChannelPacket(std::move(packet), connection.peer, *receiver_);
    TS_LOG(DEBUG) << "fd channel: " << connection.peer.Principal() << " -> code " << reply.code()
                  << (reply.code() == 0 ? "" : absl::StrCat(" ", reply.message()));
    if (!SendFdChannelReply(fd, reply)) {
      CloseFdConnection(fd);  // a client that does not read its replies
      return;
    }
  }
  // More packets may be waiting: epoll is level-triggered and comes back.
}

void AcceptLoop::CloseFdConnection(int fd) {
  auto it = fd_connections_.find(fd);
  if (it == fd_connections_.end()) return;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  table_->Remove(fd);  // before the number can be reused
  fd_connections_.erase(it);
}

void AcceptLoop::Housekeeping(absl::Time now) {
  next_housekeeping_ = now + options_.sweep_interval;
  table_->Sweep();
  std::vector<int> idle;
  for (const auto& [fd, connection] : fd_connections_) {
    if (now - connection.last_active >= options_.fd_channel_idle_timeout) idle.push_back(fd);
  }
  for (int fd : idle) {
    TS_LOG(DEBUG) << "fd channel: closing idle connection of "
                  << fd_connections_[fd].peer.Principal();
    CloseFdConnection(fd);
  }
}

}  // namespace tokensel::server
