// Client-side helpers for the integration tests and tokensel_rpc_bench:
// status conversion, tensor placement inside a shm region (with an oracle
// mirror), proto tensor builders, and a session-holding client.
//
//   Client client(server->UnixChannel());
//   ASSERT_OK(client.Open());
//   ASSERT_OK(client.Register("arena", shm.name(), 0, shm.size()));
//   Arena arena(shm.size());
//   Placed act = arena.Place(DType::kFloat32, {B, S, C}, {.pad = {0, 1, 3}});
//   req.mutable_activations()->CopyFrom(act.Ref("arena"));
//   absl::Status s = client.Call(&v1::TokenSelect::Stub::GatherTokens, req, &resp);
#ifndef TOKENSEL_TESTS_SERVER_INTEGRATION_CLIENT_UTIL_H_
#define TOKENSEL_TESTS_SERVER_INTEGRATION_CLIENT_UTIL_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "kernels/tensor_view.h"
#include "tokensel/v1/tokensel.grpc.pb.h"

namespace tokensel::itest {

namespace v1 = ::tokensel::v1;
using kernels::DType;

inline constexpr char kSessionKey[] = "tokensel-session";

absl::Status ToAbsl(const grpc::Status& status);
v1::DType ToProto(DType dtype);

// ---------------------------------------------------------------- tensors --

// A tensor placed at `offset` bytes into a region, with explicit strides.
struct Placed {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements
  uint64_t offset = 0;
  uint64_t extent_bytes = 0;  // bytes from offset to one past the last element

  kernels::TensorView View(uint8_t* base) const;
  // By reference into `buffer`; strides sent explicitly unless `row_major`.
  v1::Tensor Ref(const std::string& buffer) const;
  int64_t NumElements() const;
  // The elements in row-major order, packed (as inline data is).
  std::string PackedBytes(const uint8_t* base) const;
};

struct PlaceOptions {
  std::vector<int64_t> pad;  // extra elements per dim (stride padding)
  uint64_t misalign = 0;     // bytes added to a 64-byte aligned offset
};

// A bump allocator of byte ranges in a region of `size` bytes.
class Arena {
 public:
  explicit Arena(uint64_t size) : size_(size) {}
  // Aborts the test process if the region is too small (a test bug).
  Placed Place(DType dtype, std::vector<int64_t> shape, PlaceOptions options = {});
  uint64_t used() const { return next_; }

 private:
  uint64_t size_;
  uint64_t next_ = 0;
};

// Inline tensor (row-major bytes).
v1::Tensor InlineTensor(DType dtype, const std::vector<int64_t>& shape, std::string bytes);
// An output that asks for the result inline ("present without data").
v1::Tensor InlineOutput();

// Fill helpers (operate on views, so strides/padding are respected; gaps are
// filled by FillBytes over the whole region first).
void FillBytes(uint8_t* data, uint64_t size, std::mt19937_64& rng);
// Each row (last dim): `unique` = distinct values in [0, range), else any.
void FillIndices(const kernels::TensorView& v, int64_t range, bool unique, std::mt19937_64& rng);
// Packed THD segment ids, one row per leading index: ids 1..k in runs, then
// padding (0), k <= max_segments.
void FillSegments(const kernels::TensorView& v, int64_t max_segments, std::mt19937_64& rng);

// The inline output named `name`, or nullptr.
const v1::Tensor* FindOutput(const v1::OpResponse& response, const std::string& name);

// ----------------------------------------------------------------- client --

class Client {
 public:
  explicit Client(std::shared_ptr<grpc::Channel> channel,
                  absl::Duration deadline = absl::Seconds(20));

  // The server's fd channel (client::FdChannelPath of its unix target,
  // ServerProcess::fd_channel_path()), through which Register hands over
  // descriptors.
  void set_fd_channel(std::string path) { fd_channel_ = std::move(path); }

  // OpenSession; the id is then sent with every call.
  absl::Status Open(uint64_t lease_ttl_ms = 0);
  const std::string& session() const { return session_; }
  void set_session(std::string session) { session_ = std::move(session); }

  // A context with the session metadata (if any) and the deadline.
  std::unique_ptr<grpc::ClientContext> Context() const;

  template <typename Req, typename Resp>
  absl::Status Call(grpc::Status (v1::TokenSelect::Stub::*method)(grpc::ClientContext*, const Req&,
                                                                  Resp*),
                    const Req& request, Resp* response) const {
    auto ctx = Context();
    return ToAbsl((stub_.get()->*method)(ctx.get(), request, response));
  }

  // Opens shm object `shm_name` here (this process's rights), hands its
  // descriptor to the server on the fd channel and registers [offset,
  // offset + size) of it as `name`.
  absl::StatusOr<v1::BufferInfo> Register(const std::string& name, const std::string& shm_name,
                                          uint64_t offset, uint64_t size) const;
  absl::Status Unregister(const std::string& name) const;
  absl::Status Ping() const;

  v1::TokenSelect::Stub& stub() const { return *stub_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::TokenSelect::Stub> stub_;
  absl::Duration deadline_;
  std::string fd_channel_;
  std::string session_;
};

}  // namespace tokensel::itest

#endif  // TOKENSEL_TESTS_SERVER_INTEGRATION_CLIENT_UTIL_H_
