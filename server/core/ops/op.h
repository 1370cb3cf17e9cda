// The contract of an operator's home in the server core.
//
// Each operator Foo lives in server/core/ops/foo.{h,cc}, which holds all the
// server core knows about it:
//
//   struct FooRequest { ...; using Op = FooOp; };  // what a client asked for
//   struct FooOp {
//     using Request = FooRequest;
//     using Args = kernels::FooArgs;                // what the backend runs
//     static constexpr absl::string_view kName = "Foo";  // API name, `op` label
//     // Work estimate in elements from metadata alone (see EstimateOpWork in
//     // request.h): saturating, never fails, safe on invalid requests.
//     static uint64_t EstimateWork(const FooRequest& req);
//     // Resolves every tensor of `req` (inputs, then outputs in the order
//     // they are returned inline) through `r` into kernel arguments; output
//     // shapes for inline outputs are derived here. Errors name the field.
//     static absl::StatusOr<kernels::FooArgs> Resolve(Resolver& r, const FooRequest& req);
//     // Logical bytes read + written by a run of `args` (metrics).
//     static uint64_t BytesMoved(const kernels::FooArgs& args);
//   };
//
// The executor, the work estimate and the op name are generic loops over
// OpRequest (request.h), which lists every FooRequest. The backends run
// Args through Backend::RunOp / OpScratchBytes (core::OpArgs, derived from
// OpRequest). docs/development.md,
// "How to add an operator", has the whole recipe.
#ifndef TOKENSEL_SERVER_CORE_OPS_OP_H_
#define TOKENSEL_SERVER_CORE_OPS_OP_H_

#include <concepts>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tokensel::core {

class Resolver;

template <typename T>
concept Operator = requires(const typename T::Request& req, const typename T::Args& args,
                            Resolver& r) {
  { T::kName } -> std::convertible_to<absl::string_view>;
  { T::EstimateWork(req) } -> std::same_as<uint64_t>;
  { T::Resolve(r, req) } -> std::same_as<absl::StatusOr<typename T::Args>>;
  { T::BytesMoved(args) } -> std::same_as<uint64_t>;
  requires std::same_as<typename T::Request::Op, T>;
};

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_OPS_OP_H_
