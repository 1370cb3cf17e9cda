// Workspace layouts of the CUDA ops (contracts: workspace_layout.h).
#include "kernels/cuda/workspace_layout.h"

#include "kernels/cuda/sample_packed_plan.h"
#include "kernels/gather_math.h"
#include "kernels/segment_math.h"
#include "kernels/sort_math.h"
#include "kernels/sparse_rows.h"

namespace tokensel::kernels::cuda {

size_t WorkspaceLayout::Add(std::initializer_list<int64_t> factors) {
  const size_t at = end_;
  uint64_t bytes = 1;
  for (const int64_t f : factors) {
    if (f < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(f), &bytes)) {
      overflow_ = true;
      return at;
    }
  }
  // Round up to 256 and append, staying at or below kWorkspaceTooLarge
  // (end_ <= kWorkspaceTooLarge always holds, so the subtraction is safe).
  if (bytes > kWorkspaceTooLarge) {
    overflow_ = true;
    return at;
  }
  const size_t rounded = (static_cast<size_t>(bytes) + 255) & ~size_t{255};
  if (rounded > kWorkspaceTooLarge - end_) {
    overflow_ = true;
    return at;
  }
  end_ += rounded;
  return at;
}

TensorView SnapshotView(const TensorView& v, void* data) {
  return TensorView::Contiguous(data, v.dtype,
                                absl::Span<const int64_t>(v.shape, static_cast<size_t>(v.rank)));
}

namespace {

int64_t Elements(const TensorView& v) { return v.NumElements(); }

// Appends the sorted keys of `rows` rows of `r` ids of `elem_size` bytes.
SparseSortLayout AddSparseSort(WorkspaceLayout* w, int64_t rows, int64_t r, int64_t elem_size) {
  SparseSortLayout l;
  l.used = true;
  l.rows = rows;
  l.r = r;
  l.passes = SparseSortPasses(r);
  l.keys[0] = w->Add({rows, r, elem_size});
  if (l.passes > 0) l.keys[1] = w->Add({rows, r, elem_size});
  return l;
}

}  // namespace

int SparseSortPasses(int64_t r) {
  int passes = 0;
  // run <= 2^63 (it doubles while below r < 2^63): no overflow in uint64.
  for (uint64_t run = kSparseSortTile; run < static_cast<uint64_t>(r); run *= 2) ++passes;
  return passes;
}

IndexOpLayout GatherTokensLayout(const GatherTokensArgs& args) {
  IndexOpLayout l;
  if (!ValidateGatherTokens(args).ok()) return l;
  WorkspaceLayout w;
  l.snapshot = w.Add({Elements(args.indices), args.indices.elem_size()});
  l.total = w.total();
  return l;
}

IndexOpLayout ScatterTokensLayout(const ScatterTokensArgs& args) {
  IndexOpLayout l;
  if (!ValidateScatterTokens(args).ok()) return l;
  const TokenDims d = GetTokenDims(args.all, args.indices, args.batch_first);
  WorkspaceLayout w;
  l.snapshot = w.Add({Elements(args.indices), args.indices.elem_size()});
  if (PreferSortingToBitmap(d.retained, d.seq)) {
    l.sparse = AddSparseSort(&w, d.batch, d.retained, args.indices.elem_size());
  } else {
    l.bitmap = w.Add({d.batch, BitmapWordsPerRow(d.seq), 4});
  }
  l.total = w.total();
  return l;
}

IndexOpLayout MergeTokensLayout(const MergeTokensArgs& args) {
  IndexOpLayout l;
  if (!ValidateMergeTokens(args).ok()) return l;
  const TokenDims d = GetTokenDims(args.x, args.indices, args.batch_first);
  WorkspaceLayout w;
  l.snapshot = w.Add({Elements(args.indices), args.indices.elem_size()});
  l.bitmap = w.Add({d.batch, BitmapWordsPerRow(d.seq), 4});
  l.total = w.total();
  return l;
}

SplitLayout SplitTokensLayout(const SplitTokensArgs& args) {
  SplitLayout l;
  if (!ValidateSplitTokens(args).ok()) return l;
  const TokenDims d = GetTokenDims(args.grad, args.indices, args.batch_first);
  WorkspaceLayout w;
  l.index.snapshot = w.Add({Elements(args.indices), args.indices.elem_size()});
  l.index.bitmap = w.Add({d.batch, BitmapWordsPerRow(d.seq), 4});
  l.zeros = w.Add({8});
  l.total = l.index.total = w.total();
  return l;
}

SamplePackedLayout SamplePackedTokensLayout(const SamplePackedTokensArgs& args) {
  SamplePackedLayout l;
  if (!ValidateSamplePackedTokens(args).ok()) return l;
  l.n_plus_1 = args.cu_seqlens.shape[0];
  WorkspaceLayout w;
  l.report = w.Add({kPackedReportWords, 8});
  l.cu = w.Add({l.n_plus_1, 4});
  l.kept = w.Add({l.n_plus_1, 8});
  l.chunk_base = w.Add({l.n_plus_1, 8});
  l.scan_sums = w.Add({2, PackedScanTiles(l.n_plus_1 - 1), 8});
  const int64_t L = args.layers;
  l.max_chunks = l.n_plus_1 > 1 && L > 0 ? PackedMaxChunks(args.total_tokens) : 0;
  if (l.max_chunks > 0) {
    l.long_slots = PackedLongSlots(l.max_chunks);
    l.long_state = w.Add({L, l.long_slots, kPackedLongStateBytes});
    l.long_hist = w.Add({L, l.long_slots, kPackedLongHistBytes});
    l.chunk_counts = w.Add({L, l.max_chunks, 8});
  }
  if (args.out.has_value()) l.gather_ids = w.Add({args.ids.shape[1], 4});
  l.total = w.total();
  return l;
}

IndexOpLayout GatherBertMaskLayout(const GatherBertMaskArgs& args) {
  IndexOpLayout l;
  if (!ValidateGatherBertMask(args).ok()) return l;
  WorkspaceLayout w;
  l.snapshot = w.Add({Elements(args.indices), args.indices.elem_size()});
  l.total = w.total();
  return l;
}

SortLayout SortTokensLayout(const SortTokensArgs& args) {
  SortLayout l;
  if (!ValidateSortTokens(args).ok()) return l;
  l.rows = args.ids.NumRows();
  l.r = args.ids.shape[args.ids.rank - 1];
  WorkspaceLayout w;
  if (PreferSortingToBitmap(l.r, args.original_tokens)) {
    l.snapshot = w.Add({Elements(args.ids), args.ids.elem_size()});
    l.sparse = AddSparseSort(&w, l.rows, l.r, args.ids.elem_size());
    l.total = w.total();
    return l;
  }
  l.words = BitmapWords(args.original_tokens);  // S <= INT32_MAX: no overflow
  l.chunks = (l.words + kSortChunkWords - 1) / kSortChunkWords;
  l.bitmaps = w.Add({l.rows, l.words, 8});
  l.bitmap_bytes = w.total() - l.bitmaps;
  if (l.chunks > 1 && l.rows > 0) l.ranks = w.Add({l.rows, l.chunks, 8});
  l.snapshot = w.Add({Elements(args.ids), args.ids.elem_size()});
  l.total = w.total();
  return l;
}

SegmentLayout SegmentSeqlensLayout(const SegmentSeqlensArgs& args) {
  SegmentLayout l;
  if (!ValidateSegmentSeqlens(args).ok()) return l;
  l.batch = args.segment_ids_q.shape[0];
  l.ns = args.max_segments;
  l.sides = args.segment_ids_kv.has_value() ? 2 : 1;
  l.read_pos = SegmentMaskNeedsPositions(l.sides == 2, args.mask);
  const int64_t b = l.batch;
  const int64_t ns1 = l.ns + 1;  // NS <= INT32_MAX - 1 by validation
  WorkspaceLayout w;
  for (int s = 0; s < l.sides; ++s) {
    const SegmentSeqlensSide& side = s == 0 ? args.q : *args.kv;
    const TensorView& ids = s == 0 ? args.segment_ids_q : *args.segment_ids_kv;
    l.packed[s] = side.packed.has_value();
    l.row_length[s] = ids.shape[1];
    l.seqlen[s] = w.Add({b, l.ns, 4});
    l.offset[s] = w.Add({b, ns1, 4});
    if (l.packed[s]) {
      l.cum[s] = w.Add({b, l.ns, 4});
      l.totals[s] = w.Add({b, static_cast<int64_t>(kSegmentRowTotalsBytes)});
      l.bases[s] = w.Add({b + 1, static_cast<int64_t>(kSegmentRowTotalsBytes)});
    }
    l.ids[s] = w.Add({b, ids.shape[1], ids.elem_size()});
    if (l.read_pos) {
      const TensorView& pos = s == 0 ? *args.segment_pos_q : *args.segment_pos_kv;
      l.pos[s] = w.Add({b, pos.shape[1], pos.elem_size()});
    }
  }
  if (l.sides == 2) {
    l.agg_smem_bytes = static_cast<size_t>(2 * ns1) * kSegmentAggBytes;
    l.agg_in_smem = l.agg_smem_bytes <= kSegmentMaxAggSmemBytes;
    if (!l.agg_in_smem) l.agg = w.Add({b, 2, ns1, static_cast<int64_t>(kSegmentAggBytes)});
  }
  l.total = w.total();
  return l;
}

}  // namespace tokensel::kernels::cuda
