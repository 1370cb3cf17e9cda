// `tokensel seqlens`: SegmentSeqlens on inline .npy files.
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "client/cli/op_util.h"
#include "common/status_macros.h"
#include "tokensel/client/tensor_ref.h"

ABSL_FLAG(std::string, segment_ids_q, "", "input .npy: int32|int64 [B,Tq] packed segment ids");
ABSL_FLAG(std::string, segment_pos_q, "", "optional input .npy: [B,Tq] positions in segment");
ABSL_FLAG(std::string, segment_ids_kv, "", "optional input .npy: [B,Tkv] (cross-attention)");
ABSL_FLAG(std::string, segment_pos_kv, "", "optional input .npy: [B,Tkv]");
ABSL_FLAG(int64_t, max_segments, 0, "NS, segments per row (required)");
ABSL_FLAG(std::string, attn_mask, "padding", "padding | causal | causal_bottom_right");
ABSL_FLAG(bool, packed, false, "also compute the packed (cu_seqlens) layout");
ABSL_FLAG(std::string, out_dir, ".", "directory for the outputs, one <name>.npy each");

namespace tokensel::cli {
namespace {

absl::StatusOr<v1::AttnMaskType> ParseMask(const std::string& name) {
  if (name == "padding") return v1::ATTN_MASK_PADDING;
  if (name == "causal") return v1::ATTN_MASK_CAUSAL;
  if (name == "causal_bottom_right") return v1::ATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  return absl::InvalidArgumentError(
      absl::StrCat("--attn_mask='", name, "': expected padding, causal or causal_bottom_right"));
}

absl::Status Seqlens(const client::Client& client) {
  v1::SegmentSeqlensRequest req;
  ASSIGN_OR_RETURN(*req.mutable_segment_ids_q(),
                   ReadInlineInput("segment_ids_q", absl::GetFlag(FLAGS_segment_ids_q)));
  if (const std::string p = absl::GetFlag(FLAGS_segment_pos_q); !p.empty()) {
    ASSIGN_OR_RETURN(*req.mutable_segment_pos_q(), ReadInlineInput("segment_pos_q", p));
  }
  const std::string kv = absl::GetFlag(FLAGS_segment_ids_kv);
  if (!kv.empty()) {
    ASSIGN_OR_RETURN(*req.mutable_segment_ids_kv(), ReadInlineInput("segment_ids_kv", kv));
  }
  if (const std::string p = absl::GetFlag(FLAGS_segment_pos_kv); !p.empty()) {
    ASSIGN_OR_RETURN(*req.mutable_segment_pos_kv(), ReadInlineInput("segment_pos_kv", p));
  }
  req.set_max_segments(absl::GetFlag(FLAGS_max_segments));
  ASSIGN_OR_RETURN(v1::AttnMaskType mask, ParseMask(absl::GetFlag(FLAGS_attn_mask)));
  req.set_mask(mask);
  const bool packed = absl::GetFlag(FLAGS_packed);
  req.set_packed(packed);

  const v1::Tensor inline_out = client::TensorRef::InlineOutput().ToProto();
  std::vector<std::string> names = {"q_seqlen", "q_offset"};
  *req.mutable_q_seqlen() = inline_out;
  *req.mutable_q_offset() = inline_out;
  if (packed) {
    *req.mutable_q_packed_seqlens() = inline_out;
    *req.mutable_q_packed_offsets() = inline_out;
    *req.mutable_q_cu_seqlens() = inline_out;
    names.insert(names.end(), {"q_packed_seqlens", "q_packed_offsets", "q_cu_seqlens"});
  }
  if (!kv.empty()) {
    *req.mutable_kv_seqlen() = inline_out;
    *req.mutable_kv_offset() = inline_out;
    names.insert(names.end(), {"kv_seqlen", "kv_offset"});
    if (packed) {
      *req.mutable_kv_packed_seqlens() = inline_out;
      *req.mutable_kv_packed_offsets() = inline_out;
      *req.mutable_kv_cu_seqlens() = inline_out;
      names.insert(names.end(), {"kv_packed_seqlens", "kv_packed_offsets", "kv_cu_seqlens"});
    }
  }
  ASSIGN_OR_RETURN(v1::OpResponse resp, client.SegmentSeqlens(req));
  const std::string dir = absl::GetFlag(FLAGS_out_dir);
  for (const std::string& name : names) {
    RETURN_IF_ERROR(WriteOutput(resp, name, absl::StrCat(dir, "/", name, ".npy")));
  }
  return absl::OkStatus();
}

int RunSeqlens() { return RunInSession("seqlens", Seqlens); }

}  // namespace

const Command kSeqlensCommand = {
    "seqlens", "SegmentSeqlens: THD seqlens/offsets from packed segment ids",
    "Computes per-segment lengths and offsets of packed sequences (Transformer\n"
    "Engine THD layout) from --segment_ids_q (ids 1..NS in runs, 0 = padding) and\n"
    "writes q_seqlen.npy, q_offset.npy (and q_packed_seqlens, q_packed_offsets,\n"
    "q_cu_seqlens with --packed; kv_* with --segment_ids_kv) into --out_dir.\n"
    "  tokensel seqlens --segment_ids_q=seg.npy --max_segments=16 --packed --out_dir=out",
    ConnectionFlags({"segment_ids_q", "segment_pos_q", "segment_ids_kv", "segment_pos_kv",
                     "max_segments", "attn_mask", "packed", "out_dir"}),
    &RunSeqlens};

}  // namespace tokensel::cli
