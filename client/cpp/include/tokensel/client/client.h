// Client: one typed call per tokensel.v1.TokenSelect RPC.
//
//   ASSIGN_OR_RETURN(Client client, Client::Connect("unix:///run/tokensel/tokensel.sock"));
//   ASSIGN_OR_RETURN(v1::ServerInfo info, client.GetServerInfo());
//   ASSIGN_OR_RETURN(std::unique_ptr<Session> session, Session::Open(client));
//   ASSIGN_OR_RETURN(v1::OpResponse r, session->client().GatherTokens(request));
//
// A Client is a cheap, copyable handle (a shared channel and stub, options and
// an optional session id); copies share the connection. All methods are
// const and thread-safe.
//
// Every call has a deadline (ClientOptions::deadline unless WithDeadline
// overrides it) and, by default, wait_for_ready: while the channel is
// connecting or reconnecting (backoff from initial_reconnect_backoff up to
// max_reconnect_backoff) the call waits instead of failing at once, bounded
// by its deadline, so a server restart inside the deadline is invisible and
// a dead server ends in DEADLINE_EXCEEDED. With wait_for_ready off, an
// unreachable server fails fast with UNAVAILABLE.
//
// Errors: the server's status (code and message, see the proto's header) via
// FromGrpcStatus; the calls that need a session (all but GetServerInfo, Ping
// and OpenSession) send the "tokensel-session" metadata when the client has a
// session id (WithSession, or Session::client()); without one the server
// answers INVALID_ARGUMENT.
#ifndef TOKENSEL_CLIENT_CLIENT_H_
#define TOKENSEL_CLIENT_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "tokensel/v1/tokensel.grpc.pb.h"
#include "tokensel/v1/tokensel.pb.h"

namespace tokensel::client {

namespace v1 = ::tokensel::v1;

// The metadata key that carries the session id.
inline constexpr char kSessionMetadataKey[] = "tokensel-session";
// The server's default listen address.
inline constexpr char kDefaultTarget[] = "unix:///run/tokensel/tokensel.sock";

struct ClientOptions {
  // Per-call deadline for unary calls; must be > 0.
  absl::Duration deadline = absl::Seconds(30);
  // Deadline of a whole Stream; InfiniteDuration = none.
  absl::Duration stream_deadline = absl::InfiniteDuration();
  // Send and receive limit in bytes (the server's --max_message_bytes is
  // 64 MiB by default).
  int max_message_bytes = 64 << 20;
  // Channel reconnect backoff (GRPC_ARG_INITIAL/MAX_RECONNECT_BACKOFF_MS).
  absl::Duration initial_reconnect_backoff = absl::Milliseconds(100);
  absl::Duration max_reconnect_backoff = absl::Seconds(5);
  bool wait_for_ready = true;
  // TCP security (the server's --tls_cert/--tls_key/--auth_token_file).
  // With `tls`, the channel uses TLS verified against tls_root_certs_pem
  // (PEM; empty = the system roots), and tls_server_name (if set) overrides
  // the name checked against the certificate. A non-empty auth_token is sent
  // on every call as "authorization: Bearer <token>". Unix sockets need
  // neither.
  bool tls = false;
  std::string tls_root_certs_pem;
  std::string tls_server_name;
  std::string auth_token;
  // The server's fd channel (fd_channel.h), used to register memory by
  // descriptor; empty = derived from a unix target ("<socket path>.fd").
  std::string fd_channel;
};

// A bidirectional Stream RPC: requests are answered in order. Not
// thread-safe (one caller at a time). Destroying an open stream cancels it.
class OpStream {
 public:
  ~OpStream();
  OpStream(const OpStream&) = delete;
  OpStream& operator=(const OpStream&) = delete;

  // Sends one request and waits for its response. A transport failure ends
  // the stream and returns its final status; a failed request (response code
  // != 0) is returned as OK with the code in the response. A register_buffer
  // request is resolved like Client::RegisterBuffer (host_shm names and
  // "fd:<n>" tickets become descriptors on the fd channel, for this
  // stream's session); a failure there is returned as the Call's status.
  absl::StatusOr<v1::StreamResponse> Call(const v1::StreamRequest& request);
  // Half-close and collect the final status. Idempotent.
  absl::Status Finish();

  // The stream's session: the client's, or the one the server opened for
  // the stream (sent in its initial metadata; waits for it on first use).
  const std::string& session_id();

 private:
  friend class Client;
  OpStream() = default;
  absl::Status FinishInternal();

  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StreamRequest, v1::StreamResponse>> stream_;
  std::string fd_channel_path_;
  absl::Duration deadline_;
  std::string session_id_;
  bool read_any_ = false;
  bool finished_ = false;
  absl::Status final_status_;
};

class Client {
 public:
  // A client for `target`: "unix:///abs/path", "unix:relative", or
  // "host:port" (TLS per options.tls). No I/O happens here:
  // the channel connects on the first call. INVALID_ARGUMENT for an empty
  // target or invalid options.
  static absl::StatusOr<Client> Connect(absl::string_view target, ClientOptions options = {});
  // A client over an existing channel (tests, custom credentials); only the
  // per-call options apply (deadline, stream_deadline, wait_for_ready,
  // auth_token: sent as metadata, so the channel should be TLS) and
  // fd_channel. The channel's own settings (tls*, message limits, backoff)
  // are the caller's.
  static Client FromChannel(std::shared_ptr<grpc::Channel> channel, ClientOptions options = {});

  // Copies bound to a session id / with another deadline / wait_for_ready.
  Client WithSession(std::string session_id) const;
  Client WithDeadline(absl::Duration deadline) const;
  Client WithWaitForReady(bool wait_for_ready) const;

  const std::string& session_id() const { return session_id_; }
  const ClientOptions& options() const { return options_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  // For raw calls: the generated stub and a context carrying this client's
  // deadline, wait_for_ready and session metadata.
  v1::TokenSelect::Stub& stub() const { return *stub_; }
  std::unique_ptr<grpc::ClientContext> NewContext() const;

  // --- no session needed
  absl::StatusOr<v1::ServerInfo> GetServerInfo() const;
  absl::Status Ping() const;
  absl::StatusOr<v1::OpenSessionResponse> OpenSession(const v1::OpenSessionRequest& request) const;

  // --- session calls
  absl::StatusOr<v1::KeepAliveResponse> KeepAlive() const;
  absl::Status CloseSession() const;
  // Registers memory. The server maps only descriptors the caller hands it
  // (fd_channel.h), so host memory is converted here first:
  //  - host_shm {shm_name, offset, size}: this process opens the object by
  //    name (with its own rights: NOT_FOUND / PERMISSION_DENIED as shm_open
  //    says) and registers its descriptor;
  //  - fd {ticket "fd:<n>", offset, size} (LocalFdTicket, what
  //    SharedRegion::RegisterRequest makes): registers descriptor n, as
  //    FD_KIND_CUDA_VMM when fd.device_uuid is set, else as host memory;
  //  - fd.segments: each "fd:<n>" ticket becomes a ticket of descriptor n
  //    (FD_KIND_CUDA_VMM), in order;
  //  - fd with a server ticket, and cuda_ipc: sent as they are.
  // Descriptors go over the fd channel (FAILED_PRECONDITION for a TCP
  // target without options.fd_channel).
  absl::StatusOr<v1::BufferInfo> RegisterBuffer(const v1::RegisterBufferRequest& request) const;
  // Registers [offset, offset + size) of the memory behind `fd` (a memfd or
  // shm object this process holds; the server keeps its own copy).
  absl::StatusOr<v1::BufferInfo> RegisterFd(std::string name, int fd, uint64_t offset,
                                            uint64_t size) const;
  // Registers [offset, offset + size) of a CUDA VMM allocation: `fd` is what
  // cuMemExportToShareableHandle(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
  // gave for it (the caller keeps and closes it), offset counts from the
  // allocation's start, `device_uuid` is its GPU ("GPU-..."),
  // `allocation_size` the whole allocation's size (cuMemGetAddressRange of
  // its mapping; 0 = unknown): when given, the server maps exactly it, which
  // drivers that refuse partial maps of imported allocations need. The
  // caller exports the handle; this client does not link the CUDA driver.
  absl::StatusOr<v1::BufferInfo> RegisterCudaVmmFd(std::string name, int fd, uint64_t offset,
                                                   uint64_t size, std::string device_uuid,
                                                   uint64_t allocation_size) const;
  // A CUDA VMM buffer that spans several allocations (PyTorch's
  // expandable_segments maps a segment as consecutive chunks, each its own
  // allocation): `segments` in address order, each the descriptor the
  // caller exported for one allocation (kept and closed by the caller) and
  // that allocation's size (> 0, whole granules); [offset, offset + size)
  // counts from the first allocation's start. At most 128 segments (the
  // server's limit). Sent as PassedFd.segments, one fd channel ticket per
  // descriptor; a server older than that field does not know it (use
  // RegisterCudaVmmFd for one allocation).
  struct CudaVmmSegment {
    int fd = -1;
    uint64_t allocation_size = 0;
  };
  absl::StatusOr<v1::BufferInfo> RegisterCudaVmmFds(std::string name,
                                                    const std::vector<CudaVmmSegment>& segments,
                                                    uint64_t offset, uint64_t size,
                                                    std::string device_uuid) const;
  // Where RegisterBuffer sends descriptors (empty: nowhere).
  const std::string& fd_channel_path() const { return fd_channel_path_; }
  absl::Status UnregisterBuffer(absl::string_view name) const;
  absl::StatusOr<v1::ListBuffersResponse> ListBuffers() const;

  absl::StatusOr<v1::OpResponse> SortTokens(const v1::SortTokensRequest& request) const;
  absl::StatusOr<v1::OpResponse> GatherTokens(const v1::GatherTokensRequest& request) const;
  absl::StatusOr<v1::OpResponse> ScatterTokens(const v1::ScatterTokensRequest& request) const;
  absl::StatusOr<v1::OpResponse> GatherBertMask(const v1::GatherBertMaskRequest& request) const;
  absl::StatusOr<v1::OpResponse> SliceGptMask(const v1::SliceGptMaskRequest& request) const;
  absl::StatusOr<v1::OpResponse> SegmentSeqlens(const v1::SegmentSeqlensRequest& request) const;
  absl::StatusOr<v1::OpResponse> SampleTokens(const v1::SampleTokensRequest& request) const;
  absl::StatusOr<v1::OpResponse> TopKTokens(const v1::TopKTokensRequest& request) const;
  absl::StatusOr<v1::OpResponse> MergeTokens(const v1::MergeTokensRequest& request) const;
  absl::StatusOr<v1::OpResponse> SplitTokens(const v1::SplitTokensRequest& request) const;
  absl::StatusOr<v1::OpResponse> SamplePackedTokens(
      const v1::SamplePackedTokensRequest& request) const;
  // Runs any one Op (dispatches on its oneof; INVALID_ARGUMENT if unset).
  absl::StatusOr<v1::OpResponse> RunOp(const v1::Op& op) const;
  absl::StatusOr<v1::ExecuteResponse> Execute(const v1::ExecuteRequest& request) const;

  // Opens a Stream carrying this client's session (if any; without one the
  // stream gets its own session that ends with it).
  absl::StatusOr<std::unique_ptr<OpStream>> OpenStream() const;

 private:
  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options, std::string target);
  // RegisterFd (empty device_uuid) and RegisterCudaVmmFd.
  absl::StatusOr<v1::BufferInfo> RegisterLocalFd(std::string name, int fd, uint64_t offset,
                                                 uint64_t size, std::string device_uuid,
                                                 uint64_t allocation_size) const;
  template <typename Req, typename Resp>
  absl::StatusOr<Resp> Unary(grpc::Status (v1::TokenSelect::Stub::*method)(grpc::ClientContext*,
                                                                           const Req&, Resp*),
                             const Req& request) const;

  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<v1::TokenSelect::Stub> stub_;
  ClientOptions options_;
  std::string fd_channel_path_;
  std::string session_id_;
};

}  // namespace tokensel::client

#endif  // TOKENSEL_CLIENT_CLIENT_H_
