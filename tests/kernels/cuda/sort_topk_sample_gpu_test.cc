// GPU conformance of SortTokens, TopKTokens and SampleTokens (SamplePackedTokens:
// sample_packed_gpu_test.cc): the CUDA op and
// the CPU op (the oracle) run on byte-identical host tensors (random data,
// both index dtypes, padded / strided / misaligned views, large S), and the
// whole backing stores must end up byte-identical, gaps included, with the
// same status (code and message). Error cases therefore also prove that the
// CUDA path wrote nothing the CPU path did not (nothing at all).
// Skips with "no CUDA device: ..." when there is no device.
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/testing/test_tensor.h"

namespace tokensel::kernels::cuda::sort_topk_sample_test {
namespace {

using gputest::DeviceBuffer;
using gputest::DeviceMirror;
using gputest::TestStream;
using testing::Layout;
using testing::TestTensor;

// The same tensor twice: `cpu` for the oracle, `gpu` mirrored to the device.
// `fill` runs on both so their contents are identical (copying a TestTensor
// would not preserve the data offset).
struct Twin {
  TestTensor cpu;
  TestTensor gpu;
  int64_t last_step = 1;  // element step of the last dim in the view

  TensorView View(TestTensor& t) const {
    TensorView v = t.view();
    if (last_step != 1) {
      v.shape[v.rank - 1] /= last_step;
      v.strides[v.rank - 1] *= last_step;
    }
    return v;
  }
};

// A twin of logical shape `shape` whose last dim has element step `step`.
std::unique_ptr<Twin> MakeTwin(DType dtype, std::vector<int64_t> shape, Layout layout, int64_t step,
                               const std::function<void(TestTensor&, Twin&)>& fill) {
  auto twin = std::make_unique<Twin>();
  shape.back() *= step;
  twin->cpu = TestTensor(dtype, shape, layout);
  twin->gpu = TestTensor(dtype, shape, layout);
  twin->last_step = step;
  fill(twin->cpu, *twin);
  fill(twin->gpu, *twin);
  return twin;
}

void Sentinel(TestTensor& t, Twin&) { t.Fill(0xC5); }

// Runs the CUDA op on device mirrors of the gpu views and compares with the
// oracle's status and every twin's bytes.
template <typename Args>
void Compare(const std::function<Args(const std::vector<TensorView>&)>& make_args,
             const std::vector<Twin*>& twins,
             const std::function<absl::Status(const Args&)>& run_cpu,
             size_t (*ws_bytes)(const Args&), absl::Status (*async)(const Args&, Workspace, Stream),
             absl::Status (*finish)(const Args&, Workspace, Stream)) {
  std::vector<TensorView> cpu_views, host_gpu_views, dev_views;
  std::vector<std::unique_ptr<DeviceMirror>> mirrors;
  for (Twin* t : twins) {
    cpu_views.push_back(t->View(t->cpu));
    host_gpu_views.push_back(t->View(t->gpu));
    mirrors.push_back(std::make_unique<DeviceMirror>(host_gpu_views.back()));
    dev_views.push_back(mirrors.back()->view());
  }
  const absl::Status cpu_status = run_cpu(make_args(cpu_views));
  const Args dev_args = make_args(dev_views);
  TestStream stream;
  DeviceBuffer ws(ws_bytes(dev_args));
  absl::Status gpu_status = async(dev_args, ws.workspace(), stream.get());
  if (gpu_status.ok()) gpu_status = finish(dev_args, ws.workspace(), stream.get());
  for (auto& m : mirrors) m->CopyBack();
  EXPECT_EQ(gpu_status, cpu_status);
  for (size_t i = 0; i < twins.size(); ++i) {
    EXPECT_TRUE(twins[i]->cpu.Bytes() == twins[i]->gpu.Bytes()) << "tensor " << i << " differs";
  }
}

class SortTopKSampleGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { TOKENSEL_REQUIRE_GPU(); }
  std::mt19937_64 rng_{20240611};
};

// ---------------------------------------------------------------- SortTokens

enum class SortError { kNone, kDuplicate, kOutOfRange, kNegative };

struct SortCase {
  DType dtype;
  std::vector<int64_t> rows;  // leading dims
  int64_t s;
  int64_t r;
  int mode;  // 0 in place (out absent), 1 out, 2 out = ids view (in place)
  bool inverse;
  Layout layout;
  int64_t step;
  SortError error;
};

void RunSort(const SortCase& c, std::mt19937_64& rng) {
  std::vector<int64_t> shape = c.rows;
  shape.push_back(c.r);
  int64_t rows = 1;
  for (int64_t n : c.rows) rows *= n;
  std::vector<int64_t> values;
  std::vector<int64_t> perm(static_cast<size_t>(c.s));
  for (int64_t row = 0; row < rows; ++row) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = 0; i < c.r; ++i) {
      if (i >= c.s) {  // R > S: a metadata error case
        values.push_back(i % c.s);
        continue;
      }
      std::swap(perm[i], perm[i + static_cast<int64_t>(rng() % (c.s - i))]);
      values.push_back(perm[i]);
    }
  }
  if (c.error != SortError::kNone) {
    const int64_t at = static_cast<int64_t>(rng() % values.size());
    const int64_t pos = at % c.r;
    if (c.error == SortError::kDuplicate && c.r > 1) {
      const int64_t other = pos == 0 ? 1 : static_cast<int64_t>(rng() % pos);
      values[at] = values[at - pos + other];
    } else if (c.error == SortError::kNegative) {
      values[at] = -1 - static_cast<int64_t>(rng() % 5);
    } else {
      values[at] = c.s + static_cast<int64_t>(rng() % 3);
    }
  }
  auto ids = MakeTwin(c.dtype, shape, c.layout, c.step, [&](TestTensor& t, Twin& tw) {
    t.Fill(0xAB);
    TensorView v = tw.View(t);
    for (size_t i = 0; i < values.size(); ++i) {
      StoreIndex(v, LinearToOffset(v, static_cast<int64_t>(i)), values[i]);
    }
  });
  std::vector<Twin*> twins = {ids.get()};
  std::unique_ptr<Twin> out, inv;
  if (c.mode == 1) {
    out = MakeTwin(c.dtype, shape, {}, 1, Sentinel);
    twins.push_back(out.get());
  }
  if (c.inverse) {
    std::vector<int64_t> inv_shape = c.rows;
    inv_shape.push_back(c.s);
    inv = MakeTwin(DType::kInt32, inv_shape, {.pad = {}, .misalign = 4}, 1, Sentinel);
    twins.push_back(inv.get());
  }
  const int mode = c.mode;
  const bool has_inv = c.inverse;
  const int64_t s = c.s;
  Compare<SortTokensArgs>(
      [&](const std::vector<TensorView>& v) {
        SortTokensArgs a;
        a.ids = v[0];
        a.original_tokens = s;
        if (mode == 1) a.out = v[1];
        if (mode == 2) a.out = v[0];
        if (has_inv) a.inverse = v.back();
        return a;
      },
      twins, [](const SortTokensArgs& a) { return cpu::SortTokens(a, nullptr); },
      SortTokensWorkspaceBytes, SortTokensAsync, SortTokensFinish);
}

TEST_F(SortTopKSampleGpuTest, SortSpecVector) {
  RunSort({DType::kInt32, {1, 1}, 10, 4, 0, true, {}, 1, SortError::kNone}, rng_);
}

TEST_F(SortTopKSampleGpuTest, SortRandom) {
  for (DType dtype : {DType::kInt32, DType::kInt64}) {
    for (int mode : {0, 1, 2}) {
      for (bool inverse : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "dtype " << static_cast<int>(dtype) << " mode " << mode
                                          << " inverse " << inverse);
        RunSort({dtype, {2, 3}, 1, 1, mode, inverse, {}, 1, SortError::kNone}, rng_);
        RunSort({dtype, {12, 16}, 2048, 1536, mode, inverse, {}, 1, SortError::kNone}, rng_);
        RunSort({dtype,
                 {3},
                 777,
                 5,
                 mode,
                 inverse,
                 {.pad = {1, 3}, .misalign = 2},
                 1,
                 SortError::kNone},
                rng_);
        RunSort({dtype, {2, 2}, 300, 300, mode, inverse, {}, 3, SortError::kNone}, rng_);
        // Several 65536-id chunks per row: the multi-block path.
        RunSort({dtype, {2}, 200003, 70000, mode, inverse, {}, 1, SortError::kNone}, rng_);
        RunSort({dtype, {1}, 131072, 17, mode, inverse, {}, 2, SortError::kNone}, rng_);
      }
    }
  }
}

TEST_F(SortTopKSampleGpuTest, SortErrorsWriteNothing) {
  for (DType dtype : {DType::kInt32, DType::kInt64}) {
    for (SortError e : {SortError::kDuplicate, SortError::kOutOfRange, SortError::kNegative}) {
      for (int mode : {0, 1}) {
        RunSort({dtype, {4, 5}, 100, 40, mode, true, {}, 1, e}, rng_);
        RunSort({dtype, {2}, 150000, 9000, mode, true, {.pad = {2}, .misalign = 0}, 1, e}, rng_);
      }
    }
  }
}

TEST_F(SortTopKSampleGpuTest, SortMetadataErrorEnqueuesNothing) {
  RunSort({DType::kInt32, {2}, 5, 6, 0, false, {}, 1, SortError::kNone}, rng_);  // R > S
}

// ---------------------------------------------------------------- TopKTokens

// Raw score bits: random, or drawn from a small set (ties, NaN, +-0, +-inf).
uint32_t ScoreBits(DType dtype, int kind, std::mt19937_64& rng) {
  if (dtype == DType::kFloat32) {
    static const uint32_t kSpecial[] = {0x7FC00000u, 0xFFC00001u, 0x80000000u, 0x00000000u,
                                        0x7F800000u, 0xFF800000u, 0x3F800000u, 0xBF800000u};
    return kind == 0 ? static_cast<uint32_t>(rng()) : kSpecial[rng() % 8];
  }
  static const uint16_t kF16[] = {0x7E00, 0xFE01, 0x8000, 0x0000, 0x7C00, 0xFC00, 0x3C00, 0xBC00};
  static const uint16_t kBF16[] = {0x7FC0, 0xFFC1, 0x8000, 0x0000, 0x7F80, 0xFF80, 0x3F80, 0xBF80};
  if (kind == 0) return static_cast<uint16_t>(rng());
  return dtype == DType::kFloat16 ? kF16[rng() % 8] : kBF16[rng() % 8];
}

void RunTopK(DType score_dtype, DType id_dtype, std::vector<int64_t> rows, int64_t s, int64_t r,
             int kind, Layout layout, int64_t step, std::mt19937_64& rng) {
  std::vector<int64_t> shape = rows;
  shape.push_back(s);
  int64_t n = s;
  for (int64_t d : rows) n *= d;
  std::vector<uint32_t> bits(static_cast<size_t>(n));
  for (auto& b : bits) b = ScoreBits(score_dtype, kind, rng);
  auto scores = MakeTwin(score_dtype, shape, layout, step, [&](TestTensor& t, Twin& tw) {
    t.Fill(0x11);
    TensorView v = tw.View(t);
    for (int64_t i = 0; i < n; ++i) {
      char* p = v.At(LinearToOffset(v, i));
      if (score_dtype == DType::kFloat32) {
        std::memcpy(p, &bits[i], 4);
      } else {
        const auto b16 = static_cast<uint16_t>(bits[i]);
        std::memcpy(p, &b16, 2);
      }
    }
  });
  std::vector<int64_t> id_shape = rows;
  id_shape.push_back(r);
  auto ids = MakeTwin(id_dtype, id_shape, {.pad = {}, .misalign = 0}, 1, Sentinel);
  Compare<TopKTokensArgs>(
      [](const std::vector<TensorView>& v) {
        return TopKTokensArgs{v[0], v[1]};
      },
      {scores.get(), ids.get()},
      [](const TopKTokensArgs& a) { return cpu::TopKTokens(a, nullptr); }, TopKTokensWorkspaceBytes,
      TopKTokensAsync, TopKTokensFinish);
}

TEST_F(SortTopKSampleGpuTest, TopKRandom) {
  for (DType sd : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (DType id : {DType::kInt32, DType::kInt64}) {
      for (int kind : {0, 1}) {
        SCOPED_TRACE(::testing::Message()
                     << "score dtype " << static_cast<int>(sd) << " kind " << kind);
        for (int64_t r : {int64_t{0}, int64_t{1}, int64_t{700}, int64_t{1535}, int64_t{2048}}) {
          RunTopK(sd, id, {12, 2}, 2048, r, kind, {}, 1, rng_);
        }
        RunTopK(sd, id, {3}, 1, 1, kind, {}, 1, rng_);
        RunTopK(sd, id, {5}, 7, 3, kind, {.pad = {1}, .misalign = 2}, 2, rng_);
        RunTopK(sd, id, {2}, 100000, 31337, kind, {}, 1, rng_);
      }
    }
  }
}

// --------------------------------------------------------------- SampleTokens

void RunSample(int64_t L, int64_t B, int64_t S, int64_t R, uint64_t seed, uint64_t step,
               DType id_dtype, bool inverse, int mask_kind, std::mt19937_64& rng) {
  std::vector<Twin*> twins;
  auto ids = MakeTwin(id_dtype, {L, B, R}, {.pad = {0, 1, 2}, .misalign = 0}, 1, Sentinel);
  twins.push_back(ids.get());
  std::unique_ptr<Twin> inv, mask, mask_out;
  if (inverse) {
    inv = MakeTwin(DType::kInt32, {L, B, S}, {}, 1, Sentinel);
    twins.push_back(inv.get());
  }
  const int64_t H = 2;
  if (mask_kind != 0) {
    const int64_t sq = mask_kind == 1 ? 1 : S;
    const uint64_t fill_seed = rng();
    mask = MakeTwin(DType::kFloat16, {B, H, sq, S}, {}, 1, [&](TestTensor& t, Twin&) {
      std::mt19937_64 local(fill_seed);
      t.FillRandom(local);
    });
    twins.push_back(mask.get());
    if (mask_kind == 1) {
      mask_out = MakeTwin(DType::kFloat16, {L, B, H, R, R}, {}, 1, Sentinel);
    } else {
      mask_out = MakeTwin(DType::kFloat16, {B, H, R, R}, {}, 1, Sentinel);
    }
    twins.push_back(mask_out.get());
  }
  Compare<SampleTokensArgs>(
      [&](const std::vector<TensorView>& v) {
        SampleTokensArgs a;
        a.layers = L;
        a.batch = B;
        a.original_tokens = S;
        a.retained_tokens = R;
        a.seed = seed;
        a.step = step;
        size_t i = 0;
        a.ids = v[i++];
        if (inverse) a.inverse = v[i++];
        if (mask_kind != 0) {
          a.mask = v[i++];
          if (mask_kind == 1) {
            a.bert_mask = v[i++];
          } else {
            a.gpt_mask = v[i++];
          }
        }
        return a;
      },
      twins, [](const SampleTokensArgs& a) { return cpu::SampleTokens(a, nullptr); },
      SampleTokensWorkspaceBytes, SampleTokensAsync, SampleTokensFinish);
}

TEST_F(SortTopKSampleGpuTest, SampleMatchesCpuBitForBit) {
  for (DType id : {DType::kInt32, DType::kInt64}) {
    for (bool inverse : {false, true}) {
      RunSample(12, 16, 2048, 1536, 1234, 7, id, inverse, 0, rng_);
      RunSample(2, 3, 1, 1, 99, 0, id, inverse, 0, rng_);
      RunSample(2, 3, 9, 0, 99, 0, id, inverse, 0, rng_);
      RunSample(2, 3, 9, 9, 99, 0, id, inverse, 0, rng_);
      RunSample(3, 2, 1001, 17, 0xFFFFFFFFFFFFull, 0xFFFFFFFFull, id, inverse, 0, rng_);
      RunSample(1, 2, 300001, 150000, 5, 3, id, inverse, 0, rng_);
    }
  }
}

TEST_F(SortTopKSampleGpuTest, SampleWithMasks) {
  RunSample(2, 2, 64, 24, 42, 1, DType::kInt32, true, 1, rng_);   // bert, Sq = 1
  RunSample(2, 2, 64, 24, 42, 1, DType::kInt64, false, 2, rng_);  // gpt
}

}  // namespace
}  // namespace tokensel::kernels::cuda::sort_topk_sample_test
