// Helpers the operator homes (server/core/ops/*.cc) share: saturating work
// arithmetic for EstimateWork, byte counts for BytesMoved, and the argument
// checks of output-shape derivations. Header-only, no state.
#ifndef TOKENSEL_SERVER_CORE_OPS_OP_SUPPORT_H_
#define TOKENSEL_SERVER_CORE_OPS_OP_SUPPORT_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/sparse_rows.h"
#include "kernels/tensor_view.h"
#include "server/core/output_shapes.h"
#include "server/core/tensor_spec.h"

namespace tokensel::core::ops_support {

// --- work (elements), saturating at UINT64_MAX; negative dims count 0 -------

inline uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

inline uint64_t SaturatingMul(uint64_t a, uint64_t b) {
  return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

inline uint64_t NonNegative(int64_t v) { return v > 0 ? static_cast<uint64_t>(v) : 0; }

// product(shape).
inline uint64_t Elements(const TensorSpec& t) {
  uint64_t n = 1;
  for (const int64_t d : t.shape) n = SaturatingMul(n, NonNegative(d));
  return n;
}

// shape[axis], or 0 when the spec has no such dim (invalid: the op fails).
inline uint64_t Dim(const TensorSpec& t, size_t axis) {
  return axis < t.shape.size() ? NonNegative(t.shape[axis]) : 0;
}

// product(shape[:-1]).
inline uint64_t Rows(const TensorSpec& t) {
  uint64_t n = 1;
  for (size_t i = 0; i + 1 < t.shape.size(); ++i) n = SaturatingMul(n, NonNegative(t.shape[i]));
  return n;
}

// A bitmap of S bits per row (the CUDA kernels' duplicate checks).
inline uint64_t BitmapWork(uint64_t rows, int64_t s) {
  return SaturatingMul(rows, NonNegative(s) / 64 + 1);
}

// The duplicate / range check of `rows` rows of n ids in [0, limit), by the
// path the kernels take (kernels::PreferSortingToBitmap, both backends): a
// bitmap of `limit` bits per row, or, for sparse rows, a sort of the ids:
// 16 units per id (the rule's bound: never more than the bitmap it
// replaces) and 64 per row (a row's fixed cost; the GPU sorts a padded tile
// per row). So [192,3] ids with S = 2^31-1 cost ~2e4, not 192 * 2^25.
inline uint64_t RowCheckWork(uint64_t rows, int64_t n, int64_t limit) {
  if (!kernels::PreferSortingToBitmap(n, limit)) return BitmapWork(rows, limit);
  return SaturatingMul(rows, SaturatingAdd(SaturatingMul(16, NonNegative(n)), 64));
}

// Sums product(shape) over the tensors handed to Add, plus scalars.
class WorkSum {
 public:
  void Add(const TensorSpec& t) { total_ = SaturatingAdd(total_, Elements(t)); }
  void Add(const std::optional<TensorSpec>& t) {
    if (t.has_value()) Add(*t);
  }
  template <typename... Ts>
  void AddAll(const Ts&... tensors) {
    (Add(tensors), ...);
  }
  void AddScalar(uint64_t work) { total_ = SaturatingAdd(total_, work); }
  uint64_t total() const { return total_; }

 private:
  uint64_t total_ = 0;
};

// --- bytes moved -------------------------------------------------------------

inline uint64_t OptBytes(const std::optional<kernels::TensorView>& v) {
  return v ? ViewBytes(*v) : 0;
}

// --- checks --------------------------------------------------------------------

// INVALID_ARGUMENT "<field>: <value> is negative".
inline absl::Status CheckNonNegative(int64_t value, absl::string_view field) {
  if (value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", value, " is negative"));
}

// An output the request may not carry (kv outputs without kv inputs, packed
// outputs without `packed`): a buffer or data there is INVALID_ARGUMENT
// "<field>: given, but <why>".
inline absl::Status NotApplicable(const std::optional<TensorSpec>& spec, absl::string_view field,
                                  absl::string_view why) {
  if (!spec.has_value() || spec->source == TensorSpec::Source::kNone) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": given, but ", why));
}

}  // namespace tokensel::core::ops_support

#endif  // TOKENSEL_SERVER_CORE_OPS_OP_SUPPORT_H_
