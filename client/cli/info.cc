// `tokensel info`: GetServerInfo (no session needed).
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "client/cli/json.h"

ABSL_FLAG(bool, json, false, "print JSON (info, health, buffers, bench)");

namespace tokensel::cli {
namespace {

void PrintText(const client::v1::ServerInfo& info) {
  std::printf("version:       %s\n", info.version().c_str());
  std::printf("backend:       %s\n", info.backend().c_str());
  std::printf("memory_kinds:  %s\n", absl::StrJoin(info.memory_kinds(), ", ").c_str());
  std::printf("shm_prefix:    %s\n", info.shm_prefix().c_str());
  const auto& l = info.limits();
  std::printf(
      "limits:        max_message_bytes=%llu max_buffers_per_session=%u max_inflight=%u "
      "session_ttl_ms=%llu max_rank=%u\n",
      static_cast<unsigned long long>(l.max_message_bytes()), l.max_buffers_per_session(),
      l.max_inflight(), static_cast<unsigned long long>(l.session_ttl_ms()), l.max_rank());
  std::printf("devices:       %d\n", info.devices_size());
  for (const auto& d : info.devices()) {
    std::printf("  [%d] %s %s sm_%d %.1f GiB\n", d.ordinal(), d.name().c_str(), d.uuid().c_str(),
                d.compute_capability(),
                static_cast<double>(d.total_memory_bytes()) / (1024.0 * 1024 * 1024));
  }
}

int RunInfo() {
  absl::StatusOr<client::Client> client = ConnectFromFlags();
  if (!client.ok()) return Fail("info", client.status());
  absl::StatusOr<client::v1::ServerInfo> info = client->GetServerInfo();
  if (!info.ok()) return Fail("info", info.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", ProtoToJson(*info).c_str());
  } else {
    PrintText(*info);
  }
  return kExitOk;
}

}  // namespace

const Command kInfoCommand = {
    "info", "server version, backend, devices and limits (GetServerInfo)",
    "Prints what GetServerInfo returns: version, backend (cpu|cuda), memory kinds,\n"
    "the shm name prefix, limits and GPUs. --json prints the ServerInfo message.",
    ConnectionFlags({"json"}), &RunInfo};

}  // namespace tokensel::cli
