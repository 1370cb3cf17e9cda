#include "tests/load/load_thread.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/load/op_generators.h"
#include "tokensel/client/fd_channel.h"

namespace tokensel::load {
namespace {

using Stub = v1::TokenSelect::Stub;

std::shared_ptr<grpc::Channel> NewChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

absl::string_view MethodOf(const v1::Op& op) {
  switch (op.op_case()) {
    case v1::Op::kSortTokens:
      return "SortTokens";
    case v1::Op::kGatherTokens:
      return "GatherTokens";
    case v1::Op::kScatterTokens:
      return "ScatterTokens";
    case v1::Op::kGatherBertMask:
      return "GatherBertMask";
    case v1::Op::kSliceGptMask:
      return "SliceGptMask";
    case v1::Op::kSegmentSeqlens:
      return "SegmentSeqlens";
    case v1::Op::kSampleTokens:
      return "SampleTokens";
    case v1::Op::kTopKTokens:
      return "TopKTokens";
    case v1::Op::kMergeTokens:
      return "MergeTokens";
    case v1::Op::kSplitTokens:
      return "SplitTokens";
    case v1::Op::kSamplePackedTokens:
      return "SamplePackedTokens";
    case v1::Op::OP_NOT_SET:
      break;
  }
  return "?";
}

// The op as its own unary RPC.
absl::Status CallOp(const itest::Client& c, const v1::Op& op, v1::OpResponse* resp) {
  switch (op.op_case()) {
    case v1::Op::kSortTokens:
      return c.Call(&Stub::SortTokens, op.sort_tokens(), resp);
    case v1::Op::kGatherTokens:
      return c.Call(&Stub::GatherTokens, op.gather_tokens(), resp);
    case v1::Op::kScatterTokens:
      return c.Call(&Stub::ScatterTokens, op.scatter_tokens(), resp);
    case v1::Op::kGatherBertMask:
      return c.Call(&Stub::GatherBertMask, op.gather_bert_mask(), resp);
    case v1::Op::kSliceGptMask:
      return c.Call(&Stub::SliceGptMask, op.slice_gpt_mask(), resp);
    case v1::Op::kSegmentSeqlens:
      return c.Call(&Stub::SegmentSeqlens, op.segment_seqlens(), resp);
    case v1::Op::kSampleTokens:
      return c.Call(&Stub::SampleTokens, op.sample_tokens(), resp);
    case v1::Op::kTopKTokens:
      return c.Call(&Stub::TopKTokens, op.top_k_tokens(), resp);
    case v1::Op::kMergeTokens:
      return c.Call(&Stub::MergeTokens, op.merge_tokens(), resp);
    case v1::Op::kSplitTokens:
      return c.Call(&Stub::SplitTokens, op.split_tokens(), resp);
    case v1::Op::kSamplePackedTokens:
      return c.Call(&Stub::SamplePackedTokens, op.sample_packed_tokens(), resp);
    case v1::Op::OP_NOT_SET:
      break;
  }
  return absl::InternalError("op not set");
}

int64_t U(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}
OpKind RandomKind(std::mt19937_64& rng) { return static_cast<OpKind>(rng() % kNumOpKinds); }

// The Random-LTD stand-in layer: flips bits of every retained row.
void StandInLayer(const kernels::TensorView& rows) {
  for (int64_t i = 0; i < rows.NumElements(); ++i) {
    char* p = rows.At(kernels::LinearToOffset(rows, i));
    for (int64_t b = 0; b < rows.elem_size(); ++b) p[b] = static_cast<char>(p[b] ^ 0x5A);
  }
}

void MustOk(const absl::Status& status) {
  if (status.ok()) return;
  std::fprintf(stderr, "load worker: oracle failed on a generated pipeline: %s\n",
               status.ToString().c_str());
  std::abort();
}

}  // namespace

LoadThread::LoadThread(int index, LoadThreadOptions options, uint64_t seed)
    : index_(index),
      options_(std::move(options)),
      rng_(seed),
      checker_(index, options_.allow_exhausted) {}

CaseMemory LoadThread::Memory(uint64_t offset, std::string buffer) {
  return {shm_.data() + offset, mirror_.data() + offset, local_.data(), shm_.size() - offset,
          std::move(buffer)};
}

absl::Status LoadThread::Setup() {
  client_ = std::make_unique<itest::Client>(NewChannel(options_.target), options_.rpc_deadline);
  client_->set_fd_channel(client::FdChannelPath(options_.target));
  RETURN_IF_ERROR(checker_.Counted("OpenSession", client_->Open()));
  ASSIGN_OR_RETURN(shm_, testing::TestShm::Create(
                             absl::StrCat(options_.shm_prefix, "load-", getpid(), "-", index_),
                             options_.region_bytes));
  RandomBytes(shm_.data(), shm_.size(), rng_);
  mirror_.assign(shm_.data(), shm_.data() + shm_.size());
  local_.assign(shm_.size(), 0);
  checker_.Attach(shm_.data(), mirror_.data(), local_.data(), shm_.size());
  RETURN_IF_ERROR(checker_.Counted(
      "RegisterBuffer", client_->Register("arena", shm_.name(), 0, shm_.size()).status()));
  Prime();
  return absl::OkStatus();
}

void LoadThread::Prime() {
  checker_.report().Add("case.Prime");
  constexpr int64_t kRows = 256;
  const int64_t row_bytes = static_cast<int64_t>(shm_.size() - 8192) / (2 * kRows);
  CaseBuilder b(Memory(), &rng_);
  const Slot act = b.Place(Home::kShm, DType::kUInt8, {1, kRows, row_bytes}, /*strided=*/false);
  const Slot idx = b.Place(Home::kShm, DType::kInt32, {1, kRows}, /*strided=*/false);
  b.FillIndices(idx, kRows, /*unique=*/true);  // a permutation: every row is read
  const Slot out = b.Place(Home::kShm, DType::kUInt8, {1, kRows, row_bytes}, /*strided=*/false);
  v1::GatherTokensRequest req;
  *req.mutable_activations() = b.Input(act);
  *req.mutable_indices() = b.Input(idx);
  *req.mutable_out() = b.Output(out, "out");
  b.NextOp();
  MustOk(kernels::cpu::GatherTokens({b.View(act), b.View(idx), b.View(out), true}, nullptr));
  v1::OpResponse resp;
  const absl::Time start = absl::Now();
  const absl::Status s = client_->Call(&Stub::GatherTokens, req, &resp);
  checker_.Conclude("GatherTokens", s, absl::Now() - start, b, {&resp}, "Prime");
}

absl::Status LoadThread::Close() {
  v1::CloseSessionResponse resp;
  return checker_.Counted("CloseSession",
                          client_->Call(&Stub::CloseSession, v1::CloseSessionRequest(), &resp));
}

void LoadThread::Run(absl::Time deadline, int64_t max_requests) {
  while (absl::Now() < deadline &&
         (max_requests <= 0 || checker_.report().Get("requests") < max_requests)) {
    if (options_.big) {
      BigExecute();
      continue;
    }
    const uint64_t pick = rng_() % 100;
    if (pick < 60) {
      SingleOp();
    } else if (pick < 70) {
      ExecuteOps();
    } else if (pick < 76) {
      LtdStep();
    } else if (pick < 84) {
      StreamOps();
    } else if (pick < 90) {
      Churn();
    } else {
      Housekeeping();
    }
  }
}

void LoadThread::SingleOp() {
  CaseBuilder b(Memory(), &rng_);
  const OpKind kind = RandomKind(rng_);
  // A third all by reference, the rest each tensor at random.
  const v1::Op op = BuildOp(kind, b, /*shm_only=*/rng_() % 3 == 0);
  checker_.report().Add(
      absl::StrCat("case.", OpKindName(kind), b.inline_tensors() > 0 ? ".inline" : ".ref"));
  checker_.SnapshotIfNeeded();
  v1::OpResponse resp;
  const absl::Time start = absl::Now();
  const absl::Status s = CallOp(*client_, op, &resp);
  checker_.Conclude(MethodOf(op), s, absl::Now() - start, b, {&resp}, OpKindName(kind));
}

void LoadThread::ExecuteOps() {
  CaseBuilder b(Memory(), &rng_);
  v1::ExecuteRequest req;
  const int64_t n = U(rng_, 2, 4);
  for (int64_t i = 0; i < n && b.remaining() >= kMaxOpFootprint; ++i) {
    *req.add_ops() = BuildOp(RandomKind(rng_), b, /*shm_only=*/false);
  }
  checker_.report().Add("case.Execute");
  checker_.SnapshotIfNeeded();
  v1::ExecuteResponse resp;
  const absl::Time start = absl::Now();
  const absl::Status s = client_->Call(&Stub::Execute, req, &resp);
  std::vector<const v1::OpResponse*> results;
  for (const auto& r : resp.results()) results.push_back(&r);
  checker_.Conclude("Execute", s, absl::Now() - start, b, results, "Execute");
}

void LoadThread::LtdStep() {
  checker_.report().Add("case.LtdStep");
  static constexpr DType kActTypes[] = {DType::kBFloat16, DType::kFloat16, DType::kFloat32};
  const DType dtype = kActTypes[rng_() % 3];
  const DType idx_dtype = rng_() % 2 ? DType::kInt32 : DType::kInt64;
  const int64_t b = U(rng_, 1, 4), s = U(rng_, 2, 256), r = U(rng_, 1, s), h = U(rng_, 1, 2);
  const int64_t c = U(
      rng_, 1, std::clamp<int64_t>(kMaxTensorBytes / (b * s * kernels::ElementSize(dtype)), 1, 64));
  const uint64_t seed = rng_(), step = rng_() & 0xffffffffu;
  CaseBuilder fwd(Memory(), &rng_);
  const Slot acts = fwd.Place(Home::kShm, dtype, {b, s, c});
  fwd.FillBytes(acts);
  const Slot mask = fwd.Place(Home::kShm, DType::kUInt8, {b, h, 1, s});
  fwd.FillBytes(mask);
  const Slot ids = fwd.Place(Home::kShm, idx_dtype, {1, b, r}, /*strided=*/false);
  const Slot gathered = fwd.Place(Home::kShm, dtype, {b, r, c});
  const Slot bert = fwd.Place(Home::kShm, DType::kUInt8, {1, b, h, r, r});
  Slot ids_br = ids;  // the same memory as the [B,R] indices of gather/scatter
  ids_br.placed.shape = {b, r};
  ids_br.placed.strides = {r, 1};

  v1::ExecuteRequest forward;
  auto* sample = forward.add_ops()->mutable_sample_tokens();
  sample->set_layers(1);
  sample->set_batch(b);
  sample->set_original_tokens(s);
  sample->set_retained_tokens(r);
  sample->set_seed(seed);
  sample->set_step(step);
  *sample->mutable_ids() = fwd.Input(ids);
  fwd.NextOp();
  auto* gather = forward.add_ops()->mutable_gather_tokens();
  *gather->mutable_activations() = fwd.Input(acts);
  *gather->mutable_indices() = fwd.Input(ids_br);
  *gather->mutable_out() = fwd.Output(gathered, "out");
  gather->set_batch_first(true);
  fwd.NextOp();
  MustOk(kernels::cpu::SampleTokens({1, b, s, r, seed, step, fwd.View(ids)}, nullptr));
  MustOk(kernels::cpu::GatherTokens({fwd.View(acts), fwd.View(ids_br), fwd.View(gathered), true},
                                    nullptr));
  checker_.SnapshotIfNeeded();
  v1::ExecuteResponse resp;
  absl::Time start = absl::Now();
  absl::Status st = client_->Call(&Stub::Execute, forward, &resp);
  if (!checker_.Conclude("Execute", st, absl::Now() - start, fwd,
                         {resp.results_size() > 0 ? &resp.results(0) : nullptr,
                          resp.results_size() > 1 ? &resp.results(1) : nullptr},
                         "LtdStep forward")) {
    return;
  }
  // The layer runs on the gathered rows (in the region and in the mirror).
  StandInLayer(fwd.View(gathered));
  fwd.Commit(gathered);

  CaseBuilder bwd(Memory(), &rng_);  // places nothing: reuses fwd's slots
  v1::ExecuteRequest backward;
  auto* scatter = backward.add_ops()->mutable_scatter_tokens();
  *scatter->mutable_all() = bwd.Input(acts);
  *scatter->mutable_layer() = bwd.Input(gathered);
  *scatter->mutable_indices() = bwd.Input(ids_br);
  scatter->set_batch_first(true);
  bwd.NextOp();
  auto* bert_op = backward.add_ops()->mutable_gather_bert_mask();
  *bert_op->mutable_mask() = bwd.Input(mask);
  *bert_op->mutable_indices() = bwd.Input(ids);
  *bert_op->mutable_out() = bwd.Output(bert, "out");
  bwd.NextOp();
  MustOk(kernels::cpu::ScatterTokens({fwd.View(acts), fwd.View(gathered), fwd.View(ids_br), true},
                                     nullptr));
  MustOk(kernels::cpu::GatherBertMask({fwd.View(mask), fwd.View(ids), fwd.View(bert)}, nullptr));
  checker_.SnapshotIfNeeded();
  resp.Clear();
  start = absl::Now();
  st = client_->Call(&Stub::Execute, backward, &resp);
  std::vector<const v1::OpResponse*> results;
  for (const auto& res : resp.results()) results.push_back(&res);
  checker_.Conclude("Execute", st, absl::Now() - start, bwd, results, "LtdStep backward");
}

void LoadThread::StreamOps() {
  checker_.report().Add("case.Stream");
  CaseBuilder b(Memory(), &rng_);
  std::vector<v1::StreamRequest> requests;
  const int64_t k = U(rng_, 2, 6);
  for (int64_t i = 0; i < k && b.remaining() >= kMaxOpFootprint; ++i) {
    v1::StreamRequest r;
    r.set_request_id(static_cast<uint64_t>(1000 + i));
    if (rng_() % 5 == 0 && b.remaining() >= 2 * kMaxOpFootprint) {
      for (int j = 0; j < 2; ++j) {
        *r.mutable_execute()->add_ops() = BuildOp(RandomKind(rng_), b, /*shm_only=*/false);
      }
    } else {
      *r.mutable_op() = BuildOp(RandomKind(rng_), b, /*shm_only=*/false);
    }
    requests.push_back(std::move(r));
  }
  checker_.report().Add("stream_msgs", static_cast<int64_t>(requests.size()));
  checker_.SnapshotIfNeeded();
  // Written ahead of reading: the server reads on while its answers queue.
  auto ctx = client_->Context();
  const absl::Time start = absl::Now();
  auto stream = client_->stub().Stream(ctx.get());
  for (const auto& r : requests) {
    if (!stream->Write(r)) break;
  }
  stream->WritesDone();
  std::vector<v1::StreamResponse> responses;
  v1::StreamResponse resp;
  while (responses.size() < requests.size() && stream->Read(&resp)) responses.push_back(resp);
  absl::Status status = itest::ToAbsl(stream->Finish());
  const absl::Duration latency = absl::Now() - start;

  std::vector<const v1::OpResponse*> results;
  for (size_t i = 0; status.ok() && i < responses.size(); ++i) {
    const v1::StreamResponse& r = responses[i];
    if (r.request_id() != requests[i].request_id()) {
      checker_
          .Counted("Stream", status,
                   absl::StrCat("response ", i, " carries request_id ", r.request_id(),
                                ", expected ", requests[i].request_id()))
          .IgnoreError();
      return;
    }
    if (r.code() != 0) {
      status = absl::Status(static_cast<absl::StatusCode>(r.code()),
                            absl::StrCat("stream message ", i, ": ", r.message()));
      break;
    }
    if (requests[i].has_op()) {
      results.push_back(&r.op());
    } else {
      for (const auto& res : r.execute().results()) results.push_back(&res);
    }
  }
  checker_.Conclude("Stream", status, latency, b, results, "Stream");
}

void LoadThread::Churn() {
  checker_.report().Add("case.Churn");
  const uint64_t size = shm_.size();
  const uint64_t max_page = (size - kMaxOpFootprint - 4096) / 4096;
  uint64_t offset = static_cast<uint64_t>(U(rng_, 0, static_cast<int64_t>(max_page))) * 4096;
  if (rng_() % 2 == 0) offset += static_cast<uint64_t>(U(rng_, 1, 4095));  // unaligned
  const std::string name = absl::StrCat("tmp-", churn_++);
  if (!checker_
           .Counted("RegisterBuffer",
                    client_->Register(name, shm_.name(), offset, size - offset).status())
           .ok()) {
    return;
  }
  CaseBuilder b(Memory(offset, name), &rng_);
  const OpKind kind = RandomKind(rng_);
  const v1::Op op = BuildOp(kind, b, /*shm_only=*/false);
  checker_.SnapshotIfNeeded();
  v1::OpResponse resp;
  const absl::Time start = absl::Now();
  const absl::Status s = CallOp(*client_, op, &resp);
  checker_.Conclude(MethodOf(op), s, absl::Now() - start, b, {&resp},
                    absl::StrCat("Churn ", OpKindName(kind)));
  checker_.Counted("UnregisterBuffer", client_->Unregister(name)).IgnoreError();
}

void LoadThread::Housekeeping() {
  switch (rng_() % 3) {
    case 0: {
      v1::ListBuffersResponse resp;
      const absl::Status s = client_->Call(&Stub::ListBuffers, v1::ListBuffersRequest(), &resp);
      const bool only_arena = resp.buffers_size() == 1 && resp.buffers(0).name() == "arena" &&
                              resp.buffers(0).size() == shm_.size();
      checker_
          .Counted("ListBuffers", s,
                   only_arena ? ""
                              : absl::StrCat("lists ", resp.buffers_size(),
                                             " buffers, not just \"arena\""))
          .IgnoreError();
      break;
    }
    case 1: {
      v1::KeepAliveResponse resp;
      checker_.Counted("KeepAlive", client_->Call(&Stub::KeepAlive, v1::KeepAliveRequest(), &resp))
          .IgnoreError();
      break;
    }
    default:
      checker_.Counted("Ping", client_->Ping()).IgnoreError();
  }
}

void LoadThread::BigExecute() {
  checker_.report().Add("case.BigExecute");
  constexpr int64_t kS = 2048, kC = 128, kOps = 16;  // 1 MiB in, 1 MiB out per gather
  CaseBuilder b(Memory(), &rng_);
  const Slot act = b.Place(Home::kShm, DType::kFloat32, {1, kS, kC}, /*strided=*/false);
  // Filled once (the same place every time): new indices make every
  // request's output differ from the last, at a fraction of the client's CPU.
  if (!big_act_filled_) b.FillBytes(act);
  big_act_filled_ = true;
  const Slot idx = b.Place(Home::kShm, DType::kInt32, {1, kS}, /*strided=*/false);
  b.FillIndices(idx, kS, /*unique=*/false);
  const Slot out = b.Place(Home::kShm, DType::kFloat32, {1, kS, kC}, /*strided=*/false);
  v1::ExecuteRequest req;
  for (int64_t i = 0; i < kOps; ++i) {
    auto* g = req.add_ops()->mutable_gather_tokens();
    *g->mutable_activations() = b.Input(act);
    *g->mutable_indices() = b.Input(idx);
    *g->mutable_out() = b.Output(out, "out");
    g->set_batch_first(true);
    b.NextOp();
  }
  // The 16 gathers write the same values to the same place: one oracle run.
  MustOk(kernels::cpu::GatherTokens({b.View(act), b.View(idx), b.View(out), true}, nullptr));
  checker_.SnapshotIfNeeded();
  v1::ExecuteResponse resp;
  const absl::Time start = absl::Now();
  const absl::Status s = client_->Call(&Stub::Execute, req, &resp);
  std::vector<const v1::OpResponse*> results;
  for (const auto& r : resp.results()) results.push_back(&r);
  checker_.Conclude("Execute", s, absl::Now() - start, b, results, "BigExecute");
}

}  // namespace tokensel::load
