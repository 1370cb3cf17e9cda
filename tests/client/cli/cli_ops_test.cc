// The one-off op subcommands: .npy files in, the CLI as a subprocess against
// a real server, .npy files out, compared with kernels::cpu on the same
// inputs.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "client/cli/npy.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/client/cli/cli_fixture.h"
#include "tests/kernels/merge_split_reference.h"
#include "tests/kernels/sample_packed_reference.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::cli::testing {
namespace {

using kernels::DType;
using kernels::TensorView;
using ::testing::HasSubstr;

NpyArray Array(DType dtype, std::vector<int64_t> shape) {
  NpyArray a;
  a.dtype = dtype;
  a.shape = std::move(shape);
  a.data.assign(static_cast<size_t>(a.NumElements() * kernels::ElementSize(dtype)), '\0');
  return a;
}

TensorView View(NpyArray& a) {
  return TensorView::Contiguous(a.data.data(), a.dtype, absl::MakeConstSpan(a.shape));
}

template <typename T>
T* Data(NpyArray& a) {
  return reinterpret_cast<T*>(a.data.data());
}

class CliOpsTest : public CliServerTest {
 protected:
  std::string Save(const std::string& name, const NpyArray& a) {
    const std::string path = dir_.Path(name);
    EXPECT_OK(WriteNpy(path, a));
    return path;
  }
  NpyArray Load(const std::string& name) {
    auto a = ReadNpy(dir_.Path(name));
    EXPECT_OK(a);
    return a.ok() ? *std::move(a) : NpyArray();
  }
  void ExpectSame(const std::string& name, const NpyArray& oracle) {
    const NpyArray got = Load(name);
    EXPECT_EQ(got.dtype, oracle.dtype) << name;
    EXPECT_EQ(got.shape, oracle.shape) << name;
    EXPECT_TRUE(got.data == oracle.data) << name << " differs from the CPU oracle";
  }
  // Rows of `r` distinct ids in [0, s), shuffled.
  template <typename T>
  void FillDistinct(NpyArray& a, int64_t s) {
    const int64_t r = a.shape.back();
    std::vector<T> perm(static_cast<size_t>(s));
    for (int64_t row = 0; row < a.NumElements() / r; ++row) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng_);
      std::copy(perm.begin(), perm.begin() + r, Data<T>(a) + row * r);
    }
  }
  void FillRandom(NpyArray& a) {
    for (char& c : a.data) c = static_cast<char>(rng_());
  }

  TempDir dir_;
  std::mt19937_64 rng_{7};
};

TEST_F(CliOpsTest, SortWithInverse) {
  constexpr int64_t kS = 37, kR = 11;
  NpyArray ids = Array(DType::kInt64, {3, 2, kR});
  FillDistinct<int64_t>(ids, kS);
  NpyArray out = Array(DType::kInt64, {3, 2, kR});
  NpyArray inverse = Array(DType::kInt32, {3, 2, kS});
  ASSERT_OK(kernels::cpu::SortTokens({View(ids), kS, View(out), View(inverse)}, nullptr));
  CliResult r = Run("sort", {"--ids=" + Save("ids.npy", ids), "--original_tokens=37",
                             "--out=" + dir_.Path("out.npy"), "--inverse=" + dir_.Path("inv.npy")});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_THAT(r.out, HasSubstr("wrote " + dir_.Path("out.npy") + " int64[3,2,11]"));
  ExpectSame("out.npy", out);
  ExpectSame("inv.npy", inverse);
}

TEST_F(CliOpsTest, GatherBatchFirstAndSeqFirst) {
  for (const bool seq_first : {false, true}) {
    constexpr int64_t kB = 2, kS = 16, kC = 5, kR = 6;
    NpyArray act = Array(DType::kFloat32, seq_first ? std::vector<int64_t>{kS, kB, kC}
                                                    : std::vector<int64_t>{kB, kS, kC});
    FillRandom(act);
    NpyArray idx = Array(DType::kInt32, {kB, kR});
    for (int64_t i = 0; i < kB * kR; ++i) Data<int32_t>(idx)[i] = static_cast<int32_t>(rng_() % kS);
    NpyArray out = Array(DType::kFloat32, seq_first ? std::vector<int64_t>{kR, kB, kC}
                                                    : std::vector<int64_t>{kB, kR, kC});
    ASSERT_OK(kernels::cpu::GatherTokens({View(act), View(idx), View(out), !seq_first}, nullptr));
    std::vector<std::string> args = {"--activations=" + Save("act.npy", act),
                                     "--indices=" + Save("idx.npy", idx),
                                     "--out=" + dir_.Path("out.npy")};
    if (seq_first) args.push_back("--seq_first");
    CliResult r = Run("gather", args);
    ASSERT_EQ(r.exit_code, 0) << r.Describe();
    ExpectSame("out.npy", out);
  }
}

TEST_F(CliOpsTest, GatherOutOfRangeIndexFailsWithTheServersMessage) {
  NpyArray act = Array(DType::kFloat16, {1, 4, 2});
  NpyArray idx = Array(DType::kInt32, {1, 2});
  Data<int32_t>(idx)[1] = 9;
  CliResult r = Run("gather", {"--activations=" + Save("a.npy", act),
                               "--indices=" + Save("i.npy", idx), "--out=" + dir_.Path("o.npy")});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(r.err, HasSubstr("indices[0,1] = 9"));
}

TEST_F(CliOpsTest, ScatterInt16) {
  constexpr int64_t kB = 3, kS = 12, kC = 4, kR = 5;
  NpyArray all = Array(DType::kInt16, {kB, kS, kC});
  NpyArray layer = Array(DType::kInt16, {kB, kR, kC});
  NpyArray idx = Array(DType::kInt64, {kB, kR});
  FillRandom(all);
  FillRandom(layer);
  FillDistinct<int64_t>(idx, kS);
  const std::string all_path = Save("all.npy", all);
  ASSERT_OK(kernels::cpu::ScatterTokens({View(all), View(layer), View(idx), true}, nullptr));
  CliResult r =
      Run("scatter", {"--all=" + all_path, "--layer=" + Save("layer.npy", layer),
                      "--indices=" + Save("idx.npy", idx), "--out=" + dir_.Path("out.npy")});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  ExpectSame("out.npy", all);
}

// merge then split, seq-first, against the naive references.
TEST_F(CliOpsTest, MergeThenSplitSeqFirst) {
  constexpr int64_t kB = 2, kS = 11, kC = 3, kR = 4;
  NpyArray x = Array(DType::kFloat32, {kS, kB, kC});
  NpyArray layer = Array(DType::kFloat32, {kR, kB, kC});
  NpyArray idx = Array(DType::kInt32, {kB, kR});
  FillRandom(x);
  FillRandom(layer);
  FillDistinct<int32_t>(idx, kS);
  NpyArray merged = Array(DType::kFloat32, {kS, kB, kC});
  ::tokensel::testing::RefMerge(View(x), View(layer), View(idx), View(merged), false);
  CliResult r = Run("merge", {"--x=" + Save("x.npy", x), "--layer=" + Save("layer.npy", layer),
                              "--indices=" + Save("idx.npy", idx), "--seq_first",
                              "--out=" + dir_.Path("merged.npy")});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  ExpectSame("merged.npy", merged);

  NpyArray layer_grad = Array(DType::kFloat32, {kR, kB, kC});
  NpyArray rest_grad = Array(DType::kFloat32, {kS, kB, kC});
  ::tokensel::testing::RefSplit(View(merged), View(idx), View(layer_grad), View(rest_grad), false);
  r = Run("split",
          {"--grad=" + dir_.Path("merged.npy"), "--indices=" + dir_.Path("idx.npy"), "--seq_first",
           "--layer_grad_out=" + dir_.Path("lg.npy"), "--rest_grad_out=" + dir_.Path("rg.npy")});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  ExpectSame("lg.npy", layer_grad);
  ExpectSame("rg.npy", rest_grad);
}

// packed: every output and the fused gather against the naive reference
// (tests/kernels/sample_packed_reference.h); a bad keep rule fails with the
// server's message.
TEST_F(CliOpsTest, PackedEveryOutputAndTheGather) {
  const std::vector<int64_t> cu = {0, 3, 3, 8, 20};
  const ::tokensel::testing::PackedRule rule{1, 2, 1};
  NpyArray cu_npy = Array(DType::kInt32, {5});
  for (int i = 0; i < 5; ++i) Data<int32_t>(cu_npy)[i] = static_cast<int32_t>(cu[i]);
  NpyArray acts = Array(DType::kFloat16, {22, 3});
  FillRandom(acts);
  CliResult r =
      Run("packed",
          {"--cu_seqlens=" + Save("cu.npy", cu_npy), "--activations=" + Save("acts.npy", acts),
           "--keep=1/2", "--min_tokens=1", "--seed=9", "--step=4", "--total_tokens=22",
           "--out=" + dir_.Path("ids.npy"), "--cu_seqlens_kept_out=" + dir_.Path("ck.npy"),
           "--positions_out=" + dir_.Path("pos.npy"), "--inverse=" + dir_.Path("inv.npy"),
           "--gathered_out=" + dir_.Path("g.npy")});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  const ::tokensel::testing::PackedExpected e =
      ::tokensel::testing::ReferenceSamplePacked(cu, 22, rule, 1, 9, 4);
  const int64_t kept = e.cu_kept.back();
  auto int32_npy = [&](std::vector<int64_t> shape, const std::vector<int64_t>& values) {
    NpyArray a = Array(DType::kInt32, std::move(shape));
    for (size_t i = 0; i < values.size(); ++i)
      Data<int32_t>(a)[i] = static_cast<int32_t>(values[i]);
    return a;
  };
  ExpectSame("ids.npy", int32_npy({1, kept}, e.ids[0]));
  ExpectSame("ck.npy", int32_npy({5}, e.cu_kept));
  ExpectSame("pos.npy", int32_npy({1, kept}, e.positions[0]));
  ExpectSame("inv.npy", int32_npy({1, 22}, e.inverse[0]));
  NpyArray gathered = Array(DType::kFloat16, {kept, 3});
  for (int64_t k = 0; k < kept; ++k) {
    std::memcpy(gathered.data.data() + k * 6, acts.data.data() + e.ids[0][k] * 6, 6);
  }
  ExpectSame("g.npy", gathered);

  r = Run("packed",
          {"--cu_seqlens=" + dir_.Path("cu.npy"), "--keep=3/2", "--out=" + dir_.Path("bad.npy")});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("keep_num: 3 is out of range"));
}

TEST_F(CliOpsTest, SeqlensPacked) {
  constexpr int64_t kB = 3, kT = 32, kNS = 5;
  NpyArray seg = Array(DType::kInt32, {kB, kT});
  // Row b: segments 1..(b+2) of length 3 + b, then padding.
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t t = 0; t < kT; ++t) {
      const int64_t id = t / (3 + b) + 1;
      Data<int32_t>(seg)[b * kT + t] = id <= b + 2 ? static_cast<int32_t>(id) : 0;
    }
  }
  NpyArray q_seqlen = Array(DType::kInt32, {kB, kNS}),
           q_offset = Array(DType::kInt32, {kB, kNS + 1});
  NpyArray ps = Array(DType::kInt32, {kB * kNS}), po = Array(DType::kInt32, {kB * (kNS + 1)});
  NpyArray cu = Array(DType::kInt32, {kB * kNS + 1});
  kernels::SegmentSeqlensArgs args;
  args.segment_ids_q = View(seg);
  args.max_segments = kNS;
  args.mask = kernels::AttnMaskType::kCausal;
  args.q = {View(q_seqlen), View(q_offset), kernels::PackedSeqlens{View(ps), View(po), View(cu)}};
  ASSERT_OK(kernels::cpu::SegmentSeqlens(args, nullptr));
  CliResult r = Run("seqlens", {"--segment_ids_q=" + Save("seg.npy", seg), "--max_segments=5",
                                "--attn_mask=causal", "--packed", "--out_dir=" + dir_.Path("")});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  ExpectSame("q_seqlen.npy", q_seqlen);
  ExpectSame("q_offset.npy", q_offset);
  ExpectSame("q_packed_seqlens.npy", ps);
  ExpectSame("q_packed_offsets.npy", po);
  ExpectSame("q_cu_seqlens.npy", cu);
}

TEST_F(CliOpsTest, TopKFloat32) {
  constexpr int64_t kS = 40, kR = 7;
  NpyArray scores = Array(DType::kFloat32, {3, kS});
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < 3 * kS; ++i) Data<float>(scores)[i] = u(rng_);
  Data<float>(scores)[3] = Data<float>(scores)[4];  // a tie
  NpyArray ids = Array(DType::kInt32, {3, kR});
  ASSERT_OK(kernels::cpu::TopKTokens({View(scores), View(ids)}, nullptr));
  CliResult r = Run("topk", {"--scores=" + Save("s.npy", scores), "--retained_tokens=7",
                             "--out=" + dir_.Path("ids.npy")});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  ExpectSame("ids.npy", ids);
}

TEST_F(CliOpsTest, SampleWithInverseAndGptMask) {
  constexpr int64_t kL = 2, kB = 3, kS = 50, kR = 10;
  NpyArray mask = Array(DType::kBool, {kB, 1, kS, kS});
  for (int64_t i = 0; i < kB * kS * kS; ++i)
    mask.data[i] = static_cast<char>((i % kS) <= ((i / kS) % kS));
  NpyArray ids = Array(DType::kInt32, {kL, kB, kR});
  NpyArray inverse = Array(DType::kInt32, {kL, kB, kS});
  NpyArray gpt = Array(DType::kBool, {kB, 1, kR, kR});
  kernels::SampleTokensArgs args;
  args.layers = kL;
  args.batch = kB;
  args.original_tokens = kS;
  args.retained_tokens = kR;
  args.seed = 12345;
  args.step = 3;
  args.ids = View(ids);
  args.inverse = View(inverse);
  args.mask = View(mask);
  args.gpt_mask = View(gpt);
  ASSERT_OK(kernels::cpu::SampleTokens(args, nullptr));
  CliResult r =
      Run("sample", {"--layers=2", "--batch=3", "--original_tokens=50", "--retained_tokens=10",
                     "--seed=12345", "--step=3", "--out=" + dir_.Path("ids.npy"),
                     "--inverse=" + dir_.Path("inv.npy"), "--mask=" + Save("mask.npy", mask),
                     "--gpt_mask=" + dir_.Path("gpt.npy")});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  ExpectSame("ids.npy", ids);
  ExpectSame("inv.npy", inverse);
  ExpectSame("gpt.npy", gpt);
}

TEST_F(CliOpsTest, MissingInputFileIsReported) {
  CliResult r = Run("topk", {"--scores=" + dir_.Path("nope.npy"), "--retained_tokens=1",
                             "--out=" + dir_.Path("o.npy")});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(r.err, HasSubstr("nope.npy"));
}

}  // namespace
}  // namespace tokensel::cli::testing
