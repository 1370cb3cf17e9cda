#include "kernels/stop.h"

namespace tokensel::kernels {
namespace stop_internal {
namespace {

thread_local StopScope* current_scope = nullptr;

}  // namespace

StopScope* CurrentStopScope() { return current_scope; }

StopScope* SwapStopScope(StopScope* scope) {
  StopScope* previous = current_scope;
  current_scope = scope;
  return previous;
}

void LatchStop(StopScope* scope, const absl::Status& status) {
  if (scope != nullptr && scope->stopped.ok()) scope->stopped = status;
}

absl::Status CheckStopIn(StopScope* scope) {
  if (scope == nullptr) return absl::OkStatus();
  if (!scope->stopped.ok()) return scope->stopped;
  if (scope->token == nullptr) return absl::OkStatus();
  absl::Status status = scope->token->Check();
  if (!status.ok()) scope->stopped = status;
  return status;
}

}  // namespace stop_internal

ScopedStopToken::ScopedStopToken(const StopToken* token)
    : scope_{token, absl::OkStatus()}, previous_(stop_internal::SwapStopScope(&scope_)) {}

ScopedStopToken::~ScopedStopToken() { stop_internal::SwapStopScope(previous_); }

}  // namespace tokensel::kernels
