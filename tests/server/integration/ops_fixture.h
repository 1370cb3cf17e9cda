// The fixture of the operator suites through a real tokensel-server
// (ops_test.cc, merge_split_test.cc): by reference in the registered arena
// (unix socket only) and inline (unix socket and loopback TCP), compared
// byte for byte with an oracle run on copies in this process.
#ifndef TOKENSEL_TESTS_SERVER_INTEGRATION_OPS_FIXTURE_H_
#define TOKENSEL_TESTS_SERVER_INTEGRATION_OPS_FIXTURE_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/server/integration/fixture.h"

namespace tokensel::itest {

using ::testing::ElementsAreArray;
using Stub = v1::TokenSelect::Stub;

class OpsTest : public ServerFixture, public ::testing::WithParamInterface<Transport> {
 protected:
  void SetUp() override { StartServer({}, GetParam()); }

  std::vector<uint8_t> Snapshot() const {
    return std::vector<uint8_t>(shm_.data(), shm_.data() + shm_.size());
  }
  // Whole-region comparison with the oracle; names the first differing byte.
  void ExpectShmEquals(const std::vector<uint8_t>& oracle) const {
    const auto [a, b] = std::mismatch(oracle.begin(), oracle.end(), shm_.data());
    EXPECT_EQ(a, oracle.end()) << "first difference at byte " << (a - oracle.begin()) << ": oracle "
                               << int{*a} << ", server wrote " << int{*b};
  }
  // An inline output equals the oracle's tensor (dtype, shape, packed bytes).
  static void ExpectInline(const v1::OpResponse& resp, const std::string& name, const Placed& want,
                           const std::vector<uint8_t>& oracle) {
    const v1::Tensor* t = FindOutput(resp, name);
    ASSERT_NE(t, nullptr) << "no inline output named " << name;
    EXPECT_EQ(t->dtype(), ToProto(want.dtype)) << name;
    EXPECT_THAT(t->shape(), ElementsAreArray(want.shape)) << name;
    EXPECT_TRUE(t->inline_data() == want.PackedBytes(oracle.data())) << name << " differs";
  }

  // Local memory for inline tests: inputs are packed from it, the oracle
  // runs on it.
  std::vector<uint8_t> Local(uint64_t size = 1 << 20) {
    std::vector<uint8_t> local(size);
    FillBytes(local.data(), local.size(), rng_);
    return local;
  }
  v1::Tensor Inline(const Placed& p, const std::vector<uint8_t>& local) const {
    return InlineTensor(p.dtype, p.shape, p.PackedBytes(local.data()));
  }
};

// Tests that use the registered arena: unix socket only.
class OpsByReferenceTest : public OpsTest {};

}  // namespace tokensel::itest

#endif  // TOKENSEL_TESTS_SERVER_INTEGRATION_OPS_FIXTURE_H_
