// GGUF files (llama.cpp's model format, version 3; version 2 reads the same), memory-mapped and
// validated: the header, every metadata key/value (all value types, arrays of any of them,
// nested), the tensor infos and the data section's alignment.
//
// Layout (ggml's docs/gguf.md; gguf-py's GGUFReader reads the same way), little-endian:
//   uint32 magic "GGUF", uint32 version, uint64 tensor_count, uint64 kv_count,
//   kv_count x { string key, uint32 value_type, value },
//   tensor_count x { string name, uint32 n_dims, uint64 ne[n_dims], uint32 ggml_type,
//                    uint64 offset },
//   padding to `general.alignment` (uint32, a power of two; 32 when absent), the data section.
// A string is uint64 length + that many bytes (UTF-8, not NUL-terminated); an array is uint32
// element type + uint64 count + the elements. ne[0] is the fastest-varying dimension (a row's
// length): a torch.nn.Linear weight [out, in] has ne = {in, out}. A tensor's bytes are
// ne[0] / block_size x type_size per row (GgmlTypeTraits), at `offset` from the data section's
// start, a multiple of the alignment.
//
// Threading: Open/ParseGguf build an immutable object; its methods are const and thread-safe.
// Ownership: GgufTensor::data points into the mapping (or the bytes given to ParseGguf).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/ggml_type.h"

namespace moebatch {

// gguf_type: the metadata value types.
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
const char* GgufValueTypeName(GgufValueType type);  // "uint32", "string", "array", ...

// One metadata value. Integers are kept in `i` (signed types sign-extended, unsigned ones
// zero-extended; a uint64 above INT64_MAX wraps), floats in `f`, booleans in `b`, strings in `s`;
// an array has `element_type` and `elements` (each a value of that type).
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string s;
  GgufValueType element_type = GgufValueType::kUint8;  // arrays
  std::vector<GgufValue> elements;                     // arrays

  bool is_integer() const;
  bool is_float() const {
    return type == GgufValueType::kFloat32 || type == GgufValueType::kFloat64;
  }
};

struct GgufTensor {
  std::string name;
  GgmlTypeTraits type;
  std::vector<int64_t> ne;  // as stored: ne[0] fastest (a row's length)
  int64_t offset = 0;       // from the start of the data section
  int64_t nbytes = 0;
  const std::byte* data = nullptr;

  int64_t numel() const;
  // The dimensions outermost first, as torch and safetensors write them: {ne[n-1], ..., ne[0]}.
  std::vector<int64_t> shape() const;
};

class GgufFile {
 public:
  // Maps `path` (read-only mmap) and parses it as ParseGguf does. NotFound for a missing file,
  // PermissionDenied when unreadable, the parse errors below otherwise.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  int64_t alignment() const { return alignment_; }
  int64_t data_offset() const { return data_offset_; }  // the data section's start, in the file
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  // In file order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }

  // The value of `key`, or null.
  const GgufValue* Find(std::string_view key) const;
  const GgufTensor* FindTensor(std::string_view name) const;
  // Typed reads of a key: NotFound naming the key and the file when absent, InvalidArgument when
  // of another type (naming both types). GetInt takes any integer type (and bool: 0 or 1);
  // GetFloat any float or integer type.
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;

 private:
  friend absl::StatusOr<std::unique_ptr<GgufFile>> ParseGguf(const std::byte* bytes, size_t size,
                                                             const std::string& path);
  GgufFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  uint32_t version_ = 0;
  int64_t alignment_ = 32;
  int64_t data_offset_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Whether `path` is a regular file that starts with the GGUF magic (a model given as a file
// rather than a directory). False for directories, missing files and other files.
bool IsGgufFile(const std::string& path);

// Parses a whole GGUF image, `size` bytes at `bytes`, which must outlive the result (the tensors
// point into it). Every read is bounds-checked; errors name `path`, and the key or tensor at fault:
//   InvalidArgument  not GGUF (bad magic), a version other than 2 or 3, a value type or tensor type
//                    moebatch does not know, a duplicate key or tensor name, an array nested
//                    deeper than 8, general.alignment not a power of two, a tensor with no or more
//                    than 4 dimensions, a dimension < 1, a row not a whole number of blocks, an
//                    offset not a multiple of the alignment, tensors that overlap
//   DataLoss         the file ends inside the header, a string, an array or a tensor's data (a
//                    truncated download), or counts/lengths larger than the bytes left
absl::StatusOr<std::unique_ptr<GgufFile>> ParseGguf(const std::byte* bytes, size_t size,
                                                    const std::string& path);

}  // namespace moebatch
