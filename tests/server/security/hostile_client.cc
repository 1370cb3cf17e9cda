// tokensel_hostile_client: what an unprivileged local user can try against a
// tokensel server, one subcommand per attack (tests/server/security). Every
// subcommand first becomes the user it is told to be (--uid/--gid/--groups,
// when started as root), prints one "READY ..." line when its setup is done
// and one "RESULT key=value ..." line at the end; exit 0 = it ran, whatever
// the server answered (the test judges the answers), 2 = bad usage, 3 = a
// setup step failed.
//
//   race --target=T --seconds=N       every op by reference on a named shm
//                                     object whose control tensors the flip
//                                     subcommand rewrites meanwhile; checks the
//                                     bytes no op may write after every op
//   flip --shm=NAME --seconds=N       rewrites the first kControlBytes of NAME
//                                     between valid and out-of-range values
//   by-name --target=T --shm=NAME     registers NAME by name (raw RPC), then
//                                     tries to open it itself
//   steal --target=T --session=ID     uses another peer's session id
//   truncate --target=T               registers an unsealed object, shrinks it
//                                     under the server, runs an op on it
//   hoard-sessions --target=T --count=N  opens up to N sessions with the
//                                     longest lease, stopping at the first refusal
#include <fcntl.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/server/security/race_layout.h"
#include "tokensel/client/client.h"
#include "tokensel/client/fd_channel.h"
#include "tokensel/client/session.h"
#include "tokensel/client/shared_region.h"
#include "tokensel/client/tensor_ref.h"

namespace {

namespace tc = ::tokensel::client;
namespace v1 = ::tokensel::v1;
using tokensel::security::RaceLayout;

std::map<std::string, std::string> ParseFlags(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) continue;
    const size_t eq = arg.find('=');
    flags[arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2)] =
        eq == std::string::npos ? "" : arg.substr(eq + 1);
  }
  return flags;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "hostile_client: %s\n", what.c_str());
  return 3;
}

// Becomes --uid/--gid with --groups (comma-separated) as supplementary
// groups. Only root can; without the flags nothing changes.
bool DropPrivileges(const std::map<std::string, std::string>& flags) {
  if (flags.count("uid") == 0) return true;
  uint32_t uid = 0, gid = 0;
  if (!absl::SimpleAtoi(flags.at("uid"), &uid) || !absl::SimpleAtoi(flags.at("gid"), &gid)) {
    return false;
  }
  std::vector<gid_t> groups;
  if (flags.count("groups") != 0) {
    for (absl::string_view g : absl::StrSplit(flags.at("groups"), ',', absl::SkipEmpty())) {
      uint32_t v = 0;
      if (!absl::SimpleAtoi(g, &v)) return false;
      groups.push_back(v);
    }
  }
  return setgroups(groups.size(), groups.data()) == 0 && setresgid(gid, gid, gid) == 0 &&
         setresuid(uid, uid, uid) == 0 && geteuid() == uid;
}

void Print(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

int Code(const absl::Status& s) { return static_cast<int>(s.code()); }

absl::StatusOr<tc::Client> Connect(const std::map<std::string, std::string>& flags) {
  return tc::Client::Connect(flags.at("target"), {.deadline = absl::Seconds(20)});
}

// Registers named object `region` as `name`: by descriptor, or, against a
// server without an fd channel (tokensel before the trust-boundary work, to
// show what these attacks did to it), by name.
absl::StatusOr<v1::BufferInfo> Register(tc::Session& session, const tc::SharedRegion& region,
                                        const std::string& name) {
  absl::StatusOr<v1::BufferInfo> info = session.RegisterBuffer(region.RegisterRequest(name));
  if (!absl::IsUnavailable(info.status())) return info;
  v1::RegisterBufferRequest by_name;
  by_name.set_name(name);
  by_name.mutable_host_shm()->set_shm_name(region.name());
  by_name.mutable_host_shm()->set_size(region.size());
  v1::RegisterBufferResponse response;
  const tc::Client client = session.client();
  std::unique_ptr<grpc::ClientContext> ctx = client.NewContext();
  const grpc::Status status = client.stub().RegisterBuffer(ctx.get(), by_name, &response);
  if (!status.ok()) return info.status();
  std::fprintf(stderr, "hostile_client: no fd channel; registered %s by name\n", name.c_str());
  return response.buffer();
}

// ------------------------------------------------------------------- race --

// The ops of the race, by reference on buffer "race" (race_layout.h).
std::vector<v1::Op> RaceOps() {
  using tc::TensorRef;
  const RaceLayout& L = RaceLayout::Get();
  auto ref = [](uint64_t offset, v1::DType dtype, std::vector<int64_t> shape) {
    return TensorRef::InBuffer("race", offset).Dtype(dtype).Shape(std::move(shape)).ToProto();
  };
  std::vector<v1::Op> ops;
  {
    v1::GatherTokensRequest* g = ops.emplace_back().mutable_gather_tokens();
    *g->mutable_activations() = ref(L.acts, v1::DTYPE_FLOAT32, {L.B, L.S, L.C});
    *g->mutable_indices() = ref(L.gather_idx, v1::DTYPE_INT32, {L.B, L.R});
    *g->mutable_out() = ref(L.gather_out, v1::DTYPE_FLOAT32, {L.B, L.R, L.C});
  }
  {
    v1::ScatterTokensRequest* s = ops.emplace_back().mutable_scatter_tokens();
    *s->mutable_all() = ref(L.acts, v1::DTYPE_FLOAT32, {L.B, L.S, L.C});
    *s->mutable_layer() = ref(L.layer, v1::DTYPE_FLOAT32, {L.B, L.R, L.C});
    *s->mutable_indices() = ref(L.scatter_idx, v1::DTYPE_INT32, {L.B, L.R});
  }
  {
    v1::GatherBertMaskRequest* m = ops.emplace_back().mutable_gather_bert_mask();
    *m->mutable_mask() = ref(L.mask, v1::DTYPE_UINT8, {L.MB, 1, L.S, L.S});
    *m->mutable_indices() = ref(L.gather_idx, v1::DTYPE_INT32, {1, L.MB, L.R});
    *m->mutable_out() = ref(L.bert_out, v1::DTYPE_UINT8, {1, L.MB, 1, L.R, L.R});
  }
  {
    v1::SliceGptMaskRequest* m = ops.emplace_back().mutable_slice_gpt_mask();
    *m->mutable_mask() = ref(L.mask, v1::DTYPE_UINT8, {L.MB, 1, L.S, L.S});
    *m->mutable_out() = ref(L.gpt_out, v1::DTYPE_UINT8, {L.MB, 1, L.R, L.R});
  }
  {
    v1::SortTokensRequest* s = ops.emplace_back().mutable_sort_tokens();
    *s->mutable_ids() = ref(L.sort_ids, v1::DTYPE_INT32, {L.B, L.R});  // in place
    s->set_original_tokens(L.S);
    *s->mutable_inverse() = ref(L.sort_inverse, v1::DTYPE_INT32, {L.B, L.S});
  }
  for (int cross = 0; cross < 2; ++cross) {
    v1::SegmentSeqlensRequest* q = ops.emplace_back().mutable_segment_seqlens();
    *q->mutable_segment_ids_q() = ref(L.seg_ids, v1::DTYPE_INT32, {L.SB, L.T});
    q->set_max_segments(L.NS);
    q->set_packed(true);
    if (cross == 1) {
      *q->mutable_segment_pos_q() = ref(L.seg_pos, v1::DTYPE_INT32, {L.SB, L.T});
      *q->mutable_segment_ids_kv() = ref(L.seg_ids, v1::DTYPE_INT32, {L.SB, L.T});
      *q->mutable_segment_pos_kv() = ref(L.seg_pos, v1::DTYPE_INT32, {L.SB, L.T});
      q->set_mask(v1::ATTN_MASK_CAUSAL);
    }
  }
  {
    v1::TopKTokensRequest* t = ops.emplace_back().mutable_top_k_tokens();
    *t->mutable_scores() = ref(L.scores, v1::DTYPE_FLOAT32, {L.B, L.S});
    t->set_retained_tokens(L.R);
  }
  {
    v1::SampleTokensRequest* s = ops.emplace_back().mutable_sample_tokens();
    s->set_layers(1);
    s->set_batch(L.MB);
    s->set_original_tokens(L.S);
    s->set_retained_tokens(L.R);
    *s->mutable_mask() = ref(L.mask, v1::DTYPE_UINT8, {L.MB, 1, L.S, L.S});
    *s->mutable_bert_mask() = ref(L.sample_bert_out, v1::DTYPE_UINT8, {1, L.MB, 1, L.R, L.R});
  }
  return ops;
}

int Race(const std::map<std::string, std::string>& flags) {
  const RaceLayout& L = RaceLayout::Get();
  const std::string name = absl::StrCat("/tokensel-race-", getpid());
  absl::StatusOr<tc::SharedRegion> region =
      tc::SharedRegion::Create(name, L.bytes, {.unlink_on_destroy = true});
  if (!region.ok()) return Fail(region.status().ToString());
  fchmod(region->fd(), 0600);
  L.Fill(region->data());
  absl::StatusOr<tc::Client> client = Connect(flags);
  if (!client.ok()) return Fail(client.status().ToString());
  absl::StatusOr<std::unique_ptr<tc::Session>> session =
      tc::Session::Open(*client, {.client_name = "race"});
  if (!session.ok()) return Fail(session.status().ToString());
  absl::Status registered = Register(**session, *region, "race").status();
  if (!registered.ok()) return Fail(registered.ToString());
  const std::vector<uint8_t> initial(region->data(), region->data() + L.bytes);
  Print(absl::StrCat("READY shm=", name));

  const std::vector<v1::Op> ops = RaceOps();
  const tc::Client bound = (*session)->client();
  std::map<int, int64_t> codes;
  std::string first_other;
  int64_t guard_violations = 0;
  const absl::Time end = absl::Now() + absl::Seconds(std::stoi(flags.at("seconds")));
  for (int64_t n = 0; absl::Now() < end; ++n) {
    const v1::Op& op = ops[static_cast<size_t>(n) % ops.size()];
    const absl::Status s = bound.RunOp(op).status();
    ++codes[Code(s)];
    if (!s.ok() && !absl::IsInvalidArgument(s) && first_other.empty()) first_other = s.ToString();
    const int64_t bad = L.CountGuardViolations(initial.data(), region->data());
    if (bad > 0 && guard_violations == 0) {
      std::fprintf(stderr, "hostile_client: op %s wrote %lld bytes it must not\n",
                   op.ShortDebugString().substr(0, 60).c_str(), static_cast<long long>(bad));
    }
    guard_violations += bad;
    L.RestoreGuards(initial.data(), region->data());
  }
  const absl::Status alive = client->Ping();
  int64_t other = 0;
  for (const auto& [code, count] : codes) {
    if (code != 0 && code != static_cast<int>(absl::StatusCode::kInvalidArgument)) other += count;
  }
  Print(absl::StrCat("RESULT ok=", codes[0], " invalid=",
                     codes[static_cast<int>(absl::StatusCode::kInvalidArgument)], " other=", other,
                     " guard_violations=", guard_violations, " alive=", alive.ok() ? 1 : 0));
  if (!first_other.empty()) std::fprintf(stderr, "first other status: %s\n", first_other.c_str());
  return 0;
}

int Flip(const std::map<std::string, std::string>& flags) {
  const RaceLayout& L = RaceLayout::Get();
  const int fd = shm_open(flags.at("shm").c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return Fail(absl::StrCat("shm_open: ", std::strerror(errno)));
  void* p = mmap(nullptr, L.control_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return Fail(absl::StrCat("mmap: ", std::strerror(errno)));
  auto* words = static_cast<volatile int32_t*>(p);
  Print("READY");
  const absl::Time end = absl::Now() + absl::Seconds(std::stoi(flags.at("seconds")));
  int64_t sweeps = 0;
  // Valid small values, then the worst: huge, negative, just past the end.
  static constexpr int32_t kBad[] = {INT32_MAX, -1, INT32_MIN, 1 << 20, RaceLayout::kS};
  // One tensor's words at a time, toggled as fast as they can be written
  // (a few microseconds a pass, about an op's length), so that an op sees
  // them change between any two reads; every tensor gets its turn each
  // millisecond or so.
  const std::pair<uint64_t, uint64_t> regions[] = {
      {L.gather_idx, L.scatter_idx}, {L.scatter_idx, L.sort_ids}, {L.sort_ids, L.seg_ids},
      {L.seg_ids, L.seg_pos},        {L.seg_pos, L.scores},       {L.scores, L.control_bytes}};
  while (absl::Now() < end) {
    for (const auto& [begin, stop] : regions) {
      const size_t first = begin / 4, last = stop / 4;
      for (int pass = 0; pass < 16; ++pass, ++sweeps) {
        for (size_t i = first; i < last; ++i) {
          words[i] = pass % 2 == 0 ? static_cast<int32_t>((i * 7 + sweeps) % RaceLayout::kNS)
                                   : kBad[(i + sweeps) % std::size(kBad)];
        }
      }
    }
  }
  Print(absl::StrCat("RESULT sweeps=", sweeps));
  return 0;
}

// ---------------------------------------------------------------- by-name --

int ByName(const std::map<std::string, std::string>& flags) {
  absl::StatusOr<tc::Client> client = Connect(flags);
  if (!client.ok()) return Fail(client.status().ToString());
  absl::StatusOr<v1::OpenSessionResponse> opened = client->OpenSession({});
  if (!opened.ok()) return Fail(opened.status().ToString());
  const tc::Client bound = client->WithSession(opened->session_id());
  Print("READY");
  // The raw RPC, as an attacker would send it (not the client library's
  // conversion, which opens the object in this process).
  v1::RegisterBufferRequest request;
  request.set_name("stolen");
  request.mutable_host_shm()->set_shm_name(flags.at("shm"));
  request.mutable_host_shm()->set_size(4096);
  v1::RegisterBufferResponse response;
  std::unique_ptr<grpc::ClientContext> ctx = bound.NewContext();
  const grpc::Status by_name = bound.stub().RegisterBuffer(ctx.get(), request, &response);
  const int fd = shm_open(flags.at("shm").c_str(), O_RDWR | O_CLOEXEC, 0);
  const int open_errno = fd < 0 ? errno : 0;
  // Through the library too: it opens with this process's rights.
  const absl::Status via_library = bound.RegisterBuffer(request).status();
  Print(absl::StrCat("RESULT by_name=", static_cast<int>(by_name.error_code()),
                     " open_errno=", open_errno, " library=", Code(via_library)));
  return 0;
}

// ------------------------------------------------------------------ steal --

int Steal(const std::map<std::string, std::string>& flags) {
  absl::StatusOr<tc::Client> client = Connect(flags);
  if (!client.ok()) return Fail(client.status().ToString());
  const std::string victim = flags.at("session");
  Print("READY");
  const absl::Status keep_alive = client->WithSession(victim).KeepAlive().status();
  const absl::Status list = client->WithSession(victim).ListBuffers().status();
  absl::StatusOr<tc::SharedRegion> mine = tc::SharedRegion::CreateSealed("steal", 4096);
  if (!mine.ok()) return Fail(mine.status().ToString());
  const absl::Status fd =
      tc::SendFd(tc::FdChannelPath(flags.at("target")), victim, v1::FD_KIND_HOST_MEMORY, mine->fd())
          .status();
  Print(
      absl::StrCat("RESULT keep_alive=", Code(keep_alive), " list=", Code(list), " fd=", Code(fd)));
  return 0;
}

// --------------------------------------------------------------- truncate --

int Truncate(const std::map<std::string, std::string>& flags) {
  constexpr int64_t kS = 64, kC = 1024, kR = 16;  // fp32 [1,S,C]: 256 KiB
  constexpr uint64_t kActBytes = kS * kC * 4;
  const std::string name = absl::StrCat("/tokensel-trunc-", getpid());
  // A named object is not sealed: its owner can shrink it under the server.
  absl::StatusOr<tc::SharedRegion> region =
      tc::SharedRegion::Create(name, kActBytes + 4096, {.unlink_on_destroy = true});
  if (!region.ok()) return Fail(region.status().ToString());
  for (int64_t r = 0; r < kR; ++r) {
    const int32_t index = static_cast<int32_t>((r * 5) % kS);
    std::memcpy(region->data() + kActBytes + r * 4, &index, 4);
  }
  absl::StatusOr<tc::Client> client = Connect(flags);
  if (!client.ok()) return Fail(client.status().ToString());
  absl::StatusOr<std::unique_ptr<tc::Session>> session = tc::Session::Open(*client, {});
  if (!session.ok()) return Fail(session.status().ToString());
  absl::StatusOr<v1::BufferInfo> info = Register(**session, *region, "shrinking");
  if (!info.ok()) return Fail(info.status().ToString());
  v1::GatherTokensRequest gather;
  *gather.mutable_activations() =
      tc::TensorRef::InBuffer("shrinking", 0).Dtype(v1::DTYPE_FLOAT32).Shape({1, kS, kC}).ToProto();
  *gather.mutable_indices() = tc::TensorRef::InBuffer("shrinking", kActBytes)
                                  .Dtype(v1::DTYPE_INT32)
                                  .Shape({1, kR})
                                  .ToProto();
  const tc::Client bound = (*session)->client();
  const absl::Status before = bound.GatherTokens(gather).status();
  Print(absl::StrCat("READY sealed=", info->sealed() ? 1 : 0));
  if (ftruncate(region->fd(), 0) != 0) return Fail(absl::StrCat("ftruncate: ", strerror(errno)));
  const absl::Status after = bound.GatherTokens(gather).status();
  absl::StatusOr<v1::ListBuffersResponse> listed = bound.ListBuffers();
  Print(absl::StrCat("RESULT before=", Code(before), " after=", Code(after),
                     " buffers=", listed.ok() ? listed->buffers_size() : -1));
  std::fprintf(stderr, "after truncation: %s\n", after.ToString().c_str());
  return 0;
}

// --------------------------------------------------------- hoard-sessions --

int HoardSessions(const std::map<std::string, std::string>& flags) {
  absl::StatusOr<tc::Client> client = Connect(flags);
  if (!client.ok()) return Fail(client.status().ToString());
  Print("READY");
  const int count = std::stoi(flags.at("count"));
  int opened = 0;
  absl::Status last;
  v1::OpenSessionRequest request;
  request.set_lease_ttl_ms(uint64_t{1} << 40);  // "forever" (the server caps it)
  for (; opened < count; ++opened) {
    last = client->OpenSession(request).status();
    if (!last.ok()) break;
  }
  Print(absl::StrCat("RESULT opened=", opened, " code=", Code(last)));
  std::fprintf(stderr, "last OpenSession: %s\n", last.ToString().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string command = argv[1];
  const std::map<std::string, std::string> flags = ParseFlags(argc, argv);
  if (!DropPrivileges(flags))
    return Fail(absl::StrCat("cannot drop privileges: ", strerror(errno)));
  if (command == "race") return Race(flags);
  if (command == "flip") return Flip(flags);
  if (command == "by-name") return ByName(flags);
  if (command == "steal") return Steal(flags);
  if (command == "truncate") return Truncate(flags);
  if (command == "hoard-sessions") return HoardSessions(flags);
  return 2;
}
