// Writes the seed corpora of the fuzz targets:
//   make_seeds <dir>   ->  <dir>/op/*, <dir>/registry/*
// op: the worked examples of docs/ops.md (every operator, valid and small,
// inline and by reference into the fuzz environment's buffers, both index
// types, batch_first both ways) as serialized tokensel.v1.Op behind the
// even "proto" tag byte (op_decoder.h), plus a few structured inputs.
// registry: byte scripts for registry_fuzzer.cc (any bytes are a script;
// these reach register/acquire/unregister-while-leased quickly).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tokensel/v1/tokensel.pb.h"

namespace tokensel::fuzz {
namespace {

namespace fs = std::filesystem;

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

v1::Tensor Inline(v1::DType dtype, std::vector<int64_t> shape, std::string data) {
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  t.set_inline_data(std::move(data));
  return t;
}

v1::Tensor Ref(v1::DType dtype, std::vector<int64_t> shape, const char* buffer, uint64_t offset,
               std::vector<int64_t> strides = {}) {
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  for (int64_t s : strides) t.add_strides(s);
  t.mutable_buffer()->set_buffer(buffer);
  t.mutable_buffer()->set_byte_offset(offset);
  return t;
}

v1::Tensor InlineOut() { return v1::Tensor(); }

std::vector<v1::Op> OpSeeds() {
  std::vector<v1::Op> ops;
  const std::vector<int32_t> ids32 = {3, 0, 2, 1, 0, 3};  // [2,3] of S = 4
  const std::vector<int64_t> ids64 = {2, 0, 3, 1, 1, 2};
  {  // SortTokens: inline ids, inline out + inverse; then in place in a buffer.
    v1::Op op;
    auto* r = op.mutable_sort_tokens();
    *r->mutable_ids() = Inline(v1::DTYPE_INT32, {2, 3}, Bytes(ids32));
    r->set_original_tokens(4);
    *r->mutable_out() = InlineOut();
    *r->mutable_inverse() = InlineOut();
    ops.push_back(op);
    r->clear_out();
    *r->mutable_ids() = Ref(v1::DTYPE_INT64, {2, 3}, "big", 64);
    r->set_original_tokens(7);
    ops.push_back(op);
  }
  {  // GatherTokens [B=2,S=4,C=3] fp32 from a buffer, both layouts, both index types.
    v1::Op op;
    auto* r = op.mutable_gather_tokens();
    *r->mutable_activations() = Ref(v1::DTYPE_FLOAT32, {2, 4, 3}, "big", 0);
    *r->mutable_indices() = Inline(v1::DTYPE_INT32, {2, 3}, Bytes(ids32));
    ops.push_back(op);
    r->set_batch_first(false);
    *r->mutable_activations() = Ref(v1::DTYPE_BFLOAT16, {4, 2, 3}, "big", 6, {12, 6, 1});
    *r->mutable_indices() = Inline(v1::DTYPE_INT64, {2, 3}, Bytes(ids64));
    *r->mutable_out() = Ref(v1::DTYPE_BFLOAT16, {3, 2, 3}, "big", 4096);
    ops.push_back(op);
  }
  {  // ScatterTokens: all in a buffer, layer inline, unique indices per row.
    v1::Op op;
    auto* r = op.mutable_scatter_tokens();
    *r->mutable_all() = Ref(v1::DTYPE_FLOAT16, {2, 4, 2}, "big", 128);
    *r->mutable_layer() = Inline(v1::DTYPE_FLOAT16, {2, 3, 2}, std::string(24, '\x3c'));
    *r->mutable_indices() = Inline(v1::DTYPE_INT32, {2, 3}, Bytes(ids32));
    ops.push_back(op);
    *r->mutable_all() = Inline(v1::DTYPE_FLOAT16, {2, 4, 2}, std::string(32, '\0'));
    ops.push_back(op);
  }
  {  // GatherBertMask: mask [B=1,H=2,Sq=4,S=4] uint8, indices [L=2,B=1,R=2].
    v1::Op op;
    auto* r = op.mutable_gather_bert_mask();
    *r->mutable_mask() = Ref(v1::DTYPE_UINT8, {1, 2, 4, 4}, "small", 0);
    *r->mutable_indices() =
        Inline(v1::DTYPE_INT32, {2, 1, 2}, Bytes(std::vector<int32_t>{0, 3, 1, 2}));
    *r->mutable_out() = InlineOut();
    ops.push_back(op);
    *r->mutable_mask() = Inline(v1::DTYPE_BOOL, {1, 2, 1, 4}, std::string(8, '\1'));
    ops.push_back(op);
  }
  {  // SliceGptMask: [1,1,4,4] -> R = 2.
    v1::Op op;
    auto* r = op.mutable_slice_gpt_mask();
    *r->mutable_mask() = Inline(v1::DTYPE_UINT8, {1, 1, 4, 4}, std::string(16, '\1'));
    r->set_retained_tokens(2);
    *r->mutable_out() = InlineOut();
    ops.push_back(op);
    *r->mutable_mask() = Ref(v1::DTYPE_FLOAT32, {1, 2, 4, 4}, "big", 256);
    *r->mutable_out() = Ref(v1::DTYPE_FLOAT32, {1, 2, 2, 2}, "big", 1024);
    ops.push_back(op);
  }
  {  // SegmentSeqlens: packed rows [B=2,T=6] with padding (0), NS = 3.
    v1::Op op;
    auto* r = op.mutable_segment_seqlens();
    *r->mutable_segment_ids_q() = Inline(
        v1::DTYPE_INT32, {2, 6}, Bytes(std::vector<int32_t>{1, 1, 2, 2, 2, 0, 1, 2, 3, 3, 0, 0}));
    r->set_max_segments(3);
    ops.push_back(op);
    r->set_packed(true);
    r->set_mask(v1::ATTN_MASK_CAUSAL);
    *r->mutable_segment_pos_q() = Inline(
        v1::DTYPE_INT32, {2, 6}, Bytes(std::vector<int32_t>{0, 1, 0, 1, 2, 0, 0, 0, 0, 1, 0, 0}));
    *r->mutable_segment_ids_kv() = Ref(v1::DTYPE_INT32, {2, 4}, "small", 0);
    r->set_mask(v1::ATTN_MASK_CAUSAL_BOTTOM_RIGHT);
    ops.push_back(op);
  }
  {  // SampleTokens: L=2,B=2,S=6,R=3, with inverse and both masks.
    v1::Op op;
    auto* r = op.mutable_sample_tokens();
    r->set_layers(2);
    r->set_batch(2);
    r->set_original_tokens(6);
    r->set_retained_tokens(3);
    r->set_seed(42);
    r->set_step(7);
    ops.push_back(op);
    *r->mutable_inverse() = InlineOut();
    *r->mutable_mask() = Ref(v1::DTYPE_UINT8, {2, 1, 6, 6}, "big", 0);
    *r->mutable_bert_mask() = InlineOut();
    *r->mutable_gpt_mask() = InlineOut();
    *r->mutable_ids() = Ref(v1::DTYPE_INT64, {2, 2, 3}, "big", 2048);
    ops.push_back(op);
  }
  {  // TopKTokens: scores [2,5] fp32 inline, R = 2; bf16 from a strided buffer view.
    v1::Op op;
    auto* r = op.mutable_top_k_tokens();
    *r->mutable_scores() =
        Inline(v1::DTYPE_FLOAT32, {2, 5},
               Bytes(std::vector<float>{0.5f, 2.f, -1.f, 2.f, 0.f, 3.f, 1.f, 4.f, 1.f, 5.f}));
    r->set_retained_tokens(2);
    ops.push_back(op);
    *r->mutable_scores() = Ref(v1::DTYPE_BFLOAT16, {2, 5}, "big", 2, {8, 1});
    *r->mutable_ids() = Ref(v1::DTYPE_INT32, {2, 2}, "big", 4000);
    ops.push_back(op);
  }
  {  // MergeTokens: x [1,5,2] fp32 inline (the spec vector), then in place in "big".
    v1::Op op;
    auto* r = op.mutable_merge_tokens();
    *r->mutable_x() = Inline(v1::DTYPE_FLOAT32, {1, 5, 2},
                             Bytes(std::vector<float>{0, 1, 10, 11, 20, 21, 30, 31, 40, 41}));
    *r->mutable_layer() =
        Inline(v1::DTYPE_FLOAT32, {1, 2, 2}, Bytes(std::vector<float>{100, 101, 200, 201}));
    *r->mutable_indices() = Inline(v1::DTYPE_INT32, {1, 2}, Bytes(std::vector<int32_t>{1, 3}));
    ops.push_back(op);
    *r->mutable_x() = Ref(v1::DTYPE_FLOAT32, {1, 5, 2}, "big", 0);
    *r->mutable_out() = Ref(v1::DTYPE_FLOAT32, {1, 5, 2}, "big", 0);
    r->set_batch_first(false);
    ops.push_back(op);
  }
  {  // SplitTokens: grad [1,5,1] inline (the spec vector), then rest_grad in place.
    v1::Op op;
    auto* r = op.mutable_split_tokens();
    *r->mutable_grad() =
        Inline(v1::DTYPE_FLOAT32, {1, 5, 1}, Bytes(std::vector<float>{1, 2, 3, 4, 5}));
    *r->mutable_indices() = Inline(v1::DTYPE_INT64, {1, 2}, Bytes(std::vector<int64_t>{0, 2}));
    ops.push_back(op);
    *r->mutable_grad() = Ref(v1::DTYPE_FLOAT32, {1, 5, 1}, "big", 512);
    *r->mutable_rest_grad() = Ref(v1::DTYPE_FLOAT32, {1, 5, 1}, "big", 512);
    *r->mutable_layer_grad() = Ref(v1::DTYPE_FLOAT32, {1, 2, 1}, "big", 1024);
    ops.push_back(op);
  }
  {  // SamplePackedTokens: the spec vector inline (T' derived), then cu_seqlens by
     // reference with kept_tokens, the fused gather and every optional output.
    v1::Op op;
    auto* r = op.mutable_sample_packed_tokens();
    *r->mutable_cu_seqlens() =
        Inline(v1::DTYPE_INT32, {4}, Bytes(std::vector<int32_t>{0, 3, 3, 8}));
    r->set_total_tokens(8);
    r->set_keep_num(1);
    r->set_keep_den(2);
    r->set_min_tokens(1);
    r->set_layers(2);
    r->set_seed(42);
    r->set_step(7);
    *r->mutable_positions() = InlineOut();
    *r->mutable_inverse() = InlineOut();
    ops.push_back(op);
    *r->mutable_cu_seqlens() = Ref(v1::DTYPE_INT32, {4}, "small", 0);
    r->clear_total_tokens();
    r->set_kept_tokens(5);
    r->set_layers(1);
    *r->mutable_activations() = Ref(v1::DTYPE_BFLOAT16, {8, 16}, "big", 0);
    *r->mutable_out() = InlineOut();
    *r->mutable_ids() = Ref(v1::DTYPE_INT32, {1, 5}, "big", 4096);
    ops.push_back(op);
  }
  return ops;
}

void Write(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace
}  // namespace tokensel::fuzz

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus-dir>\n", argv[0]);
    return 2;
  }
  const fs::path root(argv[1]);
  fs::create_directories(root / "op");
  fs::create_directories(root / "registry");
  int n = 0;
  for (const tokensel::v1::Op& op : tokensel::fuzz::OpSeeds()) {
    tokensel::fuzz::Write(root / "op" / ("spec-" + std::to_string(n++)),
                          std::string(1, '\0') + op.SerializeAsString());
  }
  // Structured (odd tag) inputs: every op choice once with filler bytes.
  for (int op = 0; op < 9; ++op) {
    std::string bytes(1, '\1');
    for (int i = 0; i < 96; ++i) bytes.push_back(static_cast<char>((i * 37 + op) & 0xff));
    bytes.push_back(static_cast<char>(op));
    tokensel::fuzz::Write(root / "op" / ("structured-" + std::to_string(op)), bytes);
  }
  // Registry scripts: FuzzedDataProvider takes integers from the end, so
  // these are mostly patterns for the mutator to recombine.
  for (int i = 0; i < 8; ++i) {
    std::string bytes;
    for (int j = 0; j < 64 * (i + 1); ++j) bytes.push_back(static_cast<char>((j * (i + 3)) & 0xff));
    tokensel::fuzz::Write(root / "registry" / ("script-" + std::to_string(i)), bytes);
  }
  std::printf("make_seeds: wrote %d op seeds and the registry scripts to %s\n", n + 9,
              root.c_str());
  return 0;
}
