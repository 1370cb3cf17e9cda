// ClientEventError (contract: client_event_error.h).
#include "server/backends/client_event_error.h"

#include "absl/strings/str_cat.h"

namespace tokensel::backends {

absl::Status ClientEventError(absl::string_view field, absl::string_view call,
                              absl::string_view error, bool client_code,
                              absl::FunctionRef<absl::Status()> probe) {
  if (client_code) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", call, " refused the client's event (", error,
        "); create it with cudaEventInterprocess | cudaEventDisableTiming on the device of the "
        "request's buffers"));
  }
  // Not the device's fault unless a call on the server's own object says
  // so (the probe notes a sticky error itself).
  if (absl::Status device = probe(); !device.ok()) return device;
  return absl::FailedPreconditionError(absl::StrCat(
      field, ": ", call, " failed on the client's event (", error,
      "); the device is fine: the event must stay alive (not destroyed, its process not gone) "
      "until the session ends"));
}

}  // namespace tokensel::backends
