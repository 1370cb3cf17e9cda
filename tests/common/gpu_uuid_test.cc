#include "common/gpu_uuid.h"

#include "gtest/gtest.h"

namespace tokensel {
namespace {

TEST(FormatGpuUuidTest, SpellsLikeNvidiaSmi) {
  const char bytes[16] = {'\x01', '\x23', '\x45', '\x67', '\x89', '\xab', '\xcd', '\xef',
                          '\x00', '\x10', '\xfe', '\xdc', '\xba', '\x98', '\x76', '\x54'};
  EXPECT_EQ(FormatGpuUuid(bytes), "GPU-01234567-89ab-cdef-0010-fedcba987654");
}

}  // namespace
}  // namespace tokensel
