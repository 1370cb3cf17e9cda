// Memory, time and session bounds against a real server: requests of a few
// bytes that used to make it allocate gigabytes, a stream that never reads
// its responses, work nobody waits for any more, and a stream's session.
#include <atomic>
#include <thread>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "tests/server/security/security_fixture.h"
#include "tokensel/client/tensor_ref.h"

namespace tokensel::security {
namespace {

using ::testing::HasSubstr;
using ::tokensel::testing::StatusIs;

// SegmentSeqlens self-attention with one token and `ns` segments: its two
// outputs come back inline, 8 * ns bytes in all.
v1::Op SegmentWithInlineOutputs(int64_t ns) {
  v1::Op op;
  v1::SegmentSeqlensRequest* s = op.mutable_segment_seqlens();
  *s->mutable_segment_ids_q() = tc::TensorRef::InlineValues<int32_t>({1}, {1, 1}).ToProto();
  s->set_max_segments(ns);
  return op;
}

// Item 4: a 40-op Execute of ~1 KiB whose inline results would add up to
// 2.3 GiB is refused before anything runs.
TEST_F(SecurityTest, AnExecuteWhoseResponseCannotFitIsRefusedBeforeRunning) {
  StartServer();
  tc::Client client = Client();
  absl::StatusOr<std::unique_ptr<tc::Session>> session = tc::Session::Open(client, {});
  ASSERT_OK(session);
  v1::ExecuteRequest execute;
  for (int i = 0; i < 40; ++i) *execute.add_ops() = SegmentWithInlineOutputs(7'500'000);
  EXPECT_THAT((*session)->client().Execute(execute).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "limit of one response"));
  // Refused before running: no op reached the backend (an event count, not
  // a time bound that a loaded sanitizer run could exceed).
  EXPECT_EQ(Metric("tokensel_op_duration_seconds_count{backend=\"cpu\",device=\"cpu\",op="
                   "\"SegmentSeqlens\"}"),
            0)
      << "an op of the refused Execute ran";
  EXPECT_LT(PeakRssKiB(), 512 * 1024) << "the server built the response anyway";
  ExpectServing();
}

// Item 4: a stream whose client sends 60 requests with ~60 MiB of results
// each and never reads: the server stops reading the stream (a few queued
// results at most) instead of holding 3.5 GiB. (The requests themselves are
// tiny: gRPC's flow-control windows take all 60, so what is bounded is what
// the server builds, not what the client can send.)
TEST_F(SecurityTest, AStreamThatNeverReadsItsResponsesIsBackPressured) {
  StartServer();
  tc::Client client = Client();
  absl::StatusOr<std::unique_ptr<tc::Session>> session = tc::Session::Open(client, {});
  ASSERT_OK(session);
  auto ctx = (*session)->client().NewContext();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = (*session)->client().stub().Stream(ctx.get());
  std::atomic<int> sent{0};
  std::thread writer([&] {
    v1::StreamRequest request;
    *request.mutable_op() = SegmentWithInlineOutputs(7'500'000);
    for (int i = 0; i < 60; ++i) {
      request.set_request_id(static_cast<uint64_t>(i));
      if (!stream->Write(request)) return;
      ++sent;
    }
  });
  absl::SleepFor(absl::Seconds(8));  // time enough to build every response
  const int64_t peak = PeakRssKiB();
  // Unbounded, the 60 responses alone are 3.6 GB; bounded, a few of them.
  // (2 GiB leaves room for ASan's quarantine and shadow memory.)
  EXPECT_LT(peak, 2048 * 1024) << "peak RSS " << peak << " KiB after " << sent.load()
                               << " requests: the server kept answering a stream nobody reads";
  ctx->TryCancel();
  writer.join();
  stream->Finish();
  ExpectServing();
}

// Item 4: scratch is paid for before it is allocated. TopK over 2^31-1
// zero-strided scores in a 4-byte buffer needs 2 keys per score per thread.
TEST_F(SecurityTest, ScratchOfATinyRequestIsRefusedBeforeItIsAllocated) {
  StartServer({"--max_op_elements=0"});  // only the memory bounds apply
  tc::Client client = Client();
  absl::StatusOr<std::unique_ptr<tc::Session>> session = tc::Session::Open(client, {});
  ASSERT_OK(session);
  absl::StatusOr<tc::SharedRegion> tiny = tc::SharedRegion::CreateSealed("tiny", 4096);
  ASSERT_OK(tiny);
  ASSERT_OK((*session)->RegisterBuffer(tiny->RegisterRequest("tiny")).status());
  v1::TopKTokensRequest topk;
  *topk.mutable_scores() = tc::TensorRef::InBuffer("tiny", 0)
                               .Dtype(v1::DTYPE_FLOAT32)
                               .Shape({1, (int64_t{1} << 31) - 1})
                               .Strides({0, 0})
                               .ToProto();
  topk.set_retained_tokens(1);
  EXPECT_THAT((*session)->client().TopKTokens(topk).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "scratch of TopKTokens"));
  EXPECT_LT(PeakRssKiB(), 512 * 1024);
  ExpectServing();
}

// Item 4: a 40-byte cross-attention SegmentSeqlens whose staging and scratch
// are O(NS) counts against the per-request bound.
TEST_F(SecurityTest, ACrossAttentionRequestOfFortyBytesIsCountedToo) {
  StartServer({"--max_request_memory_bytes=67108864"});
  tc::Client client = Client();
  absl::StatusOr<std::unique_ptr<tc::Session>> session = tc::Session::Open(client, {});
  ASSERT_OK(session);
  v1::SegmentSeqlensRequest s = SegmentWithInlineOutputs(2'000'000).segment_seqlens();
  *s.mutable_segment_ids_kv() = tc::TensorRef::InlineValues<int32_t>({1}, {1, 1}).ToProto();
  EXPECT_THAT((*session)->client().SegmentSeqlens(s).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "server memory"));
  ExpectServing();
}

// Item 4: registrations are bounded across sessions, not only per session
// (each is a memory map of the server's).
TEST_F(SecurityTest, BuffersAreBoundedAcrossSessions) {
  StartServer({"--max_buffers_total=256"});
  tc::Client client = Client();
  absl::StatusOr<tc::SharedRegion> page = tc::SharedRegion::CreateSealed("page", 4096);
  ASSERT_OK(page);
  std::vector<std::unique_ptr<tc::Session>> sessions;
  int registered = 0;
  absl::Status refused;
  for (int s = 0; s < 8 && refused.ok(); ++s) {
    absl::StatusOr<std::unique_ptr<tc::Session>> session = tc::Session::Open(client, {});
    ASSERT_OK(session);
    for (int b = 0; b < 64; ++b) {
      absl::Status st =
          (*session)->RegisterBuffer(page->RegisterRequest(absl::StrCat("b", b))).status();
      if (!st.ok()) {
        refused = st;
        break;
      }
      ++registered;
    }
    sessions.push_back(*std::move(session));
  }
  EXPECT_EQ(registered, 256);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted, "max_buffers"));
  sessions.clear();  // closing them frees the maps
  absl::StatusOr<std::unique_ptr<tc::Session>> later = tc::Session::Open(client, {});
  ASSERT_OK(later);
  EXPECT_OK((*later)->RegisterBuffer(page->RegisterRequest("again")).status());
  ExpectServing();
}

// Item 6: abandoned work stops. One SampleTokens row of 2^31 - 1 positions
// takes ~15 s on one thread; its client gives up after 300 ms.
TEST_F(SecurityTest, WorkStopsWhenItsDeadlinePasses) {
  StartServer({"--max_op_elements=0", "--threads=2"});
  tc::Client client = Client();
  absl::StatusOr<std::unique_ptr<tc::Session>> session = tc::Session::Open(client, {});
  ASSERT_OK(session);
  v1::SampleTokensRequest sample;
  sample.set_layers(1);
  sample.set_batch(1);
  sample.set_original_tokens((int64_t{1} << 31) - 1);
  sample.set_retained_tokens(1);
  const absl::Time start = absl::Now();
  EXPECT_THAT(
      (*session)->client().WithDeadline(absl::Milliseconds(300)).SampleTokens(sample).status(),
      StatusIs(absl::StatusCode::kDeadlineExceeded));
  // The server gives its worker back: the in-flight gauge drops to 0 while
  // the op, had it run on, would still have most of its ~15 s (longer under
  // the sanitizers) to go. The wait is bounded by that, not by a latency
  // target (how soon the op stops is a benchmark's business).
  double inflight = 1;
  while (absl::Now() - start < absl::Seconds(10) &&
         (inflight = Metric("tokensel_inflight_requests")) > 0) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(inflight, 0) << "the op ran on after its deadline";
  ExpectServing();
}

// Item 7: a stream keeps its session alive however quiet it is.
TEST_F(SecurityTest, AQuietStreamKeepsItsSession) {
  StartServer({"--session_ttl=1s"});
  tc::Client client = Client();
  absl::StatusOr<v1::OpenSessionResponse> opened = client.OpenSession({});
  ASSERT_OK(opened);
  tc::Client bound = client.WithSession(opened->session_id());
  absl::StatusOr<std::unique_ptr<tc::OpStream>> stream = bound.OpenStream();
  ASSERT_OK(stream);
  absl::SleepFor(absl::Seconds(3));  // three leases
  v1::StreamRequest request;
  request.set_request_id(1);
  *request.mutable_op() = SegmentWithInlineOutputs(4);
  absl::StatusOr<v1::StreamResponse> response = (*stream)->Call(request);
  ASSERT_OK(response);
  EXPECT_EQ(response->code(), 0) << response->message();
  EXPECT_OK((*stream)->Finish());
  // Once the stream is gone the lease runs again.
  absl::SleepFor(absl::Seconds(2));
  EXPECT_THAT(bound.KeepAlive().status(), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace tokensel::security
