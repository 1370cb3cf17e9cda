// GPU conformance: CUDA SegmentSeqlens vs the CPU twin (the oracle) on random
// valid inputs (self and cross attention, every mask, int32/int64 ids and
// positions, strided/misaligned views, packed on/off, multi-tile T, NS beyond
// the shared-memory aggregate limit) and on corrupted inputs, where the
// message must equal the CPU's byte for byte and no output may change.
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/kernels/segment_test_harness.h"

namespace tokensel::segtest {
namespace {

using gputest::DeviceBuffer;
using gputest::DeviceMirror;
using gputest::TestStream;
using kernels::SegmentSeqlensArgs;
using kernels::SegmentSeqlensSide;
using testing::segref::PosStyle;
using testing::segref::SideRows;

// Host inputs of one case (the same tensors feed the CPU and, mirrored, the
// GPU) and two identically poisoned output sets.
struct Inputs {
  TestTensor iq, pq, ikv, pkv;
};

SegmentSeqlensArgs HostArgs(const Case& c, const Options& o, Inputs* in) {
  SegmentSeqlensArgs args;
  in->iq = MakeIndex(o.ids_dtype, c.ids_q, c.tq, o.in_layout);
  args.segment_ids_q = in->iq.view();
  args.max_segments = c.ns;
  args.mask = c.mask;
  if (!c.pos_q.empty()) {
    in->pq = MakeIndex(o.pos_dtype, c.pos_q, c.tq, o.in_layout);
    args.segment_pos_q = in->pq.view();
  }
  if (c.cross) {
    const DType kv_dtype = o.ids_dtype == DType::kInt32 ? DType::kInt64 : DType::kInt32;
    in->ikv = MakeIndex(kv_dtype, c.ids_kv, c.tkv, o.in_layout);
    args.segment_ids_kv = in->ikv.view();
    if (!c.pos_kv.empty()) {
      in->pkv = MakeIndex(o.pos_dtype, c.pos_kv, c.tkv, o.in_layout);
      args.segment_pos_kv = in->pkv.view();
    }
  }
  return args;
}

// Device mirrors of every view in `args`, and the args over them.
struct DeviceArgs {
  std::vector<std::unique_ptr<DeviceMirror>> mirrors;
  std::vector<std::unique_ptr<DeviceMirror>> outputs;
  SegmentSeqlensArgs args;

  kernels::TensorView In(const kernels::TensorView& v) {
    mirrors.push_back(std::make_unique<DeviceMirror>(v));
    return mirrors.back()->view();
  }
  kernels::TensorView Out(const kernels::TensorView& v) {
    outputs.push_back(std::make_unique<DeviceMirror>(v));
    return outputs.back()->view();
  }
  SegmentSeqlensSide Side(const SegmentSeqlensSide& s) {
    SegmentSeqlensSide d{Out(s.seqlen), Out(s.offset), std::nullopt};
    if (s.packed.has_value()) {
      d.packed = kernels::PackedSeqlens{Out(s.packed->seqlens), Out(s.packed->offsets),
                                        Out(s.packed->cu_seqlens)};
    }
    return d;
  }
  explicit DeviceArgs(const SegmentSeqlensArgs& host) : args(host) {
    args.segment_ids_q = In(host.segment_ids_q);
    if (host.segment_pos_q) args.segment_pos_q = In(*host.segment_pos_q);
    if (host.segment_ids_kv) args.segment_ids_kv = In(*host.segment_ids_kv);
    if (host.segment_pos_kv) args.segment_pos_kv = In(*host.segment_pos_kv);
    args.q = Side(host.q);
    if (host.kv) args.kv = Side(*host.kv);
  }
  void CopyBack() {
    for (auto& m : outputs) m->CopyBack();
  }
};

absl::Status RunGpu(const SegmentSeqlensArgs& host_args) {
  DeviceArgs d(host_args);
  const size_t bytes = kernels::cuda::SegmentSeqlensWorkspaceBytes(d.args);
  EXPECT_GE(bytes, kernels::cuda::kDeviceStatusBytes);
  DeviceBuffer ws(bytes);
  TestStream stream;
  absl::Status st = kernels::cuda::SegmentSeqlensAsync(d.args, ws.workspace(), stream.get());
  if (st.ok()) st = kernels::cuda::SegmentSeqlensFinish(d.args, ws.workspace(), stream.get());
  d.CopyBack();
  return st;
}

// Runs the case on both backends; outputs and status must agree exactly, and
// on error no GPU output may have changed.
void ExpectGpuMatchesCpu(const Case& c, const Options& o, const std::string& what) {
  SCOPED_TRACE(what);
  Inputs in;
  SegmentSeqlensArgs args = HostArgs(c, o, &in);
  const int64_t batch = static_cast<int64_t>(c.ids_q.size());
  SideOut cpu_q(batch, c.ns, o.packed, o.out_layout), gpu_q(batch, c.ns, o.packed, o.out_layout);
  std::unique_ptr<SideOut> cpu_kv, gpu_kv;
  args.q = cpu_q.Side();
  if (c.cross) {
    cpu_kv = std::make_unique<SideOut>(batch, c.ns, o.packed, o.out_layout);
    gpu_kv = std::make_unique<SideOut>(batch, c.ns, o.packed, o.out_layout);
    args.kv = cpu_kv->Side();
  }
  const absl::Status cpu = kernels::cpu::SegmentSeqlens(args, nullptr);
  args.q = gpu_q.Side();
  if (c.cross) args.kv = gpu_kv->Side();
  const absl::Status gpu = RunGpu(args);
  ASSERT_EQ(gpu.code(), cpu.code()) << "gpu: " << gpu << "\ncpu: " << cpu;
  EXPECT_EQ(gpu.message(), cpu.message());
  if (!cpu.ok()) {
    EXPECT_TRUE(gpu_q.Untouched());
    if (c.cross) {
      EXPECT_TRUE(gpu_kv->Untouched());
    }
    return;
  }
  auto same = [&](SideOut& want, SideOut& got, const char* side) {
    SCOPED_TRACE(side);
    const SideResult w = want.Read(), g = got.Read();
    EXPECT_EQ(g.seqlen, w.seqlen);
    EXPECT_EQ(g.offset, w.offset);
    if (o.packed) {
      const PackedResult pw = want.ReadPacked(), pg = got.ReadPacked();
      EXPECT_EQ(pg.seqlens, pw.seqlens);
      EXPECT_EQ(pg.offsets, pw.offsets);
      EXPECT_EQ(pg.cu_seqlens, pw.cu_seqlens);
    }
    EXPECT_TRUE(got.GapsUntouched());
  };
  same(cpu_q, gpu_q, "q");
  if (c.cross) same(*cpu_kv, *gpu_kv, "kv");
}

// `batch` random valid rows (padded to a common length per side).
Case RandomCase(std::mt19937_64& rng, int64_t batch, int64_t ns, int64_t max_len, bool cross,
                AttnMaskType mask, PosStyle style) {
  std::vector<SideRows> q(batch), kv(batch);
  int64_t tq = 1, tkv = 1;
  for (int64_t b = 0; b < batch; ++b) {
    testing::segref::RandomPair(rng, ns, max_len, style, &q[b], &kv[b]);
    tq = std::max<int64_t>(tq, q[b].ids.size());
    tkv = std::max<int64_t>(tkv, kv[b].ids.size());
  }
  Case c;
  c.cross = cross;
  c.ns = ns;
  c.mask = mask;
  c.tq = tq;
  c.tkv = cross ? tkv : 0;
  for (int64_t b = 0; b < batch; ++b) {
    q[b].ids.resize(tq, 0);
    q[b].pos.resize(tq, -1);
    c.ids_q.push_back(q[b].ids);
    if (cross) {
      kv[b].ids.resize(tkv, 0);
      kv[b].pos.resize(tkv, -1);
      c.pos_q.push_back(q[b].pos);
      c.ids_kv.push_back(kv[b].ids);
      c.pos_kv.push_back(kv[b].pos);
    }
  }
  return c;
}

class SegmentSeqlensGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { TOKENSEL_REQUIRE_GPU(); }
};

const AttnMaskType kMasks[] = {AttnMaskType::kPadding, AttnMaskType::kCausal,
                               AttnMaskType::kCausalBottomRight};

TEST_F(SegmentSeqlensGpuTest, RandomSelfAttention) {
  std::mt19937_64 rng(1);
  for (int iter = 0; iter < 40; ++iter) {
    const int64_t batch = 1 + static_cast<int64_t>(rng() % 5);
    const int64_t ns = 1 + static_cast<int64_t>(rng() % 40);
    Options o;
    o.ids_dtype = rng() % 2 ? DType::kInt32 : DType::kInt64;
    o.packed = rng() % 3 != 0;
    if (rng() % 2) o.in_layout = {{1, 3}, 4};
    if (rng() % 2) o.out_layout = {{0, 2}, 0};
    const Case c = RandomCase(rng, batch, ns, 1 + rng() % 60, false, AttnMaskType::kPadding,
                              PosStyle::kStandard);
    ExpectGpuMatchesCpu(c, o, "self iter " + std::to_string(iter));
  }
}

TEST_F(SegmentSeqlensGpuTest, RandomCrossAttentionEveryMask) {
  std::mt19937_64 rng(2);
  for (int iter = 0; iter < 60; ++iter) {
    const int64_t batch = 1 + static_cast<int64_t>(rng() % 4);
    const int64_t ns = 1 + static_cast<int64_t>(rng() % 30);
    const AttnMaskType mask = kMasks[iter % 3];
    const PosStyle style = static_cast<PosStyle>(rng() % 3);
    Options o;
    o.ids_dtype = rng() % 2 ? DType::kInt32 : DType::kInt64;
    o.pos_dtype = rng() % 2 ? DType::kInt32 : DType::kInt64;
    o.packed = rng() % 3 != 0;
    if (rng() % 2) o.in_layout = {{0, 2}, 4};
    const Case c = RandomCase(rng, batch, ns, 1 + rng() % 40, true, mask, style);
    ExpectGpuMatchesCpu(c, o, "cross iter " + std::to_string(iter));
  }
}

// Rows longer than one 1024-token tile (running prefixes across tiles), and
// NS large enough that the aggregates leave shared memory.
TEST_F(SegmentSeqlensGpuTest, LongRowsAndManySegments) {
  std::mt19937_64 rng(3);
  ExpectGpuMatchesCpu(
      RandomCase(rng, 2, 64, 300, false, AttnMaskType::kPadding, PosStyle::kStandard), {},
      "self long");
  for (AttnMaskType mask : kMasks) {
    ExpectGpuMatchesCpu(RandomCase(rng, 2, 48, 400, true, mask, PosStyle::kRandom), {},
                        "cross long");
    ExpectGpuMatchesCpu(RandomCase(rng, 2, 1500, 3, true, mask, PosStyle::kStriped), {},
                        "cross many segments (global aggregates)");
  }
  ExpectGpuMatchesCpu(
      RandomCase(rng, 1, 20000, 2, false, AttnMaskType::kPadding, PosStyle::kStandard), {},
      "self NS=20000");
}

TEST_F(SegmentSeqlensGpuTest, EmptyAndAllPadding) {
  Case c = SelfCase({{0, 0, 0}, {0, 0, 0}}, 3);
  ExpectGpuMatchesCpu(c, {}, "all padding");
  Case empty = SelfCase({{}, {}}, 2);
  ExpectGpuMatchesCpu(empty, {}, "T = 0");
  Case none = SelfCase({}, 2);
  ExpectGpuMatchesCpu(none, {}, "B = 0");
}

// Corrupts one token of a random valid case: every data-error kind, on either
// side, must give the CPU's message and leave every output untouched.
TEST_F(SegmentSeqlensGpuTest, ErrorsMatchCpuMessages) {
  std::mt19937_64 rng(4);
  for (int iter = 0; iter < 60; ++iter) {
    const bool cross = iter % 2 == 1;
    const AttnMaskType mask = cross ? kMasks[(iter / 2) % 3] : AttnMaskType::kPadding;
    Case c = RandomCase(rng, 1 + rng() % 3, 8, 6, cross, mask, PosStyle::kStandard);
    const bool kv_side = cross && rng() % 2;
    std::vector<Row>& ids = kv_side ? c.ids_kv : c.ids_q;
    const int64_t b = static_cast<int64_t>(rng() % ids.size());
    const int64_t t = static_cast<int64_t>(rng() % ids[b].size());
    switch (rng() % 5) {
      case 0:
        ids[b][t] = c.ns + 1 + static_cast<int64_t>(rng() % 5);
        break;
      case 1:
        ids[b][t] = -1;
        break;
      case 2:
        ids[b].back() = ids[b].front() == 0 ? 1 : ids[b].front();
        break;
      case 3:  // a decreasing id (or an id seen earlier)
        ids[b][0] = 5;
        if (t > 0) ids[b][t] = ids[b][t - 1] == 0 ? 1 : ids[b][t - 1];
        break;
      default:
        if (cross && mask != AttnMaskType::kPadding) {
          std::vector<Row>& pos = kv_side ? c.pos_kv : c.pos_q;
          for (size_t i = 0; i < ids[b].size(); ++i) {
            if (ids[b][i] != 0) pos[b][i] = -1 - static_cast<int64_t>(rng() % 3);
          }
        } else {
          ids[b][t] = -7;
        }
    }
    Options o;
    o.ids_dtype = rng() % 2 ? DType::kInt32 : DType::kInt64;
    ExpectGpuMatchesCpu(c, o, "error iter " + std::to_string(iter));
  }
}

TEST_F(SegmentSeqlensGpuTest, MetadataErrorsEnqueueNothing) {
  Case c = SelfCase({{1, 1, 2}}, 2);
  Inputs in;
  SegmentSeqlensArgs args = HostArgs(c, {}, &in);
  SideOut out(1, 2, false);
  args.q = out.Side();
  args.max_segments = 0;  // invalid metadata: rejected before any device work
  DeviceBuffer ws(kernels::cuda::kDeviceStatusBytes);
  TestStream stream;
  const absl::Status st = kernels::cuda::SegmentSeqlensAsync(args, ws.workspace(), stream.get());
  EXPECT_EQ(st, kernels::cpu::SegmentSeqlens(args, nullptr));
}

}  // namespace
}  // namespace tokensel::segtest
