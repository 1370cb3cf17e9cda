// `tokensel buffers`: ListBuffers of a session.
#include <cstdio>
#include <memory>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "client/cli/json.h"

ABSL_DECLARE_FLAG(bool, json);

namespace tokensel::cli {
namespace {

int RunBuffers() {
  absl::StatusOr<client::Client> client = ConnectFromFlags();
  if (!client.ok()) return Fail("buffers", client.status());
  // With --session, list that session's buffers; else a fresh session's
  // (always empty: a session sees only its own buffers).
  std::unique_ptr<client::Session> session;
  client::Client bound = *client;
  if (const std::string id = SessionFlag(); !id.empty()) {
    bound = client->WithSession(id);
  } else {
    absl::StatusOr<std::unique_ptr<client::Session>> opened =
        OpenSession(*client, "tokensel-cli-buffers");
    if (!opened.ok()) return Fail("buffers", opened.status());
    session = *std::move(opened);
    bound = session->client();
  }
  absl::StatusOr<client::v1::ListBuffersResponse> list = bound.ListBuffers();
  if (!list.ok()) return Fail("buffers", list.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", ProtoToJson(*list).c_str());
    return kExitOk;
  }
  if (session != nullptr) {
    std::printf("(a new session: it owns no buffers; pass --session=<id> to list a worker's)\n");
  }
  std::printf("%-32s %-9s %14s  %s\n", "name", "kind", "bytes", "device");
  for (const auto& b : list->buffers()) {
    std::printf("%-32s %-9s %14llu  %s\n", b.name().c_str(), b.kind().c_str(),
                static_cast<unsigned long long>(b.size()), b.device_uuid().c_str());
  }
  std::printf("%d buffer(s)\n", list->buffers_size());
  return kExitOk;
}

}  // namespace

const Command kBuffersCommand = {
    "buffers", "the buffers a session registered (ListBuffers)",
    "Lists the buffers of session --session (name, kind, bytes, device). A session\n"
    "sees only its own buffers, so without --session a fresh session lists none.",
    ConnectionFlags({"json", "session"}), &RunBuffers};

}  // namespace tokensel::cli
