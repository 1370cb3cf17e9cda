// CheckDisjoint (kernels/validate.h), the output-vs-input overlap check every
// op runs, against a brute-force reference: enumerate every element of both
// views, take the byte range each spans (the check is documented as
// conservative for interleaved views, so the range, not the exact byte set,
// decides) and intersect the two byte sets. Adjacent views (distance 0) must
// be accepted, views sharing one byte must be refused, in both argument
// orders, for every element size, contiguous and strided; then the same
// through an op (GatherTokens) so the wiring is covered too.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/tensor_view.h"
#include "kernels/validate.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {
namespace {

using kernels::DType;
using kernels::TensorView;

constexpr DType kOneOfEachSize[] = {DType::kUInt8, DType::kFloat16, DType::kFloat32,
                                    DType::kFloat64};

// Every byte offset (from `base`) an element of `v` covers.
std::vector<bool> TouchedBytes(const TensorView& v, const char* base, size_t buffer) {
  std::vector<bool> bytes(buffer, false);
  int64_t elements = 1;
  for (int d = 0; d < v.rank; ++d) elements *= v.shape[d];
  const int64_t size = kernels::ElementSize(v.dtype);
  for (int64_t linear = 0; linear < elements; ++linear) {
    int64_t offset = 0, rest = linear;
    for (int d = v.rank - 1; d >= 0; --d) {
      offset += (rest % v.shape[d]) * v.strides[d];
      rest /= v.shape[d];
    }
    const int64_t first = (static_cast<const char*>(v.data) - base) + offset * size;
    for (int64_t b = 0; b < size; ++b) bytes.at(static_cast<size_t>(first + b)) = true;
  }
  return bytes;
}

// The byte range [first touched, last touched] as a set (the conservative
// hull CheckDisjoint documents), or all false for an empty view.
std::vector<bool> Hull(const std::vector<bool>& touched) {
  std::vector<bool> hull(touched.size(), false);
  const auto first = std::find(touched.begin(), touched.end(), true);
  if (first == touched.end()) return hull;
  const auto last = std::find(touched.rbegin(), touched.rend(), true);
  std::fill(hull.begin() + (first - touched.begin()), hull.end() - (last - touched.rbegin()), true);
  return hull;
}

bool Intersect(const std::vector<bool>& a, const std::vector<bool>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] && b[i]) return true;
  }
  return false;
}

// Checks CheckDisjoint(a, b) and CheckDisjoint(b, a) against the reference.
void ExpectMatchesReference(const TensorView& a, const TensorView& b, const char* base,
                            size_t buffer) {
  const std::vector<bool> ta = TouchedBytes(a, base, buffer), tb = TouchedBytes(b, base, buffer);
  const bool overlap = Intersect(Hull(ta), Hull(tb));
  // Sanity of the reference: sharing a real byte is always an overlap.
  if (Intersect(ta, tb)) {
    ASSERT_TRUE(overlap);
  }
  for (bool swap : {false, true}) {
    SCOPED_TRACE(swap ? "order (b, a)" : "order (a, b)");
    const absl::Status s = swap ? kernels::CheckDisjoint(b, "out", a, "in")
                                : kernels::CheckDisjoint(a, "out", b, "in");
    if (overlap) {
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, "out: overlaps in"));
    } else {
      EXPECT_OK(s);
    }
  }
}

// Views of `n` elements placed so that b starts `gap` bytes after a's last
// byte (gap < 0: they share -gap bytes), and the mirror image (b ending
// `gap` bytes before a starts); strided (padded rows) or contiguous.
TEST(CheckDisjointTest, AdjacentIsAcceptedOneByteSharedIsRefusedBothOrders) {
  alignas(16) char buffer[1024] = {};
  for (DType dtype : kOneOfEachSize) {
    const int64_t size = kernels::ElementSize(dtype);
    for (bool strided : {false, true}) {
      const std::vector<int64_t> shape = {3, 4};
      const std::vector<int64_t> strides =
          strided ? std::vector<int64_t>{7, 1} : std::vector<int64_t>{4, 1};
      const int64_t span = ((3 - 1) * strides[0] + (4 - 1) * strides[1] + 1) * size;
      for (int64_t gap : {-size, int64_t{-1}, int64_t{0}, int64_t{1}, size}) {
        SCOPED_TRACE(
            absl::StrCat(kernels::DTypeName(dtype), strided ? " strided" : "", " gap ", gap));
        char* a0 = buffer + 200;
        const TensorView a = TensorView::Strided(a0, dtype, shape, strides);
        const TensorView after = TensorView::Strided(a0 + span + gap, dtype, shape, strides);
        const TensorView before = TensorView::Strided(a0 - span - gap, dtype, shape, strides);
        ExpectMatchesReference(a, after, buffer, sizeof(buffer));
        ExpectMatchesReference(a, before, buffer, sizeof(buffer));
        // The reference agrees with the intent: gap >= 0 is disjoint.
        const bool want_ok = gap >= 0;
        EXPECT_EQ(kernels::CheckDisjoint(a, "out", after, "in").ok(), want_ok);
        EXPECT_EQ(kernels::CheckDisjoint(after, "out", a, "in").ok(), want_ok);
        EXPECT_EQ(kernels::CheckDisjoint(a, "out", before, "in").ok(), want_ok);
        EXPECT_EQ(kernels::CheckDisjoint(before, "out", a, "in").ok(), want_ok);
      }
    }
  }
}

TEST(CheckDisjointTest, RandomViewsMatchBruteForce) {
  alignas(16) char buffer[2048] = {};
  std::mt19937_64 rng(2024);
  for (int iter = 0; iter < 4000; ++iter) {
    SCOPED_TRACE(iter);
    auto random_view = [&] {
      const DType dtype = kOneOfEachSize[rng() % 4];
      const int rank = 1 + static_cast<int>(rng() % 3);
      std::vector<int64_t> shape(rank), strides(rank);
      for (int d = 0; d < rank; ++d) {
        shape[d] = static_cast<int64_t>(rng() % 5);  // 0 sometimes: empty view
        if (rng() % 8 != 0 && shape[d] == 0) shape[d] = 1;
        strides[d] = static_cast<int64_t>(rng() % 7);
      }
      const int64_t offset = static_cast<int64_t>(rng() % 600);
      return TensorView::Strided(buffer + offset, dtype, shape, strides);
    };
    const TensorView a = random_view();
    TensorView b = random_view();
    if (iter % 4 == 0) {  // put b right at a's edge, +-1 byte, to hit the boundary often
      auto extent = kernels::ComputeExtent(a, "a");
      ASSERT_OK(extent);
      const int64_t shift = extent->end + static_cast<int64_t>(rng() % 3) - 1;
      b.data = static_cast<char*>(a.data) + shift;
    }
    ExpectMatchesReference(a, b, buffer, sizeof(buffer));
  }
}

// The same boundary through an op: GatherTokens' out right after or right
// before its activations is fine; one shared element is refused.
TEST(CheckDisjointTest, GatherOutNextToActivations) {
  alignas(16) float buffer[256] = {};
  alignas(16) int32_t idx_data[4] = {0, 2, 1, 3};
  const TensorView idx = TensorView::Contiguous(idx_data, DType::kInt32, {2, 2});
  constexpr int64_t kActs = 2 * 4 * 3, kOut = 2 * 2 * 3;  // [2,4,3] and [2,2,3]
  for (int64_t shift : {int64_t{-1}, int64_t{0}, int64_t{1}}) {
    for (bool out_after : {true, false}) {
      SCOPED_TRACE(absl::StrCat(out_after ? "out after" : "out before", " shift ", shift));
      float* acts = buffer + 100;
      float* out = out_after ? acts + kActs + shift : acts - kOut - shift;
      const absl::Status s = kernels::cpu::GatherTokens(
          {TensorView::Contiguous(acts, DType::kFloat32, {2, 4, 3}), idx,
           TensorView::Contiguous(out, DType::kFloat32, {2, 2, 3}), true},
          nullptr);
      if (shift < 0) {
        EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, "out: overlaps activations"));
      } else {
        EXPECT_OK(s);
      }
    }
  }
}

}  // namespace
}  // namespace tokensel::testing
