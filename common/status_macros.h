// Status propagation macros that abseil 20220623 does not ship.
//
//   RETURN_IF_ERROR(expr);               // expr is an absl::Status
//   ASSIGN_OR_RETURN(auto v, expr);      // expr is an absl::StatusOr<T>
//
// Both evaluate `expr` exactly once and return the error unchanged.
#ifndef TOKENSEL_COMMON_STATUS_MACROS_H_
#define TOKENSEL_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TOKENSEL_CONCAT_INNER_(a, b) a##b
#define TOKENSEL_CONCAT_(a, b) TOKENSEL_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                            \
  do {                                                   \
    ::absl::Status tokensel_status_ = (expr);            \
    if (!tokensel_status_.ok()) return tokensel_status_; \
  } while (false)

// `lhs` may be a declaration ("auto x") and `tmp` is one: neither can take
// the parentheses bugprone-macro-parentheses asks for.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define TOKENSEL_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  if (!tmp.ok()) return std::move(tmp).status();        \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  TOKENSEL_ASSIGN_OR_RETURN_IMPL_(TOKENSEL_CONCAT_(tokensel_statusor_, __LINE__), lhs, expr)
// NOLINTEND(bugprone-macro-parentheses)

#endif  // TOKENSEL_COMMON_STATUS_MACROS_H_
