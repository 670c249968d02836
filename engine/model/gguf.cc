#include "engine/model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace moebatch {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr int kMaxArrayDepth = 8;
constexpr int kMaxDims = 4;

// Bytes of one scalar of `type` in the file; 0 for string and array.
size_t ScalarSize(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      break;
  }
  return 0;
}

bool KnownValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kFloat64); }

// A bounds-checked little-endian reader over the file image; errors name the file, what was being
// read and the byte offset.
class Cursor {
 public:
  Cursor(const std::byte* bytes, size_t size, const std::string& path)
      : bytes_(bytes), size_(size), path_(path) {}

  size_t offset() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  absl::Status Need(size_t n, std::string_view what) const {
    if (n <= left()) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat(path_, ": GGUF: the file ends inside ",
                                            std::string(what), " (byte ", pos_, ": ", n,
                                            " bytes needed, ", left(), " left; truncated?)"));
  }
  template <typename T>
  absl::StatusOr<T> Read(std::string_view what) {
    if (absl::Status s = Need(sizeof(T), what); !s.ok()) return s;
    T v;
    std::memcpy(&v, bytes_ + pos_, sizeof(T));  // x86-64 and aarch64 Linux: little-endian
    pos_ += sizeof(T);
    return v;
  }
  absl::StatusOr<std::string> ReadString(std::string_view what) {
    absl::StatusOr<uint64_t> n = Read<uint64_t>(what);
    if (!n.ok()) return n.status();
    if (absl::Status s = Need(*n, what); !s.ok()) return s;
    std::string out(reinterpret_cast<const char*>(bytes_ + pos_), *n);
    pos_ += *n;
    return out;
  }

 private:
  const std::byte* bytes_;
  size_t size_;
  const std::string& path_;
  size_t pos_ = 0;
};

absl::Status ReadValue(Cursor& in, GgufValueType type, int depth, const std::string& key,
                       const std::string& path, GgufValue* out) {
  out->type = type;
  const std::string what = absl::StrCat("the value of \"", key, "\"");
  switch (type) {
    case GgufValueType::kUint8: {
      auto v = in.Read<uint8_t>(what);
      if (!v.ok()) return v.status();
      out->i = *v;
      return absl::OkStatus();
    }
    case GgufValueType::kInt8: {
      auto v = in.Read<int8_t>(what);
      if (!v.ok()) return v.status();
      out->i = *v;
      return absl::OkStatus();
    }
    case GgufValueType::kUint16: {
      auto v = in.Read<uint16_t>(what);
      if (!v.ok()) return v.status();
      out->i = *v;
      return absl::OkStatus();
    }
    case GgufValueType::kInt16: {
      auto v = in.Read<int16_t>(what);
      if (!v.ok()) return v.status();
      out->i = *v;
      return absl::OkStatus();
    }
    case GgufValueType::kUint32: {
      auto v = in.Read<uint32_t>(what);
      if (!v.ok()) return v.status();
      out->i = *v;
      return absl::OkStatus();
    }
    case GgufValueType::kInt32: {
      auto v = in.Read<int32_t>(what);
      if (!v.ok()) return v.status();
      out->i = *v;
      return absl::OkStatus();
    }
    case GgufValueType::kUint64: {
      auto v = in.Read<uint64_t>(what);
      if (!v.ok()) return v.status();
      out->i = static_cast<int64_t>(*v);
      return absl::OkStatus();
    }
    case GgufValueType::kInt64: {
      auto v = in.Read<int64_t>(what);
      if (!v.ok()) return v.status();
      out->i = *v;
      return absl::OkStatus();
    }
    case GgufValueType::kFloat32: {
      auto v = in.Read<float>(what);
      if (!v.ok()) return v.status();
      out->f = *v;
      return absl::OkStatus();
    }
    case GgufValueType::kFloat64: {
      auto v = in.Read<double>(what);
      if (!v.ok()) return v.status();
      out->f = *v;
      return absl::OkStatus();
    }
    case GgufValueType::kBool: {
      auto v = in.Read<uint8_t>(what);
      if (!v.ok()) return v.status();
      if (*v > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": GGUF: key \"", key, "\": a bool of value ", int{*v}));
      }
      out->b = *v == 1;
      out->i = *v;
      return absl::OkStatus();
    }
    case GgufValueType::kString: {
      auto v = in.ReadString(what);
      if (!v.ok()) return v.status();
      out->s = *std::move(v);
      return absl::OkStatus();
    }
    case GgufValueType::kArray: {
      if (depth >= kMaxArrayDepth) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": GGUF: key \"", key, "\": arrays nested deeper than ", kMaxArrayDepth));
      }
      auto element = in.Read<uint32_t>(what);
      if (!element.ok()) return element.status();
      if (!KnownValueType(*element)) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": GGUF: key \"", key, "\": unknown array element type ", *element));
      }
      auto count = in.Read<uint64_t>(what);
      if (!count.ok()) return count.status();
      const auto element_type = static_cast<GgufValueType>(*element);
      // Each element takes at least its scalar size (a string its 8-byte length, an array its
      // 12-byte header): a count the bytes left cannot hold is refused before allocating.
      const size_t scalar = ScalarSize(element_type);
      const size_t least = scalar > 0 ? scalar : element_type == GgufValueType::kString ? 8 : 12;
      if (*count > in.left() / least) {
        return absl::DataLossError(absl::StrCat(path, ": GGUF: key \"", key, "\": an array of ",
                                                *count, " ", GgufValueTypeName(element_type),
                                                " values does not fit in the ", in.left(),
                                                " bytes left (byte ", in.offset(), ")"));
      }
      out->element_type = element_type;
      out->elements.resize(*count);
      for (GgufValue& e : out->elements) {
        if (absl::Status s = ReadValue(in, element_type, depth + 1, key, path, &e); !s.ok()) {
          return s;
        }
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": GGUF: key \"", key, "\": unknown value type"));
}

std::string JoinDims(const std::vector<int64_t>& ne) {
  std::string out = "[";
  for (size_t i = 0; i < ne.size(); ++i) absl::StrAppend(&out, i ? ", " : "", ne[i]);
  return out + "]";
}

}  // namespace

const char* GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
      return "uint8";
    case GgufValueType::kInt8:
      return "int8";
    case GgufValueType::kUint16:
      return "uint16";
    case GgufValueType::kInt16:
      return "int16";
    case GgufValueType::kUint32:
      return "uint32";
    case GgufValueType::kInt32:
      return "int32";
    case GgufValueType::kFloat32:
      return "float32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "uint64";
    case GgufValueType::kInt64:
      return "int64";
    case GgufValueType::kFloat64:
      return "float64";
  }
  return "unknown";
}

bool GgufValue::is_integer() const {
  return ScalarSize(type) > 0 && !is_float() && type != GgufValueType::kBool;
}

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

std::vector<int64_t> GgufTensor::shape() const { return {ne.rbegin(), ne.rend()}; }

absl::StatusOr<std::unique_ptr<GgufFile>> ParseGguf(const std::byte* bytes, size_t size,
                                                    const std::string& path) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  Cursor in(bytes, size, path);
  auto magic = in.Read<uint32_t>("the magic");
  if (!magic.ok()) return magic.status();
  if (*magic != kGgufMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a GGUF file (its first 4 bytes are not \"GGUF\")"));
  }
  auto version = in.Read<uint32_t>("the version");
  if (!version.ok()) return version.status();
  if (*version != 2 && *version != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": GGUF version ", *version, " (moebatch reads versions 2 and 3)"));
  }
  file->version_ = *version;
  auto tensor_count = in.Read<uint64_t>("the tensor count");
  if (!tensor_count.ok()) return tensor_count.status();
  auto kv_count = in.Read<uint64_t>("the metadata count");
  if (!kv_count.ok()) return kv_count.status();
  // A key/value takes at least 8 + 4 + 1 bytes, a tensor info 8 + 4 + 8 + 4 + 8.
  if (*kv_count > in.left() / 13 || *tensor_count > in.left() / 32) {
    return absl::DataLossError(absl::StrCat(path, ": GGUF: ", *kv_count, " metadata keys and ",
                                            *tensor_count, " tensors do not fit in ", size,
                                            " bytes (truncated?)"));
  }

  for (uint64_t k = 0; k < *kv_count; ++k) {
    auto key = in.ReadString(absl::StrCat("metadata key ", k));
    if (!key.ok()) return key.status();
    auto type = in.Read<uint32_t>(absl::StrCat("the type of \"", *key, "\""));
    if (!type.ok()) return type.status();
    if (!KnownValueType(*type)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": GGUF: key \"", *key, "\": unknown value type ", *type));
    }
    GgufValue value;
    if (absl::Status s = ReadValue(in, static_cast<GgufValueType>(*type), 0, *key, path, &value);
        !s.ok()) {
      return s;
    }
    if (!file->metadata_.emplace(*key, std::move(value)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": GGUF: key \"", *key, "\" appears twice"));
    }
  }
  if (const GgufValue* align = file->Find("general.alignment")) {
    if (!align->is_integer() || align->i <= 0 || (align->i & (align->i - 1)) != 0 ||
        align->i > (1 << 30)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": GGUF: general.alignment must be a power of two, got ",
          align->is_integer() ? absl::StrCat(align->i) : GgufValueTypeName(align->type)));
    }
    file->alignment_ = align->i;
  }

  file->tensors_.reserve(*tensor_count);
  for (uint64_t t = 0; t < *tensor_count; ++t) {
    GgufTensor tensor;
    auto name = in.ReadString(absl::StrCat("the name of tensor ", t));
    if (!name.ok()) return name.status();
    tensor.name = *std::move(name);
    const std::string what = absl::StrCat("tensor \"", tensor.name, "\"");
    auto n_dims = in.Read<uint32_t>(what);
    if (!n_dims.ok()) return n_dims.status();
    if (*n_dims < 1 || *n_dims > kMaxDims) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": GGUF: ", what, ": ", *n_dims, " dimensions (1 to ", kMaxDims, ")"));
    }
    int64_t numel = 1;
    for (uint32_t d = 0; d < *n_dims; ++d) {
      auto n = in.Read<uint64_t>(what);
      if (!n.ok()) return n.status();
      if (*n < 1 || *n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / numel)) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": GGUF: ", what, ": dimension ", d, " is ", *n));
      }
      tensor.ne.push_back(static_cast<int64_t>(*n));
      numel *= static_cast<int64_t>(*n);
    }
    auto type = in.Read<uint32_t>(what);
    if (!type.ok()) return type.status();
    const std::optional<GgmlTypeTraits> traits = GgmlTypeInfo(*type);
    if (!traits) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": GGUF: ", what, ": unknown ggml type ", *type));
    }
    tensor.type = *traits;
    if (tensor.ne[0] % traits->block_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": GGUF: ", what, " ", JoinDims(tensor.ne), ": rows of ", tensor.ne[0],
          " elements are not whole ", traits->name, " blocks of ", traits->block_size));
    }
    if (numel / traits->block_size > static_cast<int64_t>(size) / traits->type_size) {
      return absl::DataLossError(absl::StrCat(path, ": GGUF: ", what, " ", JoinDims(tensor.ne), " ",
                                              traits->name, " is larger than the file (", size,
                                              " bytes; truncated?)"));
    }
    tensor.nbytes = numel / traits->block_size * traits->type_size;
    auto offset = in.Read<uint64_t>(what);
    if (!offset.ok()) return offset.status();
    if (*offset % static_cast<uint64_t>(file->alignment_) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": GGUF: ", what, ": data offset ",
                                                     *offset, " is not a multiple of ",
                                                     file->alignment_));
    }
    if (*offset > size) {
      return absl::DataLossError(absl::StrCat(path, ": GGUF: ", what, ": data offset ", *offset,
                                              " is past the end of the file (", size,
                                              " bytes; truncated?)"));
    }
    tensor.offset = static_cast<int64_t>(*offset);
    if (!file->tensor_index_.emplace(tensor.name, file->tensors_.size()).second) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": GGUF: ", what, " appears twice"));
    }
    file->tensors_.push_back(std::move(tensor));
  }

  // The data section starts at the next multiple of the alignment.
  const size_t align = static_cast<size_t>(file->alignment_);
  const size_t data = (in.offset() + align - 1) / align * align;
  file->data_offset_ = static_cast<int64_t>(data);
  std::vector<const GgufTensor*> by_offset;
  for (GgufTensor& tensor : file->tensors_) {
    if (data > size || static_cast<uint64_t>(tensor.offset) > size - data ||
        static_cast<uint64_t>(tensor.nbytes) > size - data - tensor.offset) {
      return absl::DataLossError(absl::StrCat(
          path, ": GGUF: tensor \"", tensor.name, "\" (", tensor.type.name, " ",
          JoinDims(tensor.ne), ", ", tensor.nbytes, " bytes at data offset ", tensor.offset,
          ") ends past the end of the file (", size, " bytes; truncated?)"));
    }
    tensor.data = bytes + data + tensor.offset;
    by_offset.push_back(&tensor);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensor& a = *by_offset[i - 1];
    const GgufTensor& b = *by_offset[i];
    if (a.offset + a.nbytes > b.offset) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": GGUF: tensors \"", a.name, "\" and \"", b.name, "\" overlap"));
    }
  }
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat("missing GGUF file: ", path));
    return absl::ErrnoToStatus(err, absl::StrCat(path, ": cannot open"));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 24) {
    ::close(fd);
    return absl::DataLossError(
        absl::StrCat(path, ": GGUF: ", size, " bytes, shorter than the 24-byte header"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) return absl::ErrnoToStatus(map_errno, absl::StrCat(path, ": mmap failed"));
  auto file = ParseGguf(static_cast<const std::byte*>(map), size, path);
  if (!file.ok()) {
    ::munmap(map, size);
    return file.status();
  }
  (*file)->map_ = map;
  (*file)->map_size_ = size;
  return file;
}

GgufFile::~GgufFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_.find(std::string(key));
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

absl::StatusOr<const GgufValue*> Lookup(const GgufFile& f, std::string_view key) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(f.path(), ": GGUF: no metadata key \"", std::string(key), "\""));
  }
  return v;
}

absl::Status WrongType(const GgufFile& f, std::string_view key, const GgufValue& v,
                       std::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat(f.path(), ": GGUF: key \"", std::string(key),
                                                 "\" is ", GgufValueTypeName(v.type), ", expected ",
                                                 std::string(expected)));
}

}  // namespace

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  auto v = Lookup(*this, key);
  if (!v.ok()) return v.status();
  if (!(*v)->is_integer() && (*v)->type != GgufValueType::kBool) {
    return WrongType(*this, key, **v, "an integer");
  }
  return (*v)->i;
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  auto v = Lookup(*this, key);
  if (!v.ok()) return v.status();
  if ((*v)->is_float()) return (*v)->f;
  if ((*v)->is_integer()) return static_cast<double>((*v)->i);
  return WrongType(*this, key, **v, "a number");
}

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  auto v = Lookup(*this, key);
  if (!v.ok()) return v.status();
  if ((*v)->type != GgufValueType::kString) return WrongType(*this, key, **v, "a string");
  return (*v)->s;
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  auto v = Lookup(*this, key);
  if (!v.ok()) return v.status();
  if ((*v)->type != GgufValueType::kBool) return WrongType(*this, key, **v, "a bool");
  return (*v)->b;
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  auto v = Lookup(*this, key);
  if (!v.ok()) return v.status();
  if ((*v)->type != GgufValueType::kArray || (*v)->element_type != GgufValueType::kString) {
    return WrongType(*this, key, **v, "an array of strings");
  }
  std::vector<std::string> out;
  out.reserve((*v)->elements.size());
  for (const GgufValue& e : (*v)->elements) out.push_back(e.s);
  return out;
}

bool IsGgufFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  uint32_t magic = 0;
  in.read(reinterpret_cast<char*>(&magic), sizeof magic);
  return in.gcount() == sizeof magic && magic == kGgufMagic;
}

}  // namespace moebatch
