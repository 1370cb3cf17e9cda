// Internals of the CUDA SegmentSeqlens (kernels/cuda/segment_seqlens.cu):
// kernel parameter blocks, the workspace layout and the per-tile device code.
// Included by segment_seqlens.cu only.
#ifndef TOKENSEL_KERNELS_CUDA_SEGMENT_SEQLENS_IMPL_CUH_
#define TOKENSEL_KERNELS_CUDA_SEGMENT_SEQLENS_IMPL_CUH_

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <cub/cub.cuh>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/status.cuh"
#include "kernels/cuda/workspace_layout.h"
#include "kernels/ops.h"
#include "kernels/segment_math.h"
#include "kernels/tensor_view.h"

namespace tokensel::kernels::cuda::seg {

inline constexpr int kThreads = 256;
inline constexpr int kItems = 4;  // tokens per thread per tile (blocked)
inline constexpr int64_t kTile = int64_t{kThreads} * kItems;
// RowKernel blocks (grid-stride over rows beyond; far below the 2^31-1 limit
// of gridDim.x, so no B truncates the grid).
inline constexpr int64_t kMaxRowBlocks = int64_t{1} << 20;

struct DevAgg {
  unsigned long long cnt;
  long long minpos;
  long long maxpos;
};
static_assert(sizeof(DevAgg) == kSegmentAggBytes, "workspace_layout.h sizes the aggregates");

// Per (row, side) counts for the packed layout; scanned over B.
struct RowTotals {
  long long seg;  // non-zero seqlens
  long long off;  // recorded offsets (<= NS+1)
  long long tok;  // sum of seqlens
};
__host__ __device__ inline RowTotals operator+(const RowTotals& a, const RowTotals& b) {
  return {a.seg + b.seg, a.off + b.off, a.tok + b.tok};
}
static_assert(sizeof(RowTotals) == kSegmentRowTotalsBytes, "workspace_layout.h sizes the totals");

// One side's inputs: the client's views, read once each (pass 1), and their
// snapshots in the workspace ([B][T], same dtype), which pass 1 writes and
// every later read (pass 2 of cross-attention, SegmentSeqlensFinish) uses.
struct SideInput {
  TensorView ids;
  TensorView pos;  // data == nullptr when positions are not read
  int64_t n = 0;   // T of this side
  bool ids_aligned = false;
  bool pos_aligned = false;
  void* ids_snap = nullptr;
  void* pos_snap = nullptr;  // null when positions are not read
};

// Staging of one side in the workspace ([B][NS], [B][NS+1], ...).
struct SideStage {
  int32_t* seqlen = nullptr;    // id-indexed, slot j = id j+1
  int32_t* offset = nullptr;    // first NS+1 kept-run starts, fill -1
  int32_t* cum = nullptr;       // packed only: inclusive sums of the compacted seqlens
  RowTotals* totals = nullptr;  // packed only: [B]
  RowTotals* bases = nullptr;   // packed only: [B+1] exclusive scan of totals
};

struct RowParams {
  SideInput in[2];
  SideStage stage[2];
  int sides = 1;
  int64_t batch = 0;
  int64_t ns = 0;
  AttnMaskType mask = AttnMaskType::kPadding;
  bool read_pos = false;
  bool agg_in_smem = true;
  DevAgg* agg_global = nullptr;  // [B][2][NS+1] when not in shared memory
  Workspace ws;
};

struct ScanParams {
  RowTotals* totals[2] = {nullptr, nullptr};
  RowTotals* bases[2] = {nullptr, nullptr};
  int sides = 1;
  int64_t batch = 0;
};

struct SideOutputs {
  TensorView seqlen;
  TensorView offset;
  bool packed = false;
  TensorView pseq;
  TensorView poff;
  TensorView pcu;
};

struct WriteParams {
  SideStage stage[2];
  SideOutputs out[2];
  int sides = 1;
  int64_t ns = 0;
  int64_t batch = 0;
  int64_t row_length[2] = {0, 0};
};

// Workspace layout: SegmentSeqlensLayout (workspace_layout.h).
using Layout = SegmentLayout;

inline bool ElementAligned(const TensorView& v) {
  return reinterpret_cast<uintptr_t>(v.data) % static_cast<uintptr_t>(v.elem_size()) == 0;
}

template <typename T>
T* At(Workspace ws, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(ws.data) + offset);
}

inline SideStage MakeStage(const Layout& l, Workspace ws, int s) {
  SideStage st;
  st.seqlen = At<int32_t>(ws, l.seqlen[s]);
  st.offset = At<int32_t>(ws, l.offset[s]);
  if (l.packed[s]) {
    st.cum = At<int32_t>(ws, l.cum[s]);
    st.totals = At<RowTotals>(ws, l.totals[s]);
    st.bases = At<RowTotals>(ws, l.bases[s]);
  }
  return st;
}

inline RowParams MakeRowParams(const SegmentSeqlensArgs& args, const Layout& l, Workspace ws) {
  RowParams p;
  p.sides = l.sides;
  p.batch = l.batch;
  p.ns = l.ns;
  p.mask = args.mask;
  p.read_pos = l.read_pos;
  p.agg_in_smem = l.agg_in_smem;
  p.agg_global = l.agg_in_smem ? nullptr : At<DevAgg>(ws, l.agg);
  p.ws = ws;
  for (int s = 0; s < l.sides; ++s) {
    SideInput& in = p.in[s];
    in.ids = s == 0 ? args.segment_ids_q : *args.segment_ids_kv;
    in.n = in.ids.shape[1];
    in.ids_aligned = ElementAligned(in.ids);
    in.ids_snap = At<char>(ws, l.ids[s]);
    if (p.read_pos) {
      in.pos = s == 0 ? *args.segment_pos_q : *args.segment_pos_kv;
      in.pos_aligned = ElementAligned(in.pos);
      in.pos_snap = At<char>(ws, l.pos[s]);
    }
    p.stage[s] = MakeStage(l, ws, s);
  }
  return p;
}

inline unsigned RowGrid(const Layout& l) {
  return static_cast<unsigned>(l.batch < kMaxRowBlocks ? l.batch : kMaxRowBlocks);
}

inline ScanParams MakeScanParams(const Layout& l, Workspace ws) {
  ScanParams p;
  p.sides = l.sides;
  p.batch = l.batch;
  for (int s = 0; s < l.sides; ++s) {
    if (!l.packed[s]) continue;
    p.totals[s] = At<RowTotals>(ws, l.totals[s]);
    p.bases[s] = At<RowTotals>(ws, l.bases[s]);
  }
  return p;
}

inline WriteParams MakeWriteParams(const SegmentSeqlensArgs& args, const Layout& l, Workspace ws) {
  WriteParams p;
  p.sides = l.sides;
  p.ns = l.ns;
  p.batch = l.batch;
  for (int s = 0; s < l.sides; ++s) {
    const SegmentSeqlensSide& side = s == 0 ? args.q : *args.kv;
    SideOutputs& o = p.out[s];
    o.seqlen = side.seqlen;
    o.offset = side.offset;
    o.packed = side.packed.has_value();
    if (o.packed) {
      o.pseq = side.packed->seqlens;
      o.poff = side.packed->offsets;
      o.pcu = side.packed->cu_seqlens;
    }
    p.stage[s] = MakeStage(l, ws, s);
    p.row_length[s] = (s == 0 ? args.segment_ids_q : *args.segment_ids_kv).shape[1];
  }
  return p;
}

inline unsigned WriteGrid(const Layout& l) {
  const int64_t items = l.batch * (l.ns + 1);
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 4096 ? 4096 : blocks));
}

// ---- device code ----------------------------------------------------------

using LLScan = cub::BlockScan<long long, kThreads>;
using ULLScan = cub::BlockScan<unsigned long long, kThreads>;
using LLDisc = cub::BlockDiscontinuity<long long, kThreads>;
using TotalsScan = cub::BlockScan<RowTotals, kThreads>;

struct TileStorage {
  union {
    typename LLScan::TempStorage scan;
    typename ULLScan::TempStorage uscan;
    typename LLDisc::TempStorage disc;
  } cub;
  long long last_id;
  long long last_kept;
};

struct NotEqual {
  __device__ __forceinline__ bool operator()(long long a, long long b) const { return a != b; }
};
struct MaxOp {
  __device__ __forceinline__ long long operator()(long long a, long long b) const {
    return a > b ? a : b;
  }
};
struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(const T& a, const T& b) const {
    return a + b;
  }
};

// Block prefix callback: the running total over tiles. Only warp 0 calls it,
// so `running` is current in the threads of warp 0 (thread 0 reads it).
template <typename T, typename Op = SumOp>
struct RunningPrefix {
  T running;
  __device__ __forceinline__ T operator()(T block_aggregate) {
    const T old = running;
    running = Op()(running, block_aggregate);
    return old;
  }
};

// One element of a client view, loaded exactly once: volatile, so the
// compiler can neither repeat the load (and validate one value but store
// another in the snapshot) nor serve it from a read-only cache line.
__device__ __forceinline__ long long LoadClientIdx(const TensorView& v, int64_t off, bool aligned) {
  const bool wide = v.dtype == DType::kInt64;
  if (aligned) {
    if (wide) return *(static_cast<const volatile long long*>(v.data) + off);
    return *(static_cast<const volatile int*>(v.data) + off);
  }
  const volatile unsigned char* p =
      static_cast<const volatile unsigned char*>(v.data) + off * (wide ? 8 : 4);
  unsigned long long x = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    if (k < 4 || wide) x |= static_cast<unsigned long long>(p[k]) << (8 * k);
  }
  return wide ? static_cast<long long>(x) : static_cast<long long>(static_cast<int>(x));
}

// Snapshot element `i` ([B][T] row-major, the view's dtype).
__device__ __forceinline__ long long LoadSnap(const void* snap, DType dtype, int64_t i) {
  if (dtype == DType::kInt64) return static_cast<const long long*>(snap)[i];
  return static_cast<const int*>(snap)[i];
}
__device__ __forceinline__ void StoreSnap(void* snap, DType dtype, int64_t i, long long value) {
  if (dtype == DType::kInt64) {
    static_cast<long long*>(snap)[i] = value;
  } else {
    static_cast<int*>(snap)[i] = static_cast<int>(value);
  }
}

__device__ __forceinline__ void Store32(const TensorView& v, int64_t off, long long value) {
  char* p = static_cast<char*>(v.data) + off * 4;
  const int32_t x = static_cast<int32_t>(value);
  if ((reinterpret_cast<uintptr_t>(p) & 3) == 0) {
    *reinterpret_cast<int32_t*>(p) = x;
  } else {
    memcpy(p, &x, sizeof(x));
  }
}

// A per-thread partial aggregate of id v (v in [1, NS] or ignored).
struct Partial {
  long long v = 0;
  long long cnt = 0;
  long long lo = LLONG_MAX;
  long long hi = LLONG_MIN;
};

__device__ __forceinline__ void Commit(const Partial& x, int64_t ns, int32_t* bins, DevAgg* agg,
                                       bool with_pos) {
  if (x.v < 1 || x.v > ns || x.cnt == 0) return;
  if (bins != nullptr) atomicAdd(&bins[x.v - 1], static_cast<int>(x.cnt));
  if (agg != nullptr) {
    atomicAdd(&agg[x.v].cnt, static_cast<unsigned long long>(x.cnt));
    if (with_pos) {
      atomicMin(&agg[x.v].minpos, x.lo);
      atomicMax(&agg[x.v].maxpos, x.hi);
    }
  }
}

// Commits every thread's last partial; a warp whose threads all hold the same
// id (the common case: runs are long) reduces first and commits once.
__device__ __forceinline__ void WarpCommit(Partial x, int64_t ns, int32_t* bins, DevAgg* agg,
                                           bool with_pos) {
  const bool has = x.cnt != 0 && x.v >= 1 && x.v <= ns;
  const unsigned long long key = has ? static_cast<unsigned long long>(x.v) : ~0ull;
  const unsigned peers = __match_any_sync(0xffffffffu, key);
  if (peers != 0xffffffffu) {
    if (has) Commit(x, ns, bins, agg, with_pos);
    return;
  }
  if (!has) return;  // warp-uniform
  for (int d = 16; d > 0; d >>= 1) {
    x.cnt += __shfl_xor_sync(0xffffffffu, x.cnt, d);
    if (with_pos) {
      const long long lo = __shfl_xor_sync(0xffffffffu, x.lo, d);
      const long long hi = __shfl_xor_sync(0xffffffffu, x.hi, d);
      x.lo = lo < x.lo ? lo : x.lo;
      x.hi = hi > x.hi ? hi : x.hi;
    }
  }
  if ((threadIdx.x & 31) == 0) Commit(x, ns, bins, agg, with_pos);
}

__device__ __forceinline__ SegmentAgg ToAgg(const DevAgg& a) {
  SegmentAgg r;
  r.cnt = static_cast<int64_t>(a.cnt);
  r.minpos = a.minpos;
  r.maxpos = a.maxpos;
  return r;
}

enum Mode { kSelf = 0, kAggregate = 1, kKeep = 2 };

// One side of one row, tile by tile. kSelf: validate + emit (keep = id);
// kAggregate: validate + aggregates into `mine`; kKeep: emit the kept-id
// stream using `mine` (this side) and `other`. Emitting = offsets by kept-run
// rank and kept counts into the id-indexed seqlen bins.
template <int kMode>
__device__ void ScanSide(const RowParams& p, int s, int64_t row, DevAgg* mine, const DevAgg* other,
                         TileStorage* sm) {
  const SideInput& in = p.in[s];
  const SideStage& st = p.stage[s];
  const int64_t n = in.n;
  const int64_t ns = p.ns;
  const bool need_pos = p.read_pos;  // cross-attention with a causal mask only
  const int64_t id_row = row * in.ids.strides[0];
  const int64_t pos_row = need_pos ? row * in.pos.strides[0] : 0;
  const int64_t snap_row = row * n;
  int32_t* bins = st.seqlen + row * ns;
  int32_t* offsets = st.offset + row * (ns + 1);
  RunningPrefix<long long, MaxOp> max_prefix{0};
  RunningPrefix<long long> rank_prefix{0};
  long long pred_id = 0;
  long long pred_kept = 0;
  for (int64_t base = 0; base < n; base += kTile) {
    const int64_t t0 = base + threadIdx.x * kItems;
    long long id[kItems];
    long long pos[kItems];
    long long kept[kItems];
    if (kMode != kKeep) {
      // Pass 1: the only read of the client's ids (and positions); the values
      // validated below are the values stored in the snapshot.
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const int64_t t = t0 + i;
        id[i] = t < n ? LoadClientIdx(in.ids, id_row + t * in.ids.strides[1], in.ids_aligned) : 0;
        pos[i] = (need_pos && t < n && id[i] != 0)
                     ? LoadClientIdx(in.pos, pos_row + t * in.pos.strides[1], in.pos_aligned)
                     : 0;
        if (t < n) {
          StoreSnap(in.ids_snap, in.ids.dtype, snap_row + t, id[i]);
          if (need_pos) StoreSnap(in.pos_snap, in.pos.dtype, snap_row + t, pos[i]);
        }
      }
    } else {
      // Pass 2 (cross-attention): the snapshot this thread wrote in pass 1
      // (same tile arrangement, so the same thread: program order).
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const int64_t t = t0 + i;
        id[i] = t < n ? LoadSnap(in.ids_snap, in.ids.dtype, snap_row + t) : 0;
        pos[i] = (need_pos && t < n && id[i] != 0)
                     ? LoadSnap(in.pos_snap, in.pos.dtype, snap_row + t)
                     : 0;
      }
    }
    if (kMode != kKeep) {  // validation (and aggregates)
      int heads[kItems];
      if (base == 0) {
        LLDisc(sm->cub.disc).FlagHeads(heads, id, NotEqual());
      } else {
        LLDisc(sm->cub.disc).FlagHeads(heads, id, NotEqual(), pred_id);
      }
      __syncthreads();
      long long prev_max[kItems];
      LLScan(sm->cub.scan).ExclusiveScan(id, prev_max, MaxOp(), max_prefix);
      __syncthreads();
      bool bad = false;
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        if (t0 + i >= n) continue;
        if (heads[i] && SegmentCheckRunStart(id[i], prev_max[i], ns) != SegmentErrorKind::kNone) {
          bad = true;
        }
        if (need_pos && id[i] != 0 && pos[i] < 0) bad = true;
      }
      if (bad) SetInvalid(p.ws);
    }
    if (kMode == kAggregate) {
      Partial cur;
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        if (t0 + i >= n) continue;
        if (id[i] != cur.v) {
          Commit(cur, ns, nullptr, mine, need_pos);
          cur = Partial{id[i], 0, LLONG_MAX, LLONG_MIN};
        }
        ++cur.cnt;
        cur.lo = pos[i] < cur.lo ? pos[i] : cur.lo;
        cur.hi = pos[i] > cur.hi ? pos[i] : cur.hi;
      }
      WarpCommit(cur, ns, nullptr, mine, need_pos);
    } else {
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const long long v = id[i];
        kept[i] = 0;
        if (t0 + i >= n || v < 1 || v > ns) continue;
        if (kMode == kSelf) {
          kept[i] = v;
        } else if (pos[i] < 0) {
          // Only on data pass 1 flagged (no output is written): keeps the
          // keep predicate's no-overflow premise (pos >= 0) for any input.
          kept[i] = 0;
        } else {
          const SegmentAgg a = ToAgg(mine[v]);
          const SegmentAgg b = ToAgg(other[v]);
          const bool keep = s == 0 ? SegmentKeepQ(SegmentQRule(p.mask, a, b), pos[i])
                                   : SegmentKeepKv(SegmentKvRule(p.mask, b, a), pos[i]);
          kept[i] = keep ? v : 0;
        }
      }
      int heads[kItems];
      if (base == 0) {
        LLDisc(sm->cub.disc).FlagHeads(heads, kept, NotEqual());
      } else {
        LLDisc(sm->cub.disc).FlagHeads(heads, kept, NotEqual(), pred_kept);
      }
      __syncthreads();
      long long start[kItems];
      long long rank[kItems];
#pragma unroll
      for (int i = 0; i < kItems; ++i) start[i] = (heads[i] && kept[i] != 0) ? 1 : 0;
      LLScan(sm->cub.scan).ExclusiveSum(start, rank, rank_prefix);
      __syncthreads();
      Partial cur;
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        if (start[i] && rank[i] <= ns) offsets[rank[i]] = static_cast<int32_t>(t0 + i);
        if (kept[i] == 0) continue;
        if (kept[i] != cur.v) {
          Commit(cur, ns, bins, nullptr, false);
          cur = Partial{kept[i], 0, 0, 0};
        }
        ++cur.cnt;
      }
      WarpCommit(cur, ns, bins, nullptr, false);
    }
    if (threadIdx.x == kThreads - 1) {
      sm->last_id = id[kItems - 1];
      sm->last_kept = kMode == kAggregate ? 0 : kept[kItems - 1];
    }
    __syncthreads();
    pred_id = sm->last_id;
    pred_kept = sm->last_kept;
    __syncthreads();  // last_* are rewritten by the next tile
  }
  if (kMode != kAggregate && st.totals != nullptr && threadIdx.x == 0) {
    const long long runs = rank_prefix.running;
    st.totals[row].off = runs < ns + 1 ? runs : ns + 1;
  }
}

// Packed sides: the row's non-zero seqlens compacted in id order, as
// inclusive sums, plus the row totals. One BlockScan over the NS bins of
// (count << 32 | seqlen) (both sums stay below 2^31).
__device__ __forceinline__ void CompactRow(const SideStage& st, int64_t row, int64_t ns,
                                           TileStorage* sm) {
  RunningPrefix<unsigned long long> prefix{0};
  const int32_t* bins = st.seqlen + row * ns;
  int32_t* cum = st.cum + row * ns;
  for (int64_t base = 0; base < ns; base += kThreads) {
    const int64_t j = base + threadIdx.x;
    const long long val = j < ns ? bins[j] : 0;
    const unsigned long long x =
        (val != 0 ? (1ull << 32) : 0ull) | static_cast<unsigned long long>(val);
    unsigned long long ex;
    ULLScan(sm->cub.uscan).ExclusiveSum(x, ex, prefix);
    __syncthreads();
    if (val != 0) cum[ex >> 32] = static_cast<int32_t>((ex & 0xffffffffull) + val);
  }
  if (threadIdx.x == 0) {
    st.totals[row].seg = static_cast<long long>(prefix.running >> 32);
    st.totals[row].tok = static_cast<long long>(prefix.running & 0xffffffffull);
  }
}

// Packed entries owned by (row b, slot j in [0, NS]); mirrors the CPU WriteSide.
__device__ __forceinline__ void WritePacked(const SideOutputs& o, const SideStage& st, int64_t b,
                                            int64_t j, int64_t ns, int64_t batch, int64_t t_len) {
  const RowTotals base = st.bases[b];
  const RowTotals next = st.bases[b + 1];
  const RowTotals tot = st.bases[batch];
  const int64_t s_seq = o.pseq.strides[0];
  const int64_t s_off = o.poff.strides[0];
  const int64_t s_cu = o.pcu.strides[0];
  if (b == 0 && j == 0) Store32(o.pcu, 0, 0);
  if (j < ns) {
    if (j < next.seg - base.seg) {
      const int32_t* cum = st.cum + b * ns;
      const long long c = cum[j];
      const long long prev = j > 0 ? cum[j - 1] : 0;
      Store32(o.pseq, (base.seg + j) * s_seq, c - prev);
      Store32(o.pcu, (base.seg + j + 1) * s_cu, base.tok + c);
    }
    const int64_t x = b * ns + j;
    if (x >= tot.seg) {
      Store32(o.pseq, x * s_seq, 0);
      Store32(o.pcu, (x + 1) * s_cu, tot.tok);
    }
  }
  if (j < next.off - base.off) {
    Store32(o.poff, (base.off + j) * s_off, st.offset[b * (ns + 1) + j] + b * t_len);
  }
  const int64_t x = b * (ns + 1) + j;
  if (x >= tot.off) Store32(o.poff, x * s_off, batch * t_len);
}

}  // namespace tokensel::kernels::cuda::seg

#endif  // TOKENSEL_KERNELS_CUDA_SEGMENT_SEQLENS_IMPL_CUH_
