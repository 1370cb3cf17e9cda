// Host tests of the CUDA workspace layouts (kernels/cuda/workspace_layout.h):
// every section the kernels use lies inside the workspace, 256-aligned, after
// the status block, disjoint from the others and at least as large as the
// kernels' own use (computed here independently from the shapes); sizes that
// overflow saturate instead of wrapping; args that fail validation give an
// empty layout. No device is needed: views carry fake addresses (metadata
// only, never dereferenced). Label static-gpu (needs nvcc, not a GPU).
#include "kernels/cuda/workspace_layout.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/sample_packed_plan.h"
#include "kernels/ops.h"
#include "kernels/sparse_rows.h"
#include "tests/kernels/cuda/layout_test_util.h"

namespace tokensel::kernels::cuda {
namespace {

using layout_test::Bytes;
using layout_test::ExpectSections;
using layout_test::Section;
using layout_test::Strided;
using layout_test::View;

TEST(WorkspaceLayoutTest, AddAlignsAndSaturates) {
  WorkspaceLayout w;
  EXPECT_EQ(w.Add({3, 4}), kDeviceStatusBytes);  // 12 bytes -> one 256-byte section
  EXPECT_EQ(w.Add({0}), 512u);                   // empty: no space, offset still aligned
  EXPECT_EQ(w.Add({257}), 512u);
  EXPECT_EQ(w.total(), 1024u);

  WorkspaceLayout negative;
  negative.Add({-1, 8});
  EXPECT_EQ(negative.total(), kWorkspaceTooLarge);

  WorkspaceLayout product;  // 2^40 * 2^30 * 8 overflows 64 bits
  product.Add({int64_t{1} << 40, int64_t{1} << 30, 8});
  EXPECT_EQ(product.total(), kWorkspaceTooLarge);

  WorkspaceLayout sum;  // each part fits, the sum does not
  sum.Add({int64_t{1} << 62});
  EXPECT_EQ(sum.total(), kDeviceStatusBytes + (size_t{1} << 62));
  sum.Add({int64_t{1} << 62});
  EXPECT_EQ(sum.total(), kWorkspaceTooLarge);
  // A caller may round the saturated size up (the server rounds to 1 MiB).
  EXPECT_GT(kWorkspaceTooLarge + (size_t{1} << 20), kWorkspaceTooLarge);
}

TEST(WorkspaceLayoutTest, BitmapWordsPerRowNeverOverflows) {
  EXPECT_EQ(BitmapWordsPerRow(0), 0);
  EXPECT_EQ(BitmapWordsPerRow(1), 1);
  EXPECT_EQ(BitmapWordsPerRow(32), 1);
  EXPECT_EQ(BitmapWordsPerRow(33), 2);
  EXPECT_EQ(BitmapWordsPerRow(INT64_MAX), INT64_MAX / 32 + 1);
}

TEST(WorkspaceLayoutTest, SnapshotViewIsCompactRowMajor) {
  const TensorView src = Strided(0, DType::kInt32, {2, 3, 5}, {40, 0, 7});  // broadcast + padded
  char buffer[1];
  const TensorView snap = SnapshotView(src, buffer);
  EXPECT_EQ(snap.data, buffer);
  EXPECT_EQ(snap.dtype, DType::kInt32);
  ASSERT_EQ(snap.rank, 3);
  EXPECT_EQ(snap.shape[0], 2);
  EXPECT_EQ(snap.shape[1], 3);
  EXPECT_EQ(snap.shape[2], 5);
  EXPECT_EQ(snap.strides[0], 15);
  EXPECT_EQ(snap.strides[1], 5);
  EXPECT_EQ(snap.strides[2], 1);
}

TEST(WorkspaceLayoutTest, IndexOps) {
  for (DType index : {DType::kInt32, DType::kInt64}) {
    for (bool bf : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "index " << static_cast<int>(index) << " bf " << bf);
      const int64_t b = 3, s = 1000, r = 77, c = 5;
      const auto tokens = [&](int slot, int64_t n) {
        return bf ? View(slot, DType::kFloat16, {b, n, c}) : View(slot, DType::kFloat16, {n, b, c});
      };
      // Padded index rows: the snapshot is compact, smaller than the extent.
      const TensorView idx = Strided(1, index, {b, r}, {r + 9, 1});
      const GatherTokensArgs g{tokens(0, s), idx, tokens(2, r), bf};
      const IndexOpLayout gl = GatherTokensLayout(g);
      ExpectSections({{"snapshot", gl.snapshot, Bytes(idx)}}, gl.total);
      EXPECT_EQ(GatherTokensWorkspaceBytes(g), gl.total);

      const ScatterTokensArgs sc{tokens(0, s), tokens(2, r), idx, bf};
      const IndexOpLayout sl = ScatterTokensLayout(sc);
      const uint64_t bitmap = static_cast<uint64_t>(b) * ((s + 31) / 32) * 4;
      ExpectSections({{"snapshot", sl.snapshot, Bytes(idx)}, {"bitmap", sl.bitmap, bitmap}},
                     sl.total);
      EXPECT_EQ(ScatterTokensWorkspaceBytes(sc), sl.total);

      const MergeTokensArgs m{tokens(0, s), tokens(2, r), idx, tokens(3, s), bf};
      const IndexOpLayout ml = MergeTokensLayout(m);
      ExpectSections({{"snapshot", ml.snapshot, Bytes(idx)}, {"bitmap", ml.bitmap, bitmap}},
                     ml.total);
      EXPECT_EQ(MergeTokensWorkspaceBytes(m), ml.total);

      const SplitTokensArgs p{tokens(0, s), idx, tokens(2, r), tokens(0, s), bf};  // in place
      const SplitLayout pl = SplitTokensLayout(p);
      ExpectSections({{"snapshot", pl.index.snapshot, Bytes(idx)},
                      {"bitmap", pl.index.bitmap, bitmap},
                      {"zeros", pl.zeros, 8}},
                     pl.total);
      EXPECT_EQ(SplitTokensWorkspaceBytes(p), pl.total);
    }
    const TensorView idx = View(1, index, {4, 2, 33});
    const GatherBertMaskArgs bert{View(0, DType::kBool, {2, 3, 1, 50}), idx,
                                  View(2, DType::kBool, {4, 2, 3, 33, 33})};
    const IndexOpLayout bl = GatherBertMaskLayout(bert);
    ExpectSections({{"snapshot", bl.snapshot, Bytes(idx)}}, bl.total);
    EXPECT_EQ(GatherBertMaskWorkspaceBytes(bert), bl.total);
  }
}

// A broadcast index tensor (stride 0) has few bytes but many elements: the
// snapshot holds every element, and sizes that do not fit saturate.
TEST(WorkspaceLayoutTest, BroadcastIndicesAndOverflow) {
  const TensorView idx = Strided(1, DType::kInt64, {1 << 20, 4096}, {0, 0});
  const GatherTokensArgs g{View(0, DType::kFloat32, {1 << 20, 8, 0}), idx,
                           View(2, DType::kFloat32, {1 << 20, 4096, 0}), true};
  const IndexOpLayout gl = GatherTokensLayout(g);
  ExpectSections({{"snapshot", gl.snapshot, Bytes(idx)}}, gl.total);
  EXPECT_GE(gl.total, uint64_t{1} << 35);

  // 2^62 int64 indices (C == 0 keeps every other view empty): 2^65 bytes.
  const int64_t half = int64_t{1} << 31;
  const GatherTokensArgs huge{View(0, DType::kFloat32, {half, 8, 0}),
                              Strided(1, DType::kInt64, {half, half}, {0, 0}),
                              View(2, DType::kFloat32, {half, half, 0}), true};
  ASSERT_TRUE(ValidateGatherTokens(huge).ok()) << ValidateGatherTokens(huge);
  EXPECT_EQ(GatherTokensLayout(huge).total, kWorkspaceTooLarge);
  EXPECT_EQ(GatherTokensWorkspaceBytes(huge), kWorkspaceTooLarge);

  // The scatter bitmap of the largest S validation allows (B*S < 2^63 with
  // C == 0) and rows dense enough for a bitmap (R = 2^32 broadcast indices):
  // 2^59 bytes, sized without wrapping.
  const int64_t b = int64_t{1} << 20;
  const int64_t s = int64_t{1} << 42;
  const int64_t r = int64_t{1} << 32;
  const ScatterTokensArgs sc{View(0, DType::kFloat32, {b, s, 0}),
                             View(2, DType::kFloat32, {b, r, 0}),
                             Strided(1, DType::kInt32, {b, r}, {0, 0}), true};
  ASSERT_TRUE(ValidateScatterTokens(sc).ok()) << ValidateScatterTokens(sc);
  const IndexOpLayout sl = ScatterTokensLayout(sc);
  EXPECT_FALSE(sl.sparse.used);
  ExpectSections({{"snapshot", sl.snapshot, 4 * static_cast<uint64_t>(b) * r},
                  {"bitmap", sl.bitmap, static_cast<uint64_t>(b) * (s / 32) * 4}},
                 sl.total);

  // One index per row of the same S: sparse rows, no bitmap, 2 * 4 MiB.
  const ScatterTokensArgs one{View(0, DType::kFloat32, {b, s, 0}),
                              View(2, DType::kFloat32, {b, 1, 0}),
                              Strided(1, DType::kInt32, {b, 1}, {0, 0}), true};
  ASSERT_TRUE(ValidateScatterTokens(one).ok()) << ValidateScatterTokens(one);
  const IndexOpLayout ol = ScatterTokensLayout(one);
  EXPECT_TRUE(ol.sparse.used);
  EXPECT_EQ(ol.bitmap, 0u);
  ExpectSections({{"snapshot", ol.snapshot, 4 * static_cast<uint64_t>(b)},
                  {"keys0", ol.sparse.keys[0], 4 * static_cast<uint64_t>(b)}},
                 ol.total);
  EXPECT_EQ(ol.total, kDeviceStatusBytes + 2 * 4 * static_cast<uint64_t>(b));
}

TEST(WorkspaceLayoutTest, SortTokens) {
  for (int64_t s : {int64_t{1}, int64_t{2048}, int64_t{65536}, int64_t{65537}, int64_t{3000000}}) {
    for (bool in_place : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "S " << s << " in place " << in_place);
      // Dense rows (16 * R >= S/64 words): the bitmap path.
      const int64_t r = s < 4000 ? s : 4000;
      ASSERT_FALSE(PreferSortingToBitmap(r, s));
      SortTokensArgs args;
      args.ids = Strided(0, DType::kInt32, {3, 2, r}, {2 * (r + 1), r + 1, 1});
      args.original_tokens = s;
      if (!in_place) args.out = View(1, DType::kInt32, {3, 2, r});
      args.inverse = View(2, DType::kInt32, {3, 2, s});
      const SortLayout l = SortTokensLayout(args);
      const int64_t words = (s + 63) / 64;
      const int64_t chunks = (words + 1023) / 1024;
      EXPECT_EQ(l.rows, 6);
      EXPECT_EQ(l.r, r);
      EXPECT_EQ(l.words, words);
      EXPECT_EQ(l.chunks, chunks);
      EXPECT_FALSE(l.sparse.used);
      // The one memset of the status block and the bitmaps covers both.
      EXPECT_EQ(l.bitmaps, kDeviceStatusBytes);
      EXPECT_GE(l.bitmap_bytes, static_cast<size_t>(6 * words * 8));
      std::vector<Section> sections = {{"bitmaps", l.bitmaps, l.bitmap_bytes},
                                       {"snapshot", l.snapshot, Bytes(args.ids)}};
      if (chunks > 1) {
        sections.push_back({"ranks", l.ranks, static_cast<uint64_t>(6 * chunks * 8)});
      } else {
        EXPECT_EQ(l.ranks, 0u);
      }
      ExpectSections(sections, l.total);
      EXPECT_EQ(SortTokensWorkspaceBytes(args), l.total);
    }
  }
}

SegmentSeqlensSide SideOutputs(int first_slot, int64_t b, int64_t ns, bool packed) {
  SegmentSeqlensSide side{View(first_slot, DType::kInt32, {b, ns}),
                          View(first_slot + 1, DType::kInt32, {b, ns + 1}), std::nullopt};
  if (packed) {
    side.packed = PackedSeqlens{View(first_slot + 2, DType::kInt32, {b * ns}),
                                View(first_slot + 3, DType::kInt32, {b * (ns + 1)}),
                                View(first_slot + 4, DType::kInt32, {b * ns + 1})};
  }
  return side;
}

TEST(WorkspaceLayoutTest, SegmentSeqlens) {
  const int64_t b = 3, tq = 1500, tkv = 700;
  for (int64_t ns : {int64_t{4}, int64_t{2000}}) {  // 2000: aggregates leave shared memory
    for (bool cross : {false, true}) {
      for (AttnMaskType mask : {AttnMaskType::kPadding, AttnMaskType::kCausal}) {
        for (bool packed : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "NS " << ns << " cross " << cross << " mask "
                                            << static_cast<int>(mask) << " packed " << packed);
          SegmentSeqlensArgs args;
          args.segment_ids_q = Strided(0, DType::kInt64, {b, tq}, {tq + 3, 1});
          args.segment_pos_q = View(1, DType::kInt32, {b, tq});
          args.max_segments = ns;
          args.mask = mask;
          args.q = SideOutputs(10, b, ns, packed);
          if (cross) {
            args.segment_ids_kv = View(2, DType::kInt32, {b, tkv});
            args.segment_pos_kv = Strided(3, DType::kInt64, {b, tkv}, {0, 1});
            args.kv = SideOutputs(20, b, ns, packed);
          }
          const SegmentLayout l = SegmentSeqlensLayout(args);
          const bool read_pos = cross && mask != AttnMaskType::kPadding;
          EXPECT_EQ(l.read_pos, read_pos);
          EXPECT_EQ(l.sides, cross ? 2 : 1);
          std::vector<Section> sections;
          for (int s = 0; s < l.sides; ++s) {
            const TensorView& ids = s == 0 ? args.segment_ids_q : *args.segment_ids_kv;
            const uint64_t t = static_cast<uint64_t>(ids.shape[1]);
            sections.push_back({"seqlen", l.seqlen[s], static_cast<uint64_t>(b * ns * 4)});
            sections.push_back({"offset", l.offset[s], static_cast<uint64_t>(b * (ns + 1) * 4)});
            sections.push_back({"ids snapshot", l.ids[s], b * t * ids.elem_size()});
            if (read_pos) {
              const TensorView& pos = s == 0 ? *args.segment_pos_q : *args.segment_pos_kv;
              sections.push_back({"pos snapshot", l.pos[s], b * t * pos.elem_size()});
            }
            if (packed) {
              sections.push_back({"cum", l.cum[s], static_cast<uint64_t>(b * ns * 4)});
              sections.push_back({"totals", l.totals[s], b * kSegmentRowTotalsBytes});
              sections.push_back({"bases", l.bases[s], (b + 1) * kSegmentRowTotalsBytes});
            }
          }
          const bool agg_global =
              cross && 2 * (ns + 1) * kSegmentAggBytes > kSegmentMaxAggSmemBytes;
          EXPECT_EQ(l.agg_in_smem, !agg_global);
          if (agg_global) {
            sections.push_back({"aggregates", l.agg, b * 2 * (ns + 1) * kSegmentAggBytes});
          }
          ExpectSections(sections, l.total);
          EXPECT_EQ(SegmentSeqlensWorkspaceBytes(args), l.total);
        }
      }
    }
  }
}

// The server sizes the workspace before the op validates: invalid metadata
// must give the minimal layout (and no crash: the segment and sample layouts
// used to dereference absent optionals), so Async reports the real error.
TEST(WorkspaceLayoutTest, InvalidArgsGiveTheStatusBlockOnly) {
  SegmentSeqlensArgs seg;
  seg.segment_ids_q = View(0, DType::kInt32, {2, 10});
  seg.segment_ids_kv = View(1, DType::kInt32, {2, 10});  // kv outputs missing
  seg.max_segments = 4;
  seg.q = SideOutputs(10, 2, 4, true);
  EXPECT_EQ(SegmentSeqlensWorkspaceBytes(seg), kDeviceStatusBytes);

  SampleTokensArgs sample;
  sample.layers = 1;
  sample.batch = 2;
  sample.original_tokens = 16;
  sample.retained_tokens = 4;
  sample.ids = View(0, DType::kInt32, {1, 2, 4});
  sample.bert_mask = View(1, DType::kBool, {1, 2, 1, 4, 4});  // `mask` missing
  EXPECT_EQ(SampleTokensWorkspaceBytes(sample), kDeviceStatusBytes);

  GatherTokensArgs gather{View(0, DType::kFloat32, {2, 8, 4}), View(1, DType::kFloat32, {2, 3}),
                          View(2, DType::kFloat32, {2, 3, 4}), true};  // float indices
  EXPECT_EQ(GatherTokensWorkspaceBytes(gather), kDeviceStatusBytes);
  SortTokensArgs sort;
  sort.ids = View(0, DType::kInt32, {2, 3});
  sort.original_tokens = 0;
  EXPECT_EQ(SortTokensWorkspaceBytes(sort), kDeviceStatusBytes);
}

// SampleTokens composes its mask ops' workspaces: the bert part now holds
// the snapshot of the sampled ids.
TEST(WorkspaceLayoutTest, SampleTokensComposesTheMaskWorkspace) {
  SampleTokensArgs sample;
  sample.layers = 2;
  sample.batch = 3;
  sample.original_tokens = 40;
  sample.retained_tokens = 9;
  sample.ids = View(0, DType::kInt64, {2, 3, 9});
  sample.mask = View(1, DType::kFloat16, {3, 1, 1, 40});
  sample.bert_mask = View(2, DType::kFloat16, {2, 3, 1, 9, 9});
  const GatherBertMaskArgs bert{*sample.mask, sample.ids, *sample.bert_mask};
  const size_t bert_bytes = GatherBertMaskWorkspaceBytes(bert);
  EXPECT_GE(bert_bytes, kDeviceStatusBytes + 256u);  // status + snapshot of 54 int64
  EXPECT_EQ(SampleTokensWorkspaceBytes(sample), kDeviceStatusBytes + bert_bytes);
}

// SamplePackedTokens: the report, the snapshot of cu_seqlens, kept and
// chunk_base (int64), the long path's states, histograms and chunk counts
// (only when T admits a long sequence and there is work), and, with out,
// the gather's private ids: disjoint and inside; absent parts add none.
TEST(WorkspaceLayoutTest, SamplePackedTokens) {
  for (const int64_t T : {int64_t{5000}, kPackedLongMinTokens, int64_t{1} << 20}) {
    for (const int64_t L : {int64_t{0}, int64_t{1}, int64_t{3}}) {
      for (const int64_t n_plus_1 : {int64_t{1}, int64_t{2}, int64_t{65}, int64_t{1000001}}) {
        for (const bool with_out : {false, true}) {
          if (with_out && L != 1) continue;
          SamplePackedTokensArgs a;
          a.cu_seqlens = View(0, DType::kInt32, {n_plus_1});
          a.cu_seqlens_kept = View(1, DType::kInt32, {n_plus_1});
          a.total_tokens = T;
          a.keep_num = 1;
          a.keep_den = 2;
          a.layers = L;
          a.ids = View(2, DType::kInt32, {L, 777});
          if (with_out) {
            a.activations = View(3, DType::kBFloat16, {T, 16});
            a.out = View(4, DType::kBFloat16, {777, 16});
          }
          const SamplePackedLayout l = SamplePackedTokensLayout(a);
          SCOPED_TRACE(testing::Message() << "T " << T << " L " << L << " N+1 " << n_plus_1);
          EXPECT_EQ(l.n_plus_1, n_plus_1);
          const int64_t max_chunks = L > 0 && n_plus_1 > 1 ? PackedMaxChunks(T) : 0;
          EXPECT_EQ(l.max_chunks, max_chunks);
          EXPECT_EQ(l.max_chunks > 0, T >= kPackedLongMinTokens && L > 0 && n_plus_1 > 1);
          const auto n1 = static_cast<uint64_t>(n_plus_1);
          std::vector<Section> sections = {
              {"report", l.report, kPackedReportWords * 8},
              {"cu", l.cu, n1 * 4},
              {"kept", l.kept, n1 * 8},
              {"chunk_base", l.chunk_base, n1 * 8},
              {"scan_sums", l.scan_sums, 16 * static_cast<uint64_t>((n_plus_1 + 4094) / 4096)}};
          if (max_chunks > 0) {
            EXPECT_EQ(l.long_slots, PackedLongSlots(max_chunks));
            const auto slots = static_cast<uint64_t>(L * l.long_slots);
            sections.push_back({"long_state", l.long_state, slots * kPackedLongStateBytes});
            sections.push_back({"long_hist", l.long_hist, slots * kPackedLongHistBytes});
            sections.push_back(
                {"chunk_counts", l.chunk_counts, static_cast<uint64_t>(L * max_chunks) * 8});
          } else {
            EXPECT_EQ(l.long_state, 0u);
            EXPECT_EQ(l.long_hist, 0u);
            EXPECT_EQ(l.chunk_counts, 0u);
          }
          if (with_out) sections.push_back({"gather_ids", l.gather_ids, 777 * 4});
          ExpectSections(sections, l.total);
          EXPECT_EQ(SamplePackedTokensWorkspaceBytes(a), l.total);
          if (!with_out) {
            EXPECT_EQ(l.gather_ids, 0u);
          }
        }
      }
    }
  }
  SamplePackedTokensArgs bad;  // cu_seqlens of rank 2
  bad.cu_seqlens = View(0, DType::kInt32, {2, 2});
  bad.keep_den = 1;
  EXPECT_EQ(SamplePackedTokensWorkspaceBytes(bad), kDeviceStatusBytes);
}

// The long path's sections grow with L * T, not with N: at most 0.14 bytes
// per token per layer (a 1 KiB histogram per possible long sequence of
// 8193 tokens), e.g. 3.4 GB for 12 layers of 2^31 - 1 tokens, 18 MB at the
// server's default work bound L * T = 2^27.
TEST(WorkspaceLayoutTest, SamplePackedLongPathBytes) {
  SamplePackedTokensArgs a;
  a.cu_seqlens = View(0, DType::kInt32, {2});
  a.cu_seqlens_kept = View(1, DType::kInt32, {2});
  a.total_tokens = kPackedMaxTokens;
  a.keep_num = 1;
  a.keep_den = 2;
  a.layers = 12;
  a.ids = View(2, DType::kInt32, {12, 1});
  const SamplePackedLayout l = SamplePackedTokensLayout(a);
  ASSERT_GT(l.max_chunks, 0);
  const double per_token = static_cast<double>(l.total) / (12.0 * kPackedMaxTokens);
  EXPECT_LT(per_token, 0.14);
  EXPECT_GT(per_token, 0.12);  // the bound is reached: the test would see a change
  EXPECT_GT(l.total, l.chunk_counts);
}

}  // namespace
}  // namespace tokensel::kernels::cuda
