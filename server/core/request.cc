#include "server/core/request.h"

#include <variant>

namespace tokensel::core {
namespace {

struct OpNameVisitor {
  absl::string_view operator()(const SortTokensRequest&) const { return "SortTokens"; }
  absl::string_view operator()(const GatherTokensRequest&) const { return "GatherTokens"; }
  absl::string_view operator()(const ScatterTokensRequest&) const { return "ScatterTokens"; }
  absl::string_view operator()(const GatherBertMaskRequest&) const { return "GatherBertMask"; }
  absl::string_view operator()(const SliceGptMaskRequest&) const { return "SliceGptMask"; }
  absl::string_view operator()(const SegmentSeqlensRequest&) const { return "SegmentSeqlens"; }
  absl::string_view operator()(const SampleTokensRequest&) const { return "SampleTokens"; }
  absl::string_view operator()(const TopKTokensRequest&) const { return "TopKTokens"; }
};

}  // namespace

absl::string_view OpName(const OpRequest& op) { return std::visit(OpNameVisitor{}, op); }

}  // namespace tokensel::core
