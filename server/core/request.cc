#include "server/core/request.h"

#include <type_traits>
#include <variant>

namespace tokensel::core {
namespace {

template <typename Variant>
struct NamesOf;

template <typename... Requests>
struct NamesOf<std::variant<Requests...>> {
  static std::vector<absl::string_view> Get() { return {Requests::Op::kName...}; }
};

}  // namespace

absl::string_view OpName(const OpRequest& op) {
  return std::visit([](const auto& req) { return std::decay_t<decltype(req)>::Op::kName; }, op);
}

std::vector<absl::string_view> AllOpNames() { return NamesOf<OpRequest>::Get(); }

uint64_t EstimateOpWork(const OpRequest& op) {
  return std::visit(
      [](const auto& req) { return std::decay_t<decltype(req)>::Op::EstimateWork(req); }, op);
}

}  // namespace tokensel::core
