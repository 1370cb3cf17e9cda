// ClientEventError: how a device backend answers a failed call on a
// CLIENT's CUDA IPC event (cudaIpcOpenEventHandle, cudaStreamWaitEvent,
// cudaEventRecord of the client's event).
//
// Why not from the returned code alone: the client owns the event. A
// client that destroyed it, or whose process exited, decides what those
// calls answer, and some of those answers (cudaErrorUnknown, for one) are
// in the list of sticky errors that mark a device failed for good: one
// client could take the device out of service for every other client.
// So:
//   - a code in the client-fault list (a handle or event the driver does
//     not accept) is INVALID_ARGUMENT naming the field, the device
//     untouched;
//   - any other code is confirmed by `probe`, a call on a SERVER-owned
//     object made right after (the CUDA backend: a private event created
//     and queried); the probe marks the device failed if IT reports a
//     sticky error, and then its status (UNAVAILABLE / INTERNAL, the device
//     out of service) is the answer;
//   - the probe OK: the device works; the request fails alone, with
//     FAILED_PRECONDITION naming the field (the client's event is not
//     usable: destroyed, or of a process that went away).
// Pure logic (the CUDA calls are the caller's), so it is tested without a
// device (stream_chain_errors_test.cc, through FakeStreamDevice).
#ifndef TOKENSEL_SERVER_BACKENDS_CLIENT_EVENT_ERROR_H_
#define TOKENSEL_SERVER_BACKENDS_CLIENT_EVENT_ERROR_H_

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tokensel::backends {

// `call` failed on the client's event named `field` with `error` (the
// driver's name and text of the code); `client_code`: the code is in the
// client-fault list. `probe` runs only when needed.
absl::Status ClientEventError(absl::string_view field, absl::string_view call,
                              absl::string_view error, bool client_code,
                              absl::FunctionRef<absl::Status()> probe);

}  // namespace tokensel::backends

#endif  // TOKENSEL_SERVER_BACKENDS_CLIENT_EVENT_ERROR_H_
