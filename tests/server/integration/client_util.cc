#include "tests/server/integration/client_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "tokensel/client/fd_channel.h"

namespace tokensel::itest {

absl::Status ToAbsl(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

v1::DType ToProto(DType dtype) {
  // The proto enum is the kernels enum shifted by one (0 = UNSPECIFIED).
  return static_cast<v1::DType>(static_cast<int>(dtype) + 1);
}

// ---------------------------------------------------------------- tensors --

kernels::TensorView Placed::View(uint8_t* base) const {
  return kernels::TensorView::Strided(base + offset, dtype, shape, strides);
}

v1::Tensor Placed::Ref(const std::string& buffer) const {
  v1::Tensor t;
  t.set_dtype(ToProto(dtype));
  for (int64_t d : shape) t.add_shape(d);
  for (int64_t s : strides) t.add_strides(s);
  t.mutable_buffer()->set_buffer(buffer);
  t.mutable_buffer()->set_byte_offset(offset);
  return t;
}

int64_t Placed::NumElements() const {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

std::string Placed::PackedBytes(const uint8_t* base) const {
  const kernels::TensorView v = View(const_cast<uint8_t*>(base));
  const int64_t esize = kernels::ElementSize(dtype);
  std::string out(static_cast<size_t>(NumElements() * esize), '\0');
  for (int64_t i = 0; i < NumElements(); ++i) {
    std::memcpy(out.data() + i * esize, v.At(kernels::LinearToOffset(v, i)),
                static_cast<size_t>(esize));
  }
  return out;
}

Placed Arena::Place(DType dtype, std::vector<int64_t> shape, PlaceOptions options) {
  Placed p;
  p.dtype = dtype;
  p.shape = std::move(shape);
  const int rank = static_cast<int>(p.shape.size());
  p.strides.assign(rank, 1);
  int64_t stride = 1;
  int64_t last = 0;  // element offset of the last element
  for (int d = rank - 1; d >= 0; --d) {
    p.strides[d] = stride;
    last += (p.shape[d] - 1) * stride;
    const int64_t pad = d < static_cast<int>(options.pad.size()) ? options.pad[d] : 0;
    stride *= p.shape[d] + pad;
  }
  const int64_t esize = kernels::ElementSize(dtype);
  p.extent_bytes = static_cast<uint64_t>((last + 1) * esize);
  p.offset = ((next_ + 63) & ~uint64_t{63}) + options.misalign;
  next_ = p.offset + p.extent_bytes;
  if (next_ > size_) {
    std::fprintf(stderr, "Arena: %llu bytes needed, region has %llu\n",
                 static_cast<unsigned long long>(next_), static_cast<unsigned long long>(size_));
    std::abort();
  }
  return p;
}

v1::Tensor InlineTensor(DType dtype, const std::vector<int64_t>& shape, std::string bytes) {
  v1::Tensor t;
  t.set_dtype(ToProto(dtype));
  for (int64_t d : shape) t.add_shape(d);
  t.set_inline_data(std::move(bytes));
  return t;
}

v1::Tensor InlineOutput() { return v1::Tensor(); }

void FillBytes(uint8_t* data, uint64_t size, std::mt19937_64& rng) {
  for (uint64_t i = 0; i < size; ++i) data[i] = static_cast<uint8_t>(rng());
}

void FillIndices(const kernels::TensorView& v, int64_t range, bool unique, std::mt19937_64& rng) {
  const int64_t cols = v.shape[v.rank - 1];
  std::vector<int64_t> perm(static_cast<size_t>(range));
  for (int64_t row = 0; row < v.NumRows(); ++row) {
    const int64_t base = kernels::RowOffset(v, row);
    if (unique) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
    }
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t value = unique ? perm[static_cast<size_t>(c)]
                                   : static_cast<int64_t>(rng() % static_cast<uint64_t>(range));
      kernels::StoreIndex(v, base + c * v.strides[v.rank - 1], value);
    }
  }
}

void FillSegments(const kernels::TensorView& v, int64_t max_segments, std::mt19937_64& rng) {
  const int64_t t_len = v.shape[v.rank - 1];
  for (int64_t row = 0; row < v.NumRows(); ++row) {
    const int64_t base = kernels::RowOffset(v, row);
    // Up to max_segments runs of random length, then padding.
    const int64_t segments = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(max_segments));
    int64_t t = 0;
    for (int64_t id = 1; id <= segments && t < t_len; ++id) {
      const auto max_len = static_cast<uint64_t>(std::max<int64_t>(1, t_len / segments));
      const int64_t len = 1 + static_cast<int64_t>(rng() % max_len);
      for (int64_t k = 0; k < len && t < t_len; ++k, ++t) {
        kernels::StoreIndex(v, base + t * v.strides[v.rank - 1], id);
      }
    }
    for (; t < t_len; ++t) kernels::StoreIndex(v, base + t * v.strides[v.rank - 1], 0);
  }
}

const v1::Tensor* FindOutput(const v1::OpResponse& response, const std::string& name) {
  for (const auto& named : response.outputs()) {
    if (named.name() == name) return &named.tensor();
  }
  return nullptr;
}

// ----------------------------------------------------------------- client --

Client::Client(std::shared_ptr<grpc::Channel> channel, absl::Duration deadline)
    : channel_(std::move(channel)),
      stub_(v1::TokenSelect::NewStub(channel_)),
      deadline_(deadline) {}

absl::Status Client::Open(uint64_t lease_ttl_ms) {
  v1::OpenSessionRequest request;
  request.set_client_name("integration-test");
  request.set_lease_ttl_ms(lease_ttl_ms);
  v1::OpenSessionResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline_));
  absl::Status s = ToAbsl(stub_->OpenSession(&ctx, request, &response));
  if (!s.ok()) return s;
  if (response.session_id().empty()) return absl::InternalError("empty session_id");
  session_ = response.session_id();
  return absl::OkStatus();
}

std::unique_ptr<grpc::ClientContext> Client::Context() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + deadline_));
  if (!session_.empty()) ctx->AddMetadata(kSessionKey, session_);
  return ctx;
}

absl::StatusOr<v1::BufferInfo> Client::Register(const std::string& name,
                                                const std::string& shm_name, uint64_t offset,
                                                uint64_t size) const {
  const int fd = shm_open(shm_name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0)
    return absl::NotFoundError(absl::StrCat("shm_open ", shm_name, ": ", strerror(errno)));
  absl::StatusOr<v1::FdChannelReply> reply =
      client::SendFd(fd_channel_, session_, v1::FD_KIND_HOST_MEMORY, fd);
  ::close(fd);
  if (!reply.ok()) return reply.status();
  v1::RegisterBufferRequest request;
  request.set_name(name);
  request.mutable_fd()->set_ticket(reply->ticket());
  request.mutable_fd()->set_offset(offset);
  request.mutable_fd()->set_size(size);
  v1::RegisterBufferResponse response;
  absl::Status s = Call(&v1::TokenSelect::Stub::RegisterBuffer, request, &response);
  if (!s.ok()) return s;
  return response.buffer();
}

absl::Status Client::Unregister(const std::string& name) const {
  v1::UnregisterBufferRequest request;
  request.set_name(name);
  v1::UnregisterBufferResponse response;
  return Call(&v1::TokenSelect::Stub::UnregisterBuffer, request, &response);
}

absl::Status Client::Ping() const {
  v1::PingRequest request;
  v1::PingResponse response;
  return Call(&v1::TokenSelect::Stub::Ping, request, &response);
}

}  // namespace tokensel::itest
