#include "client/cli/npy.h"

#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/errno_string.h"
#include "common/status_macros.h"

namespace tokensel::cli {
namespace {

using kernels::DType;

static_assert(std::endian::native == std::endian::little,
              "the .npy reader assumes a little-endian host");

constexpr absl::string_view kMagic = "\x93NUMPY";

struct DescrEntry {
  absl::string_view code;  // without the byte-order character
  DType dtype;
};
constexpr DescrEntry kDescrs[] = {
    {"b1", DType::kBool},  {"i1", DType::kInt8},    {"u1", DType::kUInt8},
    {"i2", DType::kInt16}, {"f2", DType::kFloat16}, {"f4", DType::kFloat32},
    {"i4", DType::kInt32}, {"f8", DType::kFloat64}, {"i8", DType::kInt64},
};

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("invalid .npy: ", what));
}

absl::StatusOr<DType> ParseDescr(absl::string_view descr) {
  if (descr.size() == 3) {
    const char order = descr[0];
    const absl::string_view code = descr.substr(1);
    for (const DescrEntry& e : kDescrs) {
      if (code != e.code) continue;
      const bool one_byte = kernels::ElementSize(e.dtype) == 1;
      if (order == '<' || order == '=' || (one_byte && order == '|')) return e.dtype;
      if (order == '>') {
        return Bad(
            absl::StrCat("dtype '", descr,
                         "' is big-endian; convert with arr.astype(arr.dtype.newbyteorder('<'))"));
      }
    }
  }
  return Bad(absl::StrCat("unsupported dtype '", descr,
                          "' (supported: |b1 |i1 |u1 <i2 <f2 <f4 <i4 <f8 <i8)"));
}

// A cursor over the header's Python dict literal, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view text) : text_(text) {}

  void SkipSpace() {
    while (pos_ < text_.size() && absl::ascii_isspace(static_cast<unsigned char>(text_[pos_]))) {
      ++pos_;
    }
  }
  bool Consume(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool ConsumeWord(absl::string_view word) {
    SkipSpace();
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  std::optional<std::string> String() {
    SkipSpace();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) return std::nullopt;
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == absl::string_view::npos) return std::nullopt;
    std::string s(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }
  std::optional<int64_t> Int() {
    SkipSpace();
    size_t end = pos_;
    while (end < text_.size() && absl::ascii_isdigit(static_cast<unsigned char>(text_[end]))) ++end;
    int64_t value = 0;
    if (end == pos_ || !absl::SimpleAtoi(text_.substr(pos_, end - pos_), &value)) {
      return std::nullopt;
    }
    pos_ = end;
    return value;
  }
  // "(2, 3)", "(4,)", "()".
  std::optional<std::vector<int64_t>> Tuple() {
    if (!Consume('(')) return std::nullopt;
    std::vector<int64_t> dims;
    while (!Consume(')')) {
      std::optional<int64_t> d = Int();
      if (!d.has_value()) return std::nullopt;
      dims.push_back(*d);
      if (!Consume(',')) {
        if (!Consume(')')) return std::nullopt;
        break;
      }
    }
    return dims;
  }
  bool AtEnd() {
    SkipSpace();
    return pos_ == text_.size();
  }

 private:
  absl::string_view text_;
  size_t pos_ = 0;
};

struct Header {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
};

absl::StatusOr<Header> ParseHeader(absl::string_view text) {
  HeaderParser p(text);
  if (!p.Consume('{')) return Bad("header is not a dict");
  std::optional<std::string> descr;
  std::optional<bool> fortran;
  std::optional<std::vector<int64_t>> shape;
  while (!p.Consume('}')) {
    std::optional<std::string> key = p.String();
    if (!key.has_value() || !p.Consume(':')) return Bad("malformed header dict");
    if (*key == "descr") {
      descr = p.String();
      if (!descr.has_value()) {
        return Bad("'descr' is not a plain string (structured dtypes are not supported)");
      }
    } else if (*key == "fortran_order") {
      if (p.ConsumeWord("True")) {
        fortran = true;
      } else if (p.ConsumeWord("False")) {
        fortran = false;
      } else {
        return Bad("'fortran_order' is not True or False");
      }
    } else if (*key == "shape") {
      shape = p.Tuple();
      if (!shape.has_value()) return Bad("'shape' is not a tuple of non-negative ints");
    } else {
      return Bad(absl::StrCat("unexpected header key '", *key, "'"));
    }
    if (!p.Consume(',')) {
      if (!p.Consume('}')) return Bad("malformed header dict");
      break;
    }
  }
  if (!p.AtEnd()) return Bad("trailing characters after the header dict");
  if (!descr.has_value() || !fortran.has_value() || !shape.has_value()) {
    return Bad("header lacks 'descr', 'fortran_order' or 'shape'");
  }
  if (*fortran) {
    return Bad("Fortran-order arrays are not supported; save np.ascontiguousarray(arr)");
  }
  ASSIGN_OR_RETURN(DType dtype, ParseDescr(*descr));
  return Header{dtype, *std::move(shape)};
}

uint32_t LoadLe(absl::string_view bytes) {
  uint32_t v = 0;
  for (size_t i = bytes.size(); i-- > 0;) v = (v << 8) | static_cast<unsigned char>(bytes[i]);
  return v;
}

}  // namespace

int64_t NpyArray::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::string> NpyDescr(DType dtype) {
  for (const DescrEntry& e : kDescrs) {
    if (e.dtype == dtype) {
      return absl::StrCat(kernels::ElementSize(dtype) == 1 ? "|" : "<", e.code);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype ", kernels::DTypeName(dtype), " has no numpy equivalent"));
}

absl::StatusOr<NpyArray> ParseNpy(absl::string_view file) {
  if (file.size() < 10 || file.substr(0, kMagic.size()) != kMagic) {
    return Bad("missing the \\x93NUMPY magic");
  }
  const int major = static_cast<unsigned char>(file[6]);
  size_t header_len_size = 0;
  if (major == 1) {
    header_len_size = 2;
  } else if (major == 2 || major == 3) {
    header_len_size = 4;
  } else {
    return Bad(absl::StrCat("unsupported format version ", major));
  }
  const size_t prefix = 8 + header_len_size;
  if (file.size() < prefix) return Bad("truncated header length");
  const uint64_t header_len = LoadLe(file.substr(8, header_len_size));
  if (header_len > file.size() - prefix) return Bad("truncated header");
  ASSIGN_OR_RETURN(Header header, ParseHeader(file.substr(prefix, header_len)));

  NpyArray array;
  array.dtype = header.dtype;
  array.shape = std::move(header.shape);
  const int64_t esize = kernels::ElementSize(array.dtype);
  int64_t bytes = esize;
  for (int64_t d : array.shape) {
    if (d != 0 && bytes > std::numeric_limits<int64_t>::max() / d) {
      return Bad("shape overflows int64 bytes");
    }
    bytes *= d;
  }
  const absl::string_view data = file.substr(prefix + header_len);
  if (static_cast<uint64_t>(bytes) != data.size()) {
    return Bad(absl::StrCat("shape (", absl::StrJoin(array.shape, ","), ") of ",
                            kernels::DTypeName(array.dtype), " needs ", bytes,
                            " data bytes, the file has ", data.size()));
  }
  array.data = std::string(data);
  return array;
}

absl::StatusOr<std::string> SerializeNpy(const NpyArray& array) {
  ASSIGN_OR_RETURN(std::string descr, NpyDescr(array.dtype));
  if (static_cast<uint64_t>(array.NumElements() * kernels::ElementSize(array.dtype)) !=
      array.data.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "array data has ", array.data.size(), " bytes, shape (", absl::StrJoin(array.shape, ","),
        ") needs ", array.NumElements() * kernels::ElementSize(array.dtype)));
  }
  std::string shape = absl::StrJoin(array.shape, ", ");
  if (array.shape.size() == 1) shape += ",";
  std::string dict =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", shape, "), }");
  const bool v1 = dict.size() + 1 + 10 <= 65535;
  const size_t prefix = v1 ? 10 : 12;
  const size_t unpadded = prefix + dict.size() + 1;  // + '\n'
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  std::string out(kMagic);
  out.push_back(static_cast<char>(v1 ? 1 : 2));
  out.push_back(0);
  const uint64_t len = dict.size();
  for (size_t i = 0; i < prefix - 8; ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  out += dict;
  out += array.data;
  return out;
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const std::string reason = ErrnoString(errno);
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": ", reason));
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", reason));
  }
  std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  absl::StatusOr<NpyArray> array = ParseNpy(file);
  if (!array.ok()) {
    return absl::Status(array.status().code(), absl::StrCat(path, ": ", array.status().message()));
  }
  return array;
}

absl::Status WriteNpy(const std::string& path, const NpyArray& array) {
  ASSIGN_OR_RETURN(std::string bytes, SerializeNpy(array));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InvalidArgumentError(absl::StrCat(path, ": ", ErrnoString(errno)));
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace tokensel::cli
