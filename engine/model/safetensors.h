// Memory-mapped safetensors checkpoints: one `model.safetensors`, or the shards listed in
// `model.safetensors.index.json` (the Hugging Face layout written by `save_pretrained`).
//
// Format (https://huggingface.co/docs/safetensors): 8-byte little-endian header length N, N bytes
// of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the
// data (offsets relative to the end of the header). Files are mapped read-only with mmap(2); no
// tensor is copied or read before use. TensorInfo::data points into the mapping and lives as long
// as the owning SafetensorsFile / TensorStore. All methods are const and thread-safe after Open.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/dtype.h"
#include "engine/model/ggml_type.h"

namespace moebatch {

struct TensorInfo {
  std::string name;
  std::string dtype_name;      // as written in the header: "BF16", "F32", "I64", ...
  std::optional<DType> dtype;  // nullopt when moebatch does not compute in that type
  // A tensor kept in ggml blocks (Q4_K, Q8_0, ...; engine/model/ggml_quants.h), from a GGUF file
  // or quantized at load: products with it are computed on the blocks
  // (cpu_attention/gemm/quant_linear.h), it is never widened whole; dtype is then nullopt. Each
  // row of `shape` is shape.back() / block_size blocks.
  std::optional<GgmlType> quant;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // into the file mapping
  size_t nbytes = 0;
  std::string file;  // path of the file holding it (for error messages)

  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps `path` and validates the header. Errors (all name the file; tensor errors name the
  // tensor):
  //   NotFound          the file does not exist
  //   DataLoss          shorter than 8 bytes, header length beyond the file, or a tensor whose
  //                     data_offsets end past the end of the file (truncated download)
  //   InvalidArgument   header is not valid JSON / not an object; a tensor entry without dtype,
  //                     shape or data_offsets; offsets not [begin <= end]; byte size != numel *
  //                     size of its dtype; unknown dtype string
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  size_t file_size() const { return size_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
};

// Drops the pages of a read-only file mapping (a TensorInfo::data of a SafetensorsFile or GGUF
// file) that hold [data, data + bytes) from the process's resident set (madvise MADV_DONTNEED; a
// later read faults them in again from the file, so bytes sharing those pages stay readable). For
// tensors whose bytes were copied (repacked, transposed) and are not read again: the copy is then
// the only resident form. Never pass memory that is not a file mapping (anonymous memory would
// read back as zeros).
void DropMappedPages(const std::byte* data, size_t bytes);

// The parsers SafetensorsFile::Open and TensorStore::Open apply to the bytes they read, exposed for
// tests and fuzzing (tests/fuzz).

// Parses a whole safetensors file image, `size` bytes at `bytes` (the length field, the header and
// the data), with SafetensorsFile::Open's checks and errors (`path` names the file in them; apart
// from NotFound). Each TensorInfo::data points into `bytes`, which must outlive the result.
absl::StatusOr<std::map<std::string, TensorInfo>> ParseSafetensors(const std::byte* bytes,
                                                                   size_t size,
                                                                   const std::string& path);

// A parsed model.safetensors.index.json.
struct SafetensorsIndex {
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  // Each shard once, in order of first mention, with the first tensor mapped to it (for errors).
  std::vector<std::pair<std::string, std::string>> shards;
};

// Parses the text of model.safetensors.index.json ({"metadata": {...}, "weight_map": {tensor:
// shard file name}}). InvalidArgument, prefixed with `index_path`: invalid JSON, no "weight_map"
// object, a shard that is not a non-empty string, an empty map.
absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(std::string_view json_text,
                                                       const std::string& index_path);

// Every tensor of a model directory.
class TensorStore {
 public:
  // Opens `<dir>/model.safetensors.index.json` when present (its "weight_map" names a shard per
  // tensor; every shard is opened, and every tensor the map names must be in its shard), else
  // `<dir>/model.safetensors`. Errors: NotFound when neither exists or a shard named by the index
  // is missing (the message names the shard and a tensor mapped to it); InvalidArgument for a
  // malformed index; the SafetensorsFile::Open errors; InvalidArgument when two shards hold the
  // same tensor.
  static absl::StatusOr<std::unique_ptr<TensorStore>> Open(const std::string& model_dir);

  // nullptr when absent.
  const TensorInfo* Find(const std::string& name) const;
  const std::map<std::string, const TensorInfo*>& tensors() const { return index_; }
  size_t total_bytes() const;  // sum of tensor byte sizes
  size_t num_files() const { return files_.size(); }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> index_;
};

}  // namespace moebatch
