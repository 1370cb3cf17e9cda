// tokensel_fault_client: a client process for fault_test.cc to SIGKILL
// mid-stream.
//
//   tokensel_fault_client <target> <stream|leased> <shm_name>
//
// Maps the existing shm object <shm_name> (created, and later unlinked, by
// the test), writes activations and indices into its first half, and
// registers two buffers: "in" = the first half, "out" = the second half.
//  - stream: a Stream without session metadata (the server opens a session
//    that ends with the stream); both buffers are registered through it.
//  - leased: a Session (lease = the server's --session_ttl, keep-alive on)
//    registers both buffers; the Stream carries the session id, so the
//    session outlives the stream until its lease runs out.
// Then it sends GatherTokens (in -> out) over the stream, one after another
// with a 1 ms pause, forever. After the first three responses succeed it
// prints "READY" on stdout. Any failure prints "FAILED <status>" and exits 1;
// bad usage exits 2. It dies with its parent (PR_SET_PDEATHSIG).
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tokensel/client/client.h"
#include "tokensel/client/session.h"
#include "tokensel/client/shared_region.h"
#include "tokensel/client/tensor_ref.h"

namespace tc = ::tokensel::client;
namespace v1 = ::tokensel::v1;

namespace {

// Activations [1, kS, kC] float32 at 0, indices [1, kR] int32 after them,
// both in "in"; the output [1, kR, kC] at 0 of "out".
constexpr int64_t kS = 256, kC = 64, kR = 128;
constexpr uint64_t kActBytes = kS * kC * sizeof(float);
constexpr uint64_t kIdxBytes = kR * sizeof(int32_t);
constexpr uint64_t kOutBytes = kR * kC * sizeof(float);

int Fail(const absl::Status& status) {
  std::printf("FAILED %s\n", status.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

v1::StreamRequest Registration(uint64_t id, v1::RegisterBufferRequest request) {
  v1::StreamRequest r;
  r.set_request_id(id);
  *r.mutable_register_buffer() = std::move(request);
  return r;
}

absl::Status CheckResponse(const absl::StatusOr<v1::StreamResponse>& response) {
  if (!response.ok()) return response.status();
  if (response->code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(response->code()), response->message());
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  const pid_t parent = getppid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) return 2;  // the parent is already gone
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <target> <stream|leased> <shm_name>\n", argv[0]);
    return 2;
  }
  const std::string target = argv[1];
  const std::string mode = argv[2];
  if (mode != "stream" && mode != "leased") return 2;

  absl::StatusOr<tc::SharedRegion> region = tc::SharedRegion::Open(argv[3]);
  if (!region.ok()) return Fail(region.status());
  const uint64_t half = region->size() / 2;
  if (kActBytes + kIdxBytes > half || kOutBytes > region->size() - half) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("shm object too small: ", region->size(), " bytes")));
  }
  for (uint64_t i = 0; i < kS * kC; ++i) {
    const float v = static_cast<float>(i % 1000) * 0.5f;
    std::memcpy(region->data() + i * sizeof(float), &v, sizeof(v));
  }
  for (int64_t r = 0; r < kR; ++r) {
    const int32_t index = static_cast<int32_t>((r * 37) % kS);
    std::memcpy(region->data() + kActBytes + r * sizeof(int32_t), &index, sizeof(index));
  }

  absl::StatusOr<tc::Client> client = tc::Client::Connect(target, {.deadline = absl::Seconds(20)});
  if (!client.ok()) return Fail(client.status());
  std::unique_ptr<tc::Session> session;
  tc::Client stream_client = *client;
  if (mode == "leased") {
    absl::StatusOr<std::unique_ptr<tc::Session>> opened =
        tc::Session::Open(*client, {.client_name = "fault-client-leased"});
    if (!opened.ok()) return Fail(opened.status());
    session = std::move(opened).value();
    for (const char* name : {"in", "out"}) {
      const bool in = std::strcmp(name, "in") == 0;
      absl::StatusOr<v1::BufferInfo> info = session->RegisterBuffer(
          region->RegisterRequest(name, in ? 0 : half, in ? half : region->size() - half));
      if (!info.ok()) return Fail(info.status());
    }
    stream_client = session->client();
  }
  absl::StatusOr<std::unique_ptr<tc::OpStream>> stream = stream_client.OpenStream();
  if (!stream.ok()) return Fail(stream.status());
  uint64_t request_id = 0;
  if (mode == "stream") {
    absl::Status s = CheckResponse(
        (*stream)->Call(Registration(++request_id, region->RegisterRequest("in", 0, half))));
    if (s.ok()) {
      s = CheckResponse((*stream)->Call(
          Registration(++request_id, region->RegisterRequest("out", half, region->size() - half))));
    }
    if (!s.ok()) return Fail(s);
  }

  v1::StreamRequest gather;
  v1::GatherTokensRequest* g = gather.mutable_op()->mutable_gather_tokens();
  *g->mutable_activations() =
      tc::TensorRef::InBuffer("in", 0).Dtype(v1::DTYPE_FLOAT32).Shape({1, kS, kC}).ToProto();
  *g->mutable_indices() =
      tc::TensorRef::InBuffer("in", kActBytes).Dtype(v1::DTYPE_INT32).Shape({1, kR}).ToProto();
  *g->mutable_out() =
      tc::TensorRef::InBuffer("out", 0).Dtype(v1::DTYPE_FLOAT32).Shape({1, kR, kC}).ToProto();
  g->set_batch_first(true);
  for (int64_t n = 1;; ++n) {
    gather.set_request_id(++request_id);
    const absl::Status s = CheckResponse((*stream)->Call(gather));
    if (!s.ok()) return Fail(s);
    if (n == 3) {
      std::printf("READY\n");
      std::fflush(stdout);
    }
    absl::SleepFor(absl::Milliseconds(1));  // pacing, not synchronization
  }
}
