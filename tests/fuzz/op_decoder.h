// Turns fuzzer bytes into a tokensel.v1.Op, for op_fuzzer.cc.
//
// Two encodings, chosen by the first byte:
//  - even: the rest is a serialized tokensel.v1.Op (what a client sends; the
//    seed corpus from tests/fuzz/make_seeds.cc uses this form);
//  - odd: a structured decoder (FuzzedDataProvider) picks the op, and for
//    each tensor field whether it is absent, an inline output, a buffer slice
//    or inline data, then dtype (including invalid numbers), rank, shape,
//    strides, byte offsets, and the data bytes themselves (indices, segment
//    ids, scores); scalars mostly small, sometimes extreme.
// Returns false when the bytes do not decode (not an error: skip the input).
#ifndef TOKENSEL_TESTS_FUZZ_OP_DECODER_H_
#define TOKENSEL_TESTS_FUZZ_OP_DECODER_H_

#include <cstddef>
#include <cstdint>

#include "tokensel/v1/tokensel.pb.h"

namespace tokensel::fuzz {

// Buffers the fuzz environment registers in session kSession, and one that
// only kOtherSession owns (PERMISSION_DENIED), plus a name nobody has.
inline constexpr char kSession[] = "fuzz-session";
inline constexpr char kOtherSession[] = "other-session";
inline constexpr const char* kBufferNames[] = {"big", "small", "tiny", "others", "missing"};
inline constexpr uint64_t kBufferSizes[] = {8192, 256, 3};
inline constexpr uint64_t kOthersSize = 64;

bool DecodeOp(const uint8_t* data, size_t size, v1::Op* op);

}  // namespace tokensel::fuzz

#endif  // TOKENSEL_TESTS_FUZZ_OP_DECODER_H_
