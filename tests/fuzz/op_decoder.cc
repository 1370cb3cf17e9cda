#include "tests/fuzz/op_decoder.h"

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <limits>
#include <string>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "kernels/dtype.h"
#include "server/grpc/convert.h"

namespace tokensel::fuzz {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

constexpr int kMaxRank = 5;
constexpr uint64_t kMaxInlineBytes = 4096;

// Element size of a proto dtype number; 0 for unspecified or unknown. Uses
// the server's own conversion, so the decoder and the server cannot disagree.
uint64_t ProtoElementSize(int dtype) {
  auto parsed = server::DTypeFromProto(dtype, "dtype");
  if (!parsed.ok() || !parsed->has_value()) return 0;
  return static_cast<uint64_t>(kernels::ElementSize(**parsed));
}

int PickDType(FuzzedDataProvider& fdp) {
  // Mostly the index and score types, every valid number, sometimes invalid.
  switch (fdp.ConsumeIntegralInRange(0, 7)) {
    case 0:
      return fdp.ConsumeIntegralInRange(0, 14);
    case 1:
      return fdp.ConsumeIntegral<int32_t>();
    case 2:
    case 3:
      return v1::DTYPE_INT32;
    case 4:
      return v1::DTYPE_INT64;
    default:
      return fdp.ConsumeIntegralInRange(1, 12);
  }
}

int64_t PickDim(FuzzedDataProvider& fdp) {
  switch (fdp.ConsumeIntegralInRange(0, 15)) {
    case 0:
      return -1;
    case 1:
      return fdp.ConsumeIntegral<int64_t>();
    case 2:
      return 0;
    default:
      return fdp.ConsumeIntegralInRange<int64_t>(1, 8);
  }
}

int64_t PickStride(FuzzedDataProvider& fdp) {
  switch (fdp.ConsumeIntegralInRange(0, 15)) {
    case 0:
      return -1;
    case 1:
      return fdp.ConsumeIntegral<int64_t>();
    case 2:
      return 0;
    default:
      return fdp.ConsumeIntegralInRange<int64_t>(1, 64);
  }
}

uint64_t PickOffset(FuzzedDataProvider& fdp) {
  switch (fdp.ConsumeIntegralInRange(0, 15)) {
    case 0:
      return fdp.ConsumeIntegral<uint64_t>();
    case 1:
      return std::numeric_limits<uint64_t>::max() - fdp.ConsumeIntegralInRange<uint64_t>(0, 64);
    default:
      return fdp.ConsumeIntegralInRange<uint64_t>(0, 8200);
  }
}

int64_t PickScalar(FuzzedDataProvider& fdp) {
  switch (fdp.ConsumeIntegralInRange(0, 15)) {
    case 0:
      return fdp.ConsumeIntegral<int64_t>();
    case 1:
      return -1;
    default:
      return fdp.ConsumeIntegralInRange<int64_t>(0, 12);
  }
}

// Saturating product of the dims; UINT64_MAX when any is negative.
uint64_t ShapeElements(const v1::Tensor& t) {
  uint64_t n = 1;
  for (int64_t d : t.shape()) {
    if (d < 0) return std::numeric_limits<uint64_t>::max();
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) {
      return std::numeric_limits<uint64_t>::max();
    }
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

void FillTensor(FuzzedDataProvider& fdp, v1::Tensor* t) {
  t->set_dtype(static_cast<v1::DType>(PickDType(fdp)));
  const int rank = fdp.ConsumeIntegralInRange(0, kMaxRank);
  for (int i = 0; i < rank; ++i) t->add_shape(PickDim(fdp));
  if (fdp.ConsumeIntegralInRange(0, 3) == 0) {
    int strides = rank;
    if (fdp.ConsumeIntegralInRange(0, 7) == 0)
      strides = fdp.ConsumeIntegralInRange(0, kMaxRank + 1);
    for (int i = 0; i < strides; ++i) t->add_strides(PickStride(fdp));
  }
  switch (fdp.ConsumeIntegralInRange(0, 2)) {
    case 0:  // no data: an inline output, or a missing input
      break;
    case 1: {
      v1::BufferSlice* slice = t->mutable_buffer();
      slice->set_buffer(
          kBufferNames[fdp.ConsumeIntegralInRange<size_t>(0, std::size(kBufferNames) - 1)]);
      slice->set_byte_offset(PickOffset(fdp));
      break;
    }
    default: {
      const uint64_t elements = ShapeElements(*t);
      const uint64_t element_size = ProtoElementSize(t->dtype());
      uint64_t length = 0;
      if (element_size != 0 && elements <= kMaxInlineBytes / element_size) {
        length = elements * element_size;
        if (fdp.ConsumeIntegralInRange(0, 15) == 0) length += 1;
        if (length > 0 && fdp.ConsumeIntegralInRange(0, 15) == 0) length -= 1;
      } else {
        length = fdp.ConsumeIntegralInRange<uint64_t>(0, 64);
      }
      t->set_inline_data(fdp.ConsumeBytesAsString(static_cast<size_t>(length)));
      break;
    }
  }
}

void FillRequest(FuzzedDataProvider& fdp, Message* request) {
  const google::protobuf::Descriptor* desc = request->GetDescriptor();
  const google::protobuf::Reflection* refl = request->GetReflection();
  for (int i = 0; i < desc->field_count(); ++i) {
    const FieldDescriptor* f = desc->field(i);
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE:
        // Tensors: absent about a third of the time.
        if (fdp.ConsumeIntegralInRange(0, 2) != 0) {
          FillTensor(fdp, static_cast<v1::Tensor*>(refl->MutableMessage(request, f)));
        }
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        refl->SetInt64(request, f, PickScalar(fdp));
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        refl->SetUInt64(request, f,
                        fdp.ConsumeBool() ? fdp.ConsumeIntegral<uint64_t>()
                                          : fdp.ConsumeIntegralInRange<uint64_t>(0, 16));
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        // `optional bool batch_first`: absent, true or false.
        if (fdp.ConsumeIntegralInRange(0, 2) != 0) refl->SetBool(request, f, fdp.ConsumeBool());
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        refl->SetEnumValue(request, f, fdp.ConsumeIntegralInRange(-1, 3));
        break;
      default:
        break;
    }
  }
}

}  // namespace

bool DecodeOp(const uint8_t* data, size_t size, v1::Op* op) {
  if (size == 0) return false;
  if (data[0] % 2 == 0) return op->ParseFromArray(data + 1, static_cast<int>(size - 1));
  FuzzedDataProvider fdp(data + 1, size - 1);
  const google::protobuf::OneofDescriptor* oneof = v1::Op::descriptor()->oneof_decl(0);
  // One extra choice leaves the oneof unset.
  const int choice = fdp.ConsumeIntegralInRange(0, oneof->field_count());
  if (choice == oneof->field_count()) return true;
  FillRequest(fdp, op->GetReflection()->MutableMessage(op, oneof->field(choice)));
  return true;
}

}  // namespace tokensel::fuzz
