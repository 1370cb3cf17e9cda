#include "kernels/stop.h"

namespace tokensel::kernels {
namespace {

thread_local const StopToken* current_token = nullptr;

}  // namespace

ScopedStopToken::ScopedStopToken(const StopToken* token) : previous_(current_token) {
  current_token = token;
}

ScopedStopToken::~ScopedStopToken() { current_token = previous_; }

const StopToken* CurrentStopToken() { return current_token; }

absl::Status CheckStop() {
  const StopToken* token = current_token;
  return token == nullptr ? absl::OkStatus() : token->Check();
}

}  // namespace tokensel::kernels
