// HttpGet: a minimal blocking HTTP/1.0 GET to 127.0.0.1, for reading the
// Prometheus /metrics page in integration tests. Loopback only, by design.
//
//   absl::StatusOr<HttpResponse> r = HttpGet(port, "/metrics", absl::Seconds(5));
//   // r->status_code == 200, r->body = the exposition text
//
// MetricValue() reads one sample from the Prometheus text format.
#ifndef TOKENSEL_TESTS_TESTING_HTTP_GET_H_
#define TOKENSEL_TESTS_TESTING_HTTP_GET_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tokensel::testing {

struct HttpResponse {
  int status_code = 0;
  std::string headers;
  std::string body;
};

inline absl::StatusOr<HttpResponse> HttpGet(int port, absl::string_view path,
                                            absl::Duration timeout = absl::Seconds(5)) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  const timeval tv = absl::ToTimeval(timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("connect 127.0.0.1:", port, ": ", std::strerror(errno)));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1:", port, "\r\n\r\n");
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::InternalError(absl::StrCat("send: ", std::strerror(errno)));
    sent += static_cast<size_t>(n);
  }
  // HTTP/1.0: the server closes the connection after the response.
  std::string raw;
  char buf[8192];
  constexpr size_t kMaxResponse = 64 << 20;
  while (raw.size() < kMaxResponse) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::DeadlineExceededError(absl::StrCat("recv: ", std::strerror(errno)));
    if (n == 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    return absl::InternalError(absl::StrCat("malformed HTTP response: ", raw.substr(0, 200)));
  }
  HttpResponse response;
  response.headers = raw.substr(0, head_end);
  response.body = raw.substr(head_end + 4);
  // "HTTP/1.x 200 OK"
  std::vector<absl::string_view> status_line =
      absl::StrSplit(absl::string_view(response.headers).substr(0, response.headers.find('\r')),
                     ' ', absl::SkipEmpty());
  if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &response.status_code)) {
    return absl::InternalError(absl::StrCat("malformed status line: ", response.headers));
  }
  return response;
}

// The value of the sample whose name-and-labels part is exactly `series`
// (e.g. `tokensel_sessions` or `tokensel_requests_total{code="OK",method="Ping"}`,
// labels in the order the exporter prints them). nullopt if absent.
inline std::optional<double> MetricValue(absl::string_view text, absl::string_view series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    if (!absl::StartsWith(line, series) || line.size() <= series.size() ||
        line[series.size()] != ' ') {
      continue;
    }
    absl::string_view value = line.substr(series.size() + 1);
    value = value.substr(0, value.find(' '));  // drop an optional timestamp
    double v = 0;
    if (absl::SimpleAtod(value, &v)) return v;
  }
  return std::nullopt;
}

// The sum over every sample of metric `name` whose labels contain all of
// `label_substrings` (each e.g. `op="GatherTokens"`). 0 if none.
inline double MetricSum(absl::string_view text, absl::string_view name,
                        std::initializer_list<absl::string_view> label_substrings = {}) {
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#' || !absl::StartsWith(line, name)) continue;
    absl::string_view rest = line.substr(name.size());
    if (rest.empty() || (rest[0] != '{' && rest[0] != ' ')) continue;  // a longer name
    const size_t close = rest.rfind('}');
    const size_t space = close == absl::string_view::npos ? rest.find(' ') : rest.find(' ', close);
    if (space == absl::string_view::npos) continue;
    absl::string_view labels = rest.substr(0, space);
    bool match = true;
    for (absl::string_view want : label_substrings) match &= absl::StrContains(labels, want);
    if (!match) continue;
    absl::string_view value = rest.substr(space + 1);
    value = value.substr(0, value.find(' '));
    double v = 0;
    if (absl::SimpleAtod(value, &v)) sum += v;
  }
  return sum;
}

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_TESTING_HTTP_GET_H_
