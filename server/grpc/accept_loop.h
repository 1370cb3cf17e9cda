// AcceptLoop: the server accepts every connection itself, on one thread,
// and hands the gRPC ones to gRPC.
//
// Why not gRPC's own listeners: gRPC 1.51's accept loop gives up for good on
// EMFILE (grpc/grpc#16058, #20418), so a burst of connections at the
// descriptor limit left the server deaf after the burst; and on a unix
// socket gRPC cannot say who connected. Here:
//  - one thread, epoll over the listening sockets, the fd-channel
//    connections and an eventfd (Stop);
//  - accept4(SOCK_NONBLOCK | SOCK_CLOEXEC); the peer is asked of the kernel
//    (unix: SO_PEERCRED; TCP: getpeername, TCP_NODELAY set) and recorded in
//    the ConnectionTable, which enforces the caps: a connection over a cap
//    is closed at once (counted in tokensel_connections_refused_total,
//    logged at most every 10 s per reason);
//  - gRPC connections (unix, TCP) go to the ConnectionSink;
//  - fd-channel connections (SOCK_SEQPACKET, fd_channel_protocol.h) are
//    served here: each packet is answered with FdChannelReply; a reply that
//    cannot be sent at once, or a connection idle for
//    `fd_channel_idle_timeout`, drops the connection; at most 16 packets per
//    connection per wake-up, so one client cannot hold the loop;
//  - EMFILE/ENFILE from accept: the spare descriptor (/dev/null, opened at
//    Start) is closed, the pending connection accepted and closed, the spare
//    reopened, and the listeners pause for `fd_limit_backoff`; accepting
//    never stops;
//  - every `sweep_interval` the table drops connections gRPC has closed and
//    idle fd-channel connections are closed.
// Nothing on the loop waits for a client: every socket is non-blocking.
//
// Threading: AddListener and Start from one thread before the loop runs;
// Stop from any thread, idempotent (the destructor calls it). The sink and
// FdReceiver::Receive are called on the loop thread and must not block.
#ifndef TOKENSEL_SERVER_GRPC_ACCEPT_LOOP_H_
#define TOKENSEL_SERVER_GRPC_ACCEPT_LOOP_H_

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "server/core/fd_channel.h"
#include "server/core/peer.h"
#include "server/core/service_metrics.h"
#include "server/grpc/connection_table.h"

namespace tokensel::server {

// Where accepted gRPC connections go.
class ConnectionSink {
 public:
  virtual ~ConnectionSink() = default;
  // Takes `fd`, a connection (kUnix or kTcp) accepted on `listener_fd` and
  // already recorded in the ConnectionTable. On the loop thread.
  virtual void HandOff(Transport transport, int listener_fd, UniqueFd fd) = 0;
};

struct AcceptLoopOptions {
  absl::Duration fd_channel_idle_timeout = absl::Seconds(30);
  absl::Duration sweep_interval = absl::Seconds(1);
  absl::Duration fd_limit_backoff = absl::Milliseconds(100);
};

class AcceptLoop {
 public:
  // `table` must outlive the loop; `metrics` may be null.
  AcceptLoop(AcceptLoopOptions options, ConnectionTable* table, core::ServiceMetrics* metrics);
  ~AcceptLoop();
  AcceptLoop(const AcceptLoop&) = delete;
  AcceptLoop& operator=(const AcceptLoop&) = delete;

  // A listening socket (non-blocking): kUnix and kTcp feed the sink,
  // kFdChannel is served with the receiver. Before Start.
  void AddListener(Transport transport, UniqueFd listener);

  // Opens the epoll set, the eventfd and the spare descriptor and starts the
  // thread. `receiver` is required when there are kFdChannel listeners.
  // Both must outlive the loop. INTERNAL when a descriptor cannot be made.
  absl::Status Start(ConnectionSink* sink, core::FdReceiver* receiver);

  // Stops and joins the thread, then closes the listeners and every
  // fd-channel connection (forgetting them in the table).
  void Stop();

 private:
  struct Listener {
    Transport transport;
    UniqueFd fd;
  };
  struct FdConnection {
    UniqueFd fd;
    core::Peer peer;
    absl::Time last_active;
  };
  struct LogLimit {
    absl::Time next = absl::InfinitePast();
    uint64_t suppressed = 0;
  };

  void Run();
  void AcceptOn(Listener& listener);
  void RecoverFromFdLimit(Listener& listener, int err);
  void PauseListeners(absl::Time until);
  void ResumeListeners();
  void Refuse(RefuseReason reason, const core::Peer& peer, Transport transport);
  void ServeFdConnection(int fd, uint32_t events);
  void CloseFdConnection(int fd);
  void Housekeeping(absl::Time now);

  const AcceptLoopOptions options_;
  ConnectionTable* const table_;
  core::ServiceMetrics* const metrics_;
  ConnectionSink* sink_ = nullptr;
  core::FdReceiver* receiver_ = nullptr;

  std::vector<Listener> listeners_;
  UniqueFd epoll_;
  UniqueFd wake_;   // eventfd: Stop
  UniqueFd spare_;  // /dev/null, given up to drain a connection at EMFILE
  std::thread thread_;
  std::atomic<bool> stopping_{false};

  // Loop thread only.
  absl::flat_hash_map<int, FdConnection> fd_connections_;
  absl::Time paused_until_ = absl::InfinitePast();
  bool paused_ = false;
  absl::Time next_housekeeping_ = absl::InfinitePast();
  LogLimit refuse_log_[3];
  LogLimit accept_error_log_;
};

}  // namespace tokensel::server

#endif  // TOKENSEL_SERVER_GRPC_ACCEPT_LOOP_H_
