// The layout of the racing-writer test's shared object: control tensors
// (indices, ids, segment ids and positions, scores) in the first
// control_bytes, which the flipper rewrites as fast as it can, then the data
// tensors. Every byte of the data area that no op may write is a guard byte:
// after every op it must still hold its initial value.
#ifndef TOKENSEL_TESTS_SERVER_SECURITY_RACE_LAYOUT_H_
#define TOKENSEL_TESTS_SERVER_SECURITY_RACE_LAYOUT_H_

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace tokensel::security {

struct RaceLayout {
  // Sizes chosen so that an op takes tens of microseconds between its reads
  // of the control tensors: the window a racing writer has to hit.
  static constexpr int64_t kS = 512;  // tokens per row (gather/scatter/sort/topk/masks)
  static constexpr int64_t kNS = 64;  // max segments

  int64_t B = 32, S = kS, C = 16, R = 128;  // token tensors
  int64_t MB = 2;                           // mask batch
  int64_t SB = 8, T = 2048, NS = kNS;       // segment ids [SB, T]

  // Byte offsets.
  uint64_t gather_idx = 0, scatter_idx = 16384, sort_ids = 32768;
  uint64_t seg_ids = 49152, seg_pos = 114688, scores = 180224;
  uint64_t control_bytes = 262144;
  uint64_t acts = 262144, gather_out = 1310720, layer = 1572864, mask = 1835008;
  uint64_t bert_out = 2359296, gpt_out = 2392064, sort_inverse = 2424832;
  uint64_t sample_bert_out = 2490368, sample_bert_bytes = 32768;
  uint64_t bytes = 2621440;

  static const RaceLayout& Get() {
    static const RaceLayout layout;
    return layout;
  }

  // [begin, end) ranges of the data area that some op writes.
  std::vector<std::pair<uint64_t, uint64_t>> Writable() const {
    return {{acts, gather_out},
            {gather_out, layer},
            {bert_out, gpt_out},
            {gpt_out, sort_inverse},
            {sort_inverse, sample_bert_out},
            {sample_bert_out, sample_bert_out + sample_bert_bytes}};
  }

  // The data area minus Writable(): [layer, mask) (inputs only), the masks,
  // and the tail.
  std::vector<std::pair<uint64_t, uint64_t>> Guards() const {
    return {{layer, bert_out}, {sample_bert_out + sample_bert_bytes, bytes}};
  }

  // Valid control tensors and patterned data.
  void Fill(uint8_t* base) const {
    auto words = [&](uint64_t offset, uint64_t n, auto value) {
      for (uint64_t i = 0; i < n; ++i) {
        const int32_t v = static_cast<int32_t>(value(i));
        std::memcpy(base + offset + 4 * i, &v, 4);
      }
    };
    words(gather_idx, B * R, [&](uint64_t i) { return (i * 7) % S; });
    words(scatter_idx, B * R, [&](uint64_t i) { return (i % R) * (S / R); });  // unique per row
    words(sort_ids, B * R, [&](uint64_t i) { return ((i % R) * 13) % S; });
    words(seg_ids, SB * T, [&](uint64_t i) { return 1 + ((i % T) * NS) / T; });
    words(seg_pos, SB * T, [&](uint64_t i) { return i % 16; });
    words(scores, B * S, [&](uint64_t i) { return i; });  // any bits: floats
    for (uint64_t i = control_bytes; i < bytes; ++i) {
      base[i] = static_cast<uint8_t>((i * 2654435761u) >> 24);
    }
  }

  int64_t CountGuardViolations(const uint8_t* initial, const uint8_t* now) const {
    int64_t bad = 0;
    for (const auto& [b, e] : Guards()) {
      if (std::memcmp(initial + b, now + b, e - b) == 0) continue;
      for (uint64_t i = b; i < e; ++i) bad += initial[i] != now[i];
    }
    return bad;
  }

  void RestoreGuards(const uint8_t* initial, uint8_t* now) const {
    for (const auto& [b, e] : Guards()) std::memcpy(now + b, initial + b, e - b);
  }
};

}  // namespace tokensel::security

#endif  // TOKENSEL_TESTS_SERVER_SECURITY_RACE_LAYOUT_H_
