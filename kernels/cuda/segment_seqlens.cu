// SegmentSeqlens on the GPU (contract: kernels/cuda/cuda_ops.h, kernels/ops.h;
// algorithm: te-thd-seqlens.md section 5, Design A; decisions: docs/gpu.md).
//
// RowKernel, one CTA of 256 threads per row (both sides in one CTA), tiles of
// 1024 tokens (4 per thread, blocked):
//   self:  one pass over the ids: run heads (cub::BlockDiscontinuity with the
//          previous tile's last id as predecessor), an exclusive max-scan of
//          the ids (cub::BlockScan with a running prefix) gives every run head
//          the previous segment's id for SegmentCheckRunStart; the head rank
//          (BlockScan ExclusiveSum, running prefix) gives offset[k] = t; the
//          run lengths go to the id-indexed seqlen bins (warp-aggregated
//          atomics).
//   cross: phase 1 validates both sides and builds the per-id aggregates
//          (cnt, minpos, maxpos) in shared memory (global workspace when NS+1
//          bins do not fit) with atomicAdd/Min/Max; __syncthreads; phase 2
//          applies the keep predicate of segment_math.h per token and runs the
//          same head/rank/bin core on the kept-id stream.
//   Everything goes to staging in the workspace; on bad data the CTA sets the
//   status word. For packed sides the CTA also compacts its non-zero seqlens
//   (BlockScan over the NS bins) into an inclusive prefix and per-row totals.
// ScanKernel (packed only, 1 CTA): exclusive scan of the per-row totals over B.
// WriteKernel (grid-stride over B*(NS+1) per side): returns at once when the
//   status word is set; otherwise writes seqlen/offset and the packed layout.
// Invalid data therefore writes no output. The error message is the CPU
// twin's (FinishWithCpuOracle). Not implemented: the multi-CTA-per-row path
// (Design B) for B=1 with very long T; such rows run on one SM. RowKernel
// strides over rows (RowGrid), so every B is covered by the grid.
//
// Trust boundary (docs/gpu.md): ids and positions are client memory that may
// change while the op runs. Pass 1 reads each element exactly once (volatile
// loads) and stores the value it validated into a snapshot in the workspace
// ([B][T] per side, the input's dtype; positions only when the mask reads
// them, and 0 for padding tokens, whose positions nobody reads). Pass 2 of
// cross-attention and the CPU oracle of SegmentSeqlensFinish read only the
// snapshots, so the message always describes the data that was checked.
// Every address formed from data is moreover bounded at its point of use, so
// data that failed validation (pass 2 and the compaction still run on it)
// stays in bounds too:
//   - ids index the seqlen bins and the aggregates only when in [1, NS]
//     (Commit, and the keep loop of ScanSide);
//   - a kept-run rank indexes the offset staging only when <= NS;
//   - a row's packed totals are computed by the server from its staging:
//     seg = non-zero bins <= NS, off = min(runs, NS+1), tok <= T (each token
//     adds at most 1 to one bin, so the packed 32-bit sums never carry); so
//     WritePacked's base.seg + j < B*NS and base.off + j < B*(NS+1);
//   - negative positions only reach pass 2 on flagged data and are dropped
//     there, so the keep predicate's no-overflow premise (pos >= 0) holds;
//   - outputs are written only by WriteKernel, which exits when any row
//     flagged.
// Cost: the snapshot is one extra write of the input bytes in pass 1 (pass 2
// used to re-read the client tensor, now it reads the snapshot from L2); the
// op is launch-bound at the benchmark shape.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <optional>
#include <vector>

#include "common/status_macros.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/segment_seqlens_impl.cuh"
#include "kernels/cuda/status.cuh"
#include "kernels/cuda/workspace_layout.h"
#include "kernels/segment_math.h"

namespace tokensel::kernels::cuda {
namespace seg {

__global__ void __launch_bounds__(kThreads) RowKernel(RowParams p) {
  extern __shared__ DevAgg smem_agg[];
  __shared__ TileStorage storage;
  const int64_t ns = p.ns;
  const bool cross = p.sides == 2;
  for (int64_t row = blockIdx.x; row < p.batch; row += gridDim.x) {
    DevAgg* agg = nullptr;
    if (cross) {
      agg = p.agg_in_smem ? smem_agg : p.agg_global + row * 2 * (ns + 1);
      for (int64_t i = threadIdx.x; i < 2 * (ns + 1); i += kThreads) {
        agg[i] = DevAgg{0ull, LLONG_MAX, LLONG_MIN};
      }
    }
    for (int s = 0; s < p.sides; ++s) {
      const SideStage& st = p.stage[s];
      for (int64_t j = threadIdx.x; j < ns + 1; j += kThreads) {
        if (j < ns) st.seqlen[row * ns + j] = 0;
        st.offset[row * (ns + 1) + j] = -1;
      }
    }
    __syncthreads();
    if (!cross) {
      ScanSide<kSelf>(p, 0, row, nullptr, nullptr, &storage);
    } else {
      ScanSide<kAggregate>(p, 0, row, agg, nullptr, &storage);
      ScanSide<kAggregate>(p, 1, row, agg + ns + 1, nullptr, &storage);
      __syncthreads();  // aggregates complete
      ScanSide<kKeep>(p, 0, row, agg, agg + ns + 1, &storage);
      ScanSide<kKeep>(p, 1, row, agg + ns + 1, agg, &storage);
    }
    __syncthreads();  // seqlen bins complete
    for (int s = 0; s < p.sides; ++s) {
      if (p.stage[s].cum != nullptr) CompactRow(p.stage[s], row, ns, &storage);
    }
    __syncthreads();  // shared memory (aggregates, storage) is reused by the next row
  }
}

__global__ void __launch_bounds__(kThreads) ScanKernel(Workspace ws, ScanParams p) {
  if (IsInvalid(ws)) return;
  __shared__ typename TotalsScan::TempStorage temp;
#pragma unroll
  for (int s = 0; s < 2; ++s) {  // unrolled: constant indices keep p in param space
    const RowTotals* totals = p.totals[s];
    RowTotals* bases = p.bases[s];
    if (totals == nullptr) continue;
    RunningPrefix<RowTotals> prefix{RowTotals{0, 0, 0}};
    for (int64_t base = 0; base < p.batch; base += kThreads) {
      const int64_t b = base + threadIdx.x;
      const RowTotals in = b < p.batch ? totals[b] : RowTotals{0, 0, 0};
      RowTotals out;
      TotalsScan(temp).ExclusiveSum(in, out, prefix);
      if (b < p.batch) bases[b] = out;
      __syncthreads();
    }
    if (threadIdx.x == 0) bases[p.batch] = prefix.running;
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kThreads) WriteKernel(Workspace ws, WriteParams p) {
  if (IsInvalid(ws)) return;
  const int64_t ns = p.ns;
  const int64_t per_side = p.batch * (ns + 1);
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    if (s >= p.sides) break;
    const SideStage& st = p.stage[s];
    const SideOutputs& o = p.out[s];
    for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < per_side;
         i += int64_t{gridDim.x} * kThreads) {
      const int64_t b = i / (ns + 1);
      const int64_t j = i % (ns + 1);
      const int32_t off = st.offset[i];
      Store32(o.offset, b * o.offset.strides[0] + j * o.offset.strides[1], off);
      if (j < ns) {
        Store32(o.seqlen, b * o.seqlen.strides[0] + j * o.seqlen.strides[1], st.seqlen[b * ns + j]);
      }
      if (!o.packed) continue;
      WritePacked(o, st, b, j, ns, p.batch, p.row_length[s]);
    }
  }
}

}  // namespace seg

size_t SegmentSeqlensWorkspaceBytes(const SegmentSeqlensArgs& args) {
  return SegmentSeqlensLayout(args).total;
}

absl::Status SegmentSeqlensAsync(const SegmentSeqlensArgs& args, Workspace ws, Stream stream) {
  RETURN_IF_ERROR(ValidateSegmentSeqlens(args));
  const SegmentLayout layout = SegmentSeqlensLayout(args);
  RETURN_IF_ERROR(CheckWorkspace(ws, layout.total, "SegmentSeqlens"));
  RETURN_IF_ERROR(ResetStatusAsync(ws, stream));
  if (layout.batch == 0) {
    // No rows, so no kernel: the one element of each packed cu_seqlens
    // ([B * NS + 1] = [1], int32) is its leading 0, which the CPU twin
    // writes too. Ordered on the op's stream like the kernels it replaces.
    for (const SegmentSeqlensSide* side : {&args.q, args.kv ? &*args.kv : nullptr}) {
      if (side == nullptr || !side->packed.has_value()) continue;
      CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(side->packed->cu_seqlens.data, 0, sizeof(int32_t), stream));
    }
    return absl::OkStatus();
  }
  const seg::RowParams rp = seg::MakeRowParams(args, layout, ws);
  const size_t smem = rp.agg_in_smem ? layout.agg_smem_bytes : 0;
  seg::RowKernel<<<seg::RowGrid(layout), seg::kThreads, smem, stream>>>(rp);
  CUDA_RETURN_IF_LAUNCH_ERROR("SegmentSeqlens RowKernel");
  const seg::ScanParams sp = seg::MakeScanParams(layout, ws);
  if (sp.totals[0] != nullptr || sp.totals[1] != nullptr) {
    seg::ScanKernel<<<1, seg::kThreads, 0, stream>>>(ws, sp);
    CUDA_RETURN_IF_LAUNCH_ERROR("SegmentSeqlens ScanKernel");
  }
  const seg::WriteParams wp = seg::MakeWriteParams(args, layout, ws);
  seg::WriteKernel<<<seg::WriteGrid(layout), seg::kThreads, 0, stream>>>(ws, wp);
  CUDA_RETURN_IF_LAUNCH_ERROR("SegmentSeqlens WriteKernel");
  return absl::OkStatus();
}

absl::Status SegmentSeqlensFinish(const SegmentSeqlensArgs& args, Workspace ws, Stream stream) {
  // The message is computed from the snapshots the device validated. Inputs
  // it does not read (positions outside causal cross-attention) are not
  // copied: the CPU op ignores them too.
  const SegmentLayout layout = SegmentSeqlensLayout(args);
  SegmentSeqlensArgs host = args;
  std::vector<TensorView*> inputs;
  std::vector<TensorView*> scratch;  // outputs and unread inputs: host memory, not copied
  host.segment_ids_q = SnapshotView(args.segment_ids_q, SectionAt(ws, layout.ids[0]));
  inputs.push_back(&host.segment_ids_q);
  if (host.segment_ids_kv.has_value()) {
    *host.segment_ids_kv = SnapshotView(*args.segment_ids_kv, SectionAt(ws, layout.ids[1]));
    inputs.push_back(&*host.segment_ids_kv);
  }
  for (int s = 0; s < 2; ++s) {
    std::optional<TensorView>& pos = s == 0 ? host.segment_pos_q : host.segment_pos_kv;
    if (!pos.has_value()) continue;
    if (layout.read_pos) {
      *pos = SnapshotView(*pos, SectionAt(ws, layout.pos[s]));
      inputs.push_back(&*pos);
    } else {
      scratch.push_back(&*pos);
    }
  }
  auto add_side = [&](SegmentSeqlensSide& side) {
    scratch.push_back(&side.seqlen);
    scratch.push_back(&side.offset);
    if (side.packed.has_value()) {
      scratch.push_back(&side.packed->seqlens);
      scratch.push_back(&side.packed->offsets);
      scratch.push_back(&side.packed->cu_seqlens);
    }
  };
  add_side(host.q);
  if (host.kv.has_value()) add_side(*host.kv);
  return FinishWithCpuOracle(ws, stream, "SegmentSeqlens", inputs, scratch,
                             [&] { return cpu::SegmentSeqlens(host, nullptr); });
}

}  // namespace tokensel::kernels::cuda
