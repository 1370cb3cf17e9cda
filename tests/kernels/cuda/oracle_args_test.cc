// Host tests of the CPU oracle's args of the index ops
// (kernels/cuda/oracle_args.h): on the shrunk args the CPU op must give
// exactly the message it gives on the full args, for every kind of bad index
// (out of range, negative, duplicate) at any position, and accept the args
// when the indices are valid. If a CPU op ever checked its data against the
// payload, <Op>Finish would report another message than the CPU backend:
// this test fails first. No device: every view is host memory, and the
// "snapshot" is a compact host copy of the indices, as SnapshotKernel makes.
#include "kernels/cuda/oracle_args.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"

namespace tokensel::kernels::cuda {
namespace {

// Host memory of `bytes` (+ slack), zero-filled.
struct Buffer {
  explicit Buffer(int64_t bytes) : data(static_cast<size_t>(bytes) + 16, 0) {}
  void* get() { return data.data(); }
  std::vector<uint8_t> data;
};

// A [rows, n] index tensor with rows padded by `pad` elements, and its
// compact row-major copy (what SnapshotKernel writes into the workspace).
struct Indices {
  Indices(DType d, std::vector<int64_t> dims, int64_t row_pad)
      : dtype(d),
        shape(std::move(dims)),
        elem(ElementSize(d)),
        n(shape.back()),
        rows(Elements() / n),
        padded(rows * (n + row_pad) * elem),
        compact(rows * n * elem),
        pad(row_pad) {}
  int64_t Elements() const {
    int64_t e = 1;
    for (int64_t d : shape) e *= d;
    return e;
  }
  TensorView View() {
    std::vector<int64_t> strides(shape.size());
    int64_t stride = 1;
    for (size_t i = shape.size(); i-- > 0;) {
      strides[i] = stride;
      stride *= shape[i] + (i + 1 == shape.size() ? pad : 0);
    }
    return TensorView::Strided(padded.get(), dtype, shape, strides);
  }
  void Set(int64_t linear, int64_t value) {
    const int64_t row = linear / n;
    const int64_t pos = linear % n;
    Store(static_cast<char*>(padded.get()) + (row * (n + pad) + pos) * elem, value);
    Store(static_cast<char*>(compact.get()) + linear * elem, value);
  }
  int64_t Get(int64_t linear) const {
    const char* p = reinterpret_cast<const char*>(compact.data.data()) + linear * elem;
    if (dtype == DType::kInt64) {
      int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  void Store(char* p, int64_t value) const {
    if (dtype == DType::kInt64) {
      std::memcpy(p, &value, 8);
    } else {
      const auto v = static_cast<int32_t>(value);
      std::memcpy(p, &v, 4);
    }
  }

  DType dtype;
  std::vector<int64_t> shape;
  int64_t elem;
  int64_t n;
  int64_t rows;
  Buffer padded;
  Buffer compact;
  int64_t pad;
};

// Valid rows (unique within a row when `unique`) of values in [0, limit).
void FillValid(Indices& idx, int64_t limit, bool unique, std::mt19937_64& rng) {
  std::vector<int64_t> perm(static_cast<size_t>(limit));
  for (int64_t row = 0; row < idx.rows; ++row) {
    for (int64_t i = 0; i < limit; ++i) perm[static_cast<size_t>(i)] = i;
    for (int64_t i = 0; i < idx.n; ++i) {
      const int64_t j = i + static_cast<int64_t>(rng() % static_cast<uint64_t>(limit - i));
      std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
      idx.Set(row * idx.n + i,
              unique ? perm[static_cast<size_t>(i)] : static_cast<int64_t>(rng() % limit));
    }
  }
}

// The bad values a client can plant at `linear`: out of range, negative and,
// when indices must be unique within a row, a duplicate of another element.
std::vector<int64_t> BadValues(const Indices& idx, int64_t linear, int64_t limit, bool unique) {
  const int64_t lowest = idx.dtype == DType::kInt64 ? INT64_MIN : int64_t{INT32_MIN};
  std::vector<int64_t> bad = {limit, limit + 1000, -1, lowest};
  if (unique && idx.n > 1) {
    const int64_t pos = linear % idx.n;
    bad.push_back(idx.Get(linear - pos + (pos + 1) % idx.n));
  }
  return bad;
}

// Every bad value at a few positions (first, last, random): the oracle's
// message equals the CPU op's on the full args.
template <typename Full, typename Oracle>
void ExpectSameMessages(Indices& idx, int64_t limit, bool unique, std::mt19937_64& rng, Full full,
                        Oracle oracle) {
  {
    SCOPED_TRACE("valid indices");
    ASSERT_TRUE(full().ok()) << full();
    EXPECT_TRUE(oracle().ok()) << oracle();
  }
  const int64_t total = idx.Elements();
  for (int64_t linear : {int64_t{0}, total - 1, static_cast<int64_t>(rng() % total)}) {
    const int64_t good = idx.Get(linear);
    for (int64_t bad : BadValues(idx, linear, limit, unique)) {
      SCOPED_TRACE(::testing::Message() << "element " << linear << " = " << bad);
      idx.Set(linear, bad);
      const absl::Status want = full();
      ASSERT_EQ(want.code(), absl::StatusCode::kInvalidArgument) << want;
      EXPECT_EQ(oracle(), want);
      idx.Set(linear, good);
    }
  }
}

TEST(OracleArgsTest, GatherAndScatterRunWithoutChannels) {
  std::mt19937_64 rng(3);
  const int64_t b = 3, s = 50, r = 7, c = 6;
  for (DType index : {DType::kInt32, DType::kInt64}) {
    for (bool bf : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "index " << static_cast<int>(index) << " bf " << bf);
      const auto tokens = [&](Buffer& buf, int64_t n) {
        return bf ? TensorView::Contiguous(buf.get(), DType::kFloat32, {b, n, c})
                  : TensorView::Contiguous(buf.get(), DType::kFloat32, {n, b, c});
      };
      Buffer act(b * s * c * 4), out(b * r * c * 4);
      Indices idx(index, {b, r}, 2);
      FillValid(idx, s, /*unique=*/true, rng);
      const GatherTokensArgs g{tokens(act, s), idx.View(), tokens(out, r), bf};
      const GatherTokensArgs go = GatherTokensOracleArgs(g, idx.compact.get());
      EXPECT_EQ(go.activations.NumElements(), 0);
      EXPECT_EQ(go.out.NumElements(), 0);
      ExpectSameMessages(
          idx, s, /*unique=*/false, rng, [&] { return cpu::GatherTokens(g, nullptr); },
          [&] { return cpu::GatherTokens(go, nullptr); });

      Buffer all(b * s * c * 4), layer(b * r * c * 4);
      const ScatterTokensArgs sc{tokens(all, s), tokens(layer, r), idx.View(), bf};
      const ScatterTokensArgs so = ScatterTokensOracleArgs(sc, idx.compact.get());
      EXPECT_EQ(so.all.NumElements(), 0);
      EXPECT_EQ(so.layer.NumElements(), 0);
      ExpectSameMessages(
          idx, s, /*unique=*/true, rng, [&] { return cpu::ScatterTokens(sc, nullptr); },
          [&] { return cpu::ScatterTokens(so, nullptr); });
    }
  }
}

TEST(OracleArgsTest, MergeAndSplitRunWithoutChannels) {
  std::mt19937_64 rng(4);
  const int64_t b = 3, s = 50, r = 7, c = 6;
  for (DType index : {DType::kInt32, DType::kInt64}) {
    for (bool bf : {true, false}) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "index " << static_cast<int>(index) << " bf " << bf
                                          << " in place " << in_place);
        const auto tokens = [&](Buffer& buf, int64_t n) {
          return bf ? TensorView::Contiguous(buf.get(), DType::kFloat32, {b, n, c})
                    : TensorView::Contiguous(buf.get(), DType::kFloat32, {n, b, c});
        };
        Buffer x(b * s * c * 4), layer(b * r * c * 4), out(b * s * c * 4);
        Indices idx(index, {b, r}, 2);
        FillValid(idx, s, /*unique=*/true, rng);
        const MergeTokensArgs m{tokens(x, s), tokens(layer, r), idx.View(),
                                in_place ? tokens(x, s) : tokens(out, s), bf};
        const MergeTokensArgs mo = MergeTokensOracleArgs(m, idx.compact.get());
        EXPECT_EQ(mo.x.NumElements(), 0);
        EXPECT_EQ(mo.layer.NumElements(), 0);
        EXPECT_EQ(mo.out.NumElements(), 0);
        ExpectSameMessages(
            idx, s, /*unique=*/true, rng, [&] { return cpu::MergeTokens(m, nullptr); },
            [&] { return cpu::MergeTokens(mo, nullptr); });

        const SplitTokensArgs p{tokens(x, s), idx.View(), tokens(layer, r),
                                in_place ? tokens(x, s) : tokens(out, s), bf};
        const SplitTokensArgs po = SplitTokensOracleArgs(p, idx.compact.get());
        EXPECT_EQ(po.grad.NumElements(), 0);
        EXPECT_EQ(po.layer_grad.NumElements(), 0);
        EXPECT_EQ(po.rest_grad.NumElements(), 0);
        ExpectSameMessages(
            idx, s, /*unique=*/true, rng, [&] { return cpu::SplitTokens(p, nullptr); },
            [&] { return cpu::SplitTokens(po, nullptr); });
      }
    }
  }
}

TEST(OracleArgsTest, GatherBertMaskRunsOnOneHeadAndABroadcastMask) {
  std::mt19937_64 rng(5);
  const int64_t l = 2, b = 2, h = 3, s = 40, r = 9;
  for (DType index : {DType::kInt32, DType::kInt64}) {
    for (int64_t sq : {int64_t{1}, s}) {
      SCOPED_TRACE(::testing::Message() << "index " << static_cast<int>(index) << " Sq " << sq);
      Buffer mask(b * h * sq * s * 2), out(l * b * h * r * r * 2);
      Indices idx(index, {l, b, r}, 1);
      FillValid(idx, s, /*unique=*/false, rng);
      const GatherBertMaskArgs args{
          TensorView::Contiguous(mask.get(), DType::kFloat16, {b, h, sq, s}), idx.View(),
          TensorView::Contiguous(out.get(), DType::kFloat16, {l, b, h, r, r})};
      const GatherBertMaskArgs oracle = GatherBertMaskOracleArgs(args, idx.compact.get());
      EXPECT_EQ(oracle.out.NumElements(), l * b * r * r);
      ExpectSameMessages(
          idx, s, /*unique=*/false, rng, [&] { return cpu::GatherBertMask(args, nullptr); },
          [&] { return cpu::GatherBertMask(oracle, nullptr); });
    }
  }
}

TEST(OracleArgsTest, SortTokensRunsWithoutTheInverse) {
  std::mt19937_64 rng(7);
  for (int64_t s : {int64_t{12}, int64_t{5000}}) {  // sparse and bitmap CPU paths
    for (DType index : {DType::kInt32, DType::kInt64}) {
      for (bool in_place : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "S " << s << " index " << static_cast<int>(index)
                                          << " in place " << in_place);
        const int64_t rows = 4, r = 10;
        Indices idx(index, {2, rows / 2, r}, 3);
        FillValid(idx, s, /*unique=*/true, rng);
        Buffer out(rows * r * 8), inverse(rows * s * 4);
        SortTokensArgs args;
        args.ids = idx.View();
        args.original_tokens = s;
        if (!in_place) args.out = TensorView::Contiguous(out.get(), index, {2, rows / 2, r});
        args.inverse = TensorView::Contiguous(inverse.get(), DType::kInt32, {2, rows / 2, s});
        // The CPU op sorts in place: run both on copies of the ids.
        const auto run = [&](const SortTokensArgs& a, bool oracle) {
          Indices copy = idx;
          SortTokensArgs c = a;
          if (oracle) {
            c.ids.data = copy.compact.get();
          } else {
            c.ids = copy.View();
          }
          return cpu::SortTokens(c, nullptr);
        };
        const SortTokensArgs oracle = SortTokensOracleArgs(args, idx.compact.get());
        EXPECT_FALSE(oracle.inverse.has_value());
        ExpectSameMessages(
            idx, s, /*unique=*/true, rng, [&] { return run(args, false); },
            [&] { return run(oracle, true); });
      }
    }
  }
}

}  // namespace
}  // namespace tokensel::kernels::cuda
