// JSON output of the CLI: protobuf messages (field names as in the .proto,
// defaults printed) and a string escaper for hand-built objects.
#ifndef TOKENSEL_CLIENT_CLI_JSON_H_
#define TOKENSEL_CLIENT_CLI_JSON_H_

#include <string>

#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace tokensel::cli {

// One line of JSON; proto field names, every field printed, enums by name.
std::string ProtoToJson(const google::protobuf::Message& message);

// `s` as a quoted JSON string ("a\"b" -> "\"a\\\"b\"").
std::string JsonString(absl::string_view s);

}  // namespace tokensel::cli

#endif  // TOKENSEL_CLIENT_CLI_JSON_H_
