#include "tests/load/request_checker.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tests/server/integration/client_util.h"

namespace tokensel::load {
namespace {

constexpr int kMaxLogged = 10;  // diagnostics per thread

}  // namespace

void RequestChecker::Attach(uint8_t* shm, uint8_t* mirror, const uint8_t* local, uint64_t size) {
  shm_ = shm;
  mirror_ = mirror;
  local_ = local;
  size_ = size;
  if (allow_exhausted_) before_.assign(size, 0);
}

void RequestChecker::SnapshotIfNeeded() {
  if (!allow_exhausted_) return;
  std::memcpy(before_.data(), shm_, size_);
  have_before_ = true;
}

absl::Status RequestChecker::Counted(absl::string_view method, const absl::Status& status,
                                     const std::string& mismatch) {
  report_.Add("requests");
  report_.Add(absl::StrCat("rpc.", method));
  if (!status.ok()) {
    CountError(status, method);
  } else if (!mismatch.empty()) {
    Mismatch(method, mismatch);
  } else {
    report_.Add("ok");
  }
  return status;
}

bool RequestChecker::Conclude(absl::string_view method, const absl::Status& status,
                              absl::Duration latency, const CaseBuilder& b,
                              const std::vector<const v1::OpResponse*>& results,
                              absl::string_view what) {
  report_.Add("requests");
  report_.Add(absl::StrCat("rpc.", method));
  latencies_[absl::StatusCodeToString(status.code())].push_back(absl::ToInt64Microseconds(latency));
  const bool had_before = std::exchange(have_before_, false);
  if (status.ok()) {
    const std::string why = Check(b, results);
    if (why.empty()) {
      report_.Add("ok");
      return true;
    }
    Mismatch(what, why);
    return false;
  }
  if (status.code() == absl::StatusCode::kResourceExhausted && allow_exhausted_) {
    report_.Add("exhausted");
    report_.Add("err.RESOURCE_EXHAUSTED");
    if (had_before && std::memcmp(before_.data(), shm_, size_) != 0) {
      Mismatch(what, "a refused request changed the region");
    }
    Resync();
    return false;
  }
  CountError(status, what);
  Resync();  // an Execute may have run some ops before failing
  return false;
}

void RequestChecker::CountError(const absl::Status& status, absl::string_view what) {
  report_.Add("errors");
  report_.Add(absl::StrCat("err.", absl::StatusCodeToString(status.code())));
  if (logged_++ < kMaxLogged) {
    std::fprintf(stderr, "load worker %d/%d: %.*s failed: %s\n", getpid(), index_,
                 static_cast<int>(what.size()), what.data(), status.ToString().c_str());
  }
}

void RequestChecker::Mismatch(absl::string_view what, const std::string& why) {
  report_.Add("mismatches");
  if (logged_++ < kMaxLogged) {
    std::fprintf(stderr, "load worker %d/%d: %.*s MISMATCH: %s\n", getpid(), index_,
                 static_cast<int>(what.size()), what.data(), why.c_str());
  }
  Resync();
}

std::string RequestChecker::Check(const CaseBuilder& b,
                                  const std::vector<const v1::OpResponse*>& results) const {
  if (static_cast<int>(results.size()) != b.op_count()) {
    return absl::StrCat(results.size(), " results for ", b.op_count(), " ops");
  }
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i] == nullptr) return absl::StrCat("op ", i, ": no result");
  }
  std::vector<int> expected_per_op(results.size(), 0);
  for (const ExpectedOutput& e : b.expected()) {
    ++expected_per_op[e.op_index];
    const v1::Tensor* t = itest::FindOutput(*results[e.op_index], e.name);
    const std::string where = absl::StrCat("op ", e.op_index, " output \"", e.name, "\"");
    if (t == nullptr) return absl::StrCat(where, " missing");
    if (t->dtype() != itest::ToProto(e.slot.placed.dtype)) return absl::StrCat(where, ": dtype");
    if (!std::equal(t->shape().begin(), t->shape().end(), e.slot.placed.shape.begin(),
                    e.slot.placed.shape.end())) {
      return absl::StrCat(where, ": shape");
    }
    if (t->inline_data() != e.slot.placed.PackedBytes(local_)) {
      return absl::StrCat(where, ": bytes differ from the oracle");
    }
  }
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i]->outputs_size() != expected_per_op[i]) {
      return absl::StrCat("op ", i, ": ", results[i]->outputs_size(), " inline outputs, expected ",
                          expected_per_op[i]);
    }
  }
  const auto [m, s] = std::mismatch(mirror_, mirror_ + size_, shm_);
  if (m != mirror_ + size_) {
    return absl::StrCat("region byte ", m - mirror_, ": oracle ", int{*m}, ", server ", int{*s});
  }
  return "";
}

void RequestChecker::Resync() { std::memcpy(mirror_, shm_, size_); }

}  // namespace tokensel::load
