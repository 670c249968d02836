// safetensors reader. The format (https://huggingface.co/docs/safetensors, "Format"):
//   [8 bytes]  N, unsigned little-endian 64-bit: the header size
//   [N bytes]  JSON object: {"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]},
//                            "__metadata__": {string: string}}   (may be padded with spaces)
//   [rest]     the byte buffer; data_offsets are relative to its start, e - b = numel * elem size
// The whole file is mapped read-only; the header is validated in full before any tensor is used.
#include "engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/json_depth.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace moebatch {
namespace {

using Json = nlohmann::json;

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

// Bytes per element of every safetensors dtype (safetensors' Dtype enum); 0 when unknown.
size_t SafetensorsElementSize(std::string_view dtype) {
  static const std::pair<std::string_view, size_t> kSizes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  for (const auto& [name, size] : kSizes) {
    if (name == dtype) return size;
  }
  return 0;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// A non-negative integer that fits int64 (JSON shape and offset entries).
bool AsNonNegative(const Json& v, int64_t* out) {
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return false;
  } else if (v.get<int64_t>() < 0) {
    return false;
  }
  *out = v.get<int64_t>();
  return true;
}

// Parses one header entry into `info` (data pointer relative to `data`, of `data_size` bytes).
// Errors omit the "<file>: tensor <name>: " prefix, which the caller adds.
absl::Status ParseEntry(const Json& entry, const std::byte* data, size_t data_size,
                        TensorInfo* info) {
  if (!entry.is_object()) return absl::InvalidArgumentError("entry is not a JSON object");
  const auto dtype = entry.find("dtype");
  const auto shape = entry.find("shape");
  const auto offsets = entry.find("data_offsets");
  if (dtype == entry.end() || shape == entry.end() || offsets == entry.end()) {
    return absl::InvalidArgumentError("entry needs \"dtype\", \"shape\" and \"data_offsets\"");
  }

  if (!dtype->is_string()) return absl::InvalidArgumentError("\"dtype\" is not a string");
  info->dtype_name = dtype->get<std::string>();
  const size_t elem_size = SafetensorsElementSize(info->dtype_name);
  if (elem_size == 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", info->dtype_name, "\""));
  }
  info->dtype = DTypeFromSafetensors(info->dtype_name);

  if (!shape->is_array()) return absl::InvalidArgumentError("\"shape\" is not a list");
  uint64_t numel = 1;
  bool overflow = false;
  for (const Json& dim : *shape) {
    int64_t d;
    if (!AsNonNegative(dim, &d)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape ", shape->dump(), " has an entry that is not a non-negative integer"));
    }
    info->shape.push_back(d);
    overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel);
  }
  uint64_t expected_bytes;
  overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(elem_size), &expected_bytes);

  int64_t begin, end;
  if (!offsets->is_array() || offsets->size() != 2 || !AsNonNegative((*offsets)[0], &begin) ||
      !AsNonNegative((*offsets)[1], &end) || begin > end) {
    return absl::InvalidArgumentError(absl::StrCat("data_offsets ", offsets->dump(),
                                                   " are not [begin, end] with 0 <= begin <= end"));
  }
  const uint64_t nbytes = static_cast<uint64_t>(end - begin);
  if (overflow || nbytes != expected_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data_offsets ", offsets->dump(), " span ", nbytes, " bytes, but shape ", shape->dump(),
        " of ", info->dtype_name, " needs ",
        overflow ? std::string("more than 2^64") : absl::StrCat(expected_bytes), " bytes"));
  }
  if (static_cast<uint64_t>(end) > data_size) {
    return absl::DataLossError(absl::StrCat("data ends at byte ", end,
                                            " of the data section, but the file holds only ",
                                            data_size, " data bytes (truncated file?)"));
  }
  info->data = data + begin;
  info->nbytes = static_cast<size_t>(nbytes);
  return absl::OkStatus();
}

absl::Status ShortFileError(const std::string& path, size_t size) {
  return absl::DataLossError(
      absl::StrCat(path, ": ", size, " bytes, shorter than the 8-byte safetensors header length"));
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::map<std::string, TensorInfo>> ParseSafetensors(const std::byte* bytes,
                                                                   size_t size,
                                                                   const std::string& path) {
  if (size < 8) return ShortFileError(path, size);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  if (header_len > size - 8) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", header_len,
                                            " runs past the end of the file (", size,
                                            " bytes): truncated or not a safetensors file"));
  }
  const char* header = reinterpret_cast<const char*>(bytes + 8);
  const std::byte* data = bytes + 8 + header_len;
  const size_t data_size = size - 8 - header_len;

  if (JsonNestsDeeperThan(std::string_view(header, header_len), kMaxJsonDepth)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": safetensors header is not valid JSON: nested deeper than ",
                     kMaxJsonDepth, " levels"));
  }
  Json root;
  try {
    root = Json::parse(header, header + header_len);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": safetensors header is not valid JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": safetensors header is not a JSON object"));
  }
  std::map<std::string, TensorInfo> tensors;
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") continue;
    TensorInfo info;
    info.name = name;
    info.file = path;
    if (absl::Status s = ParseEntry(entry, data, data_size, &info); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(path, ": tensor \"", name, "\": ", s.message()));
    }
    tensors.emplace(name, std::move(info));
  }
  return tensors;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat(path, ": cannot open"));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {  // (also keeps mmap from being asked for 0 bytes)
    ::close(fd);
    return ShortFileError(path, size);
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) return absl::ErrnoToStatus(map_errno, absl::StrCat(path, ": mmap failed"));

  // From here the destructor unmaps on every error path.
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_ = map;
  file->size_ = size;
  absl::StatusOr<std::map<std::string, TensorInfo>> tensors =
      ParseSafetensors(static_cast<const std::byte*>(map), size, path);
  if (!tensors.ok()) return tensors.status();
  file->tensors_ = *std::move(tensors);
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

const TensorInfo* TensorStore::Find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

size_t TensorStore::total_bytes() const {
  size_t total = 0;
  for (const auto& [name, info] : index_) total += info->nbytes;
  return total;
}

absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(std::string_view json_text,
                                                       const std::string& index_path) {
  if (JsonNestsDeeperThan(json_text, kMaxJsonDepth)) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": invalid JSON: nested deeper than ", kMaxJsonDepth, " levels"));
  }
  SafetensorsIndex index;
  try {
    const Json root = Json::parse(json_text.begin(), json_text.end());
    const auto map = root.is_object() ? root.find("weight_map") : root.end();
    if (map == root.end() || !map->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": no \"weight_map\" object mapping tensors to shards"));
    }
    std::set<std::string> seen;
    for (const auto& [tensor, shard] : map->items()) {
      if (!shard.is_string() || shard.get<std::string>().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map maps tensor \"",
                                                       tensor, "\" to ", shard.dump(),
                                                       ", not a shard file name"));
      }
      const std::string name = shard.get<std::string>();
      // A shard is a file of the model directory itself: no path, so an index cannot make the
      // daemon map files elsewhere ("../../etc/...", "/dev/zero").
      if (name == "." || name == ".." || name.find_first_of("/\\") != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": weight_map maps tensor \"", tensor, "\" to \"", name,
                         "\": a shard must be a file name in the model directory, not a path"));
      }
      index.weight_map[tensor] = name;
      if (seen.insert(name).second) index.shards.emplace_back(name, tensor);
    }
    if (index.shards.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map is empty"));
    }
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": invalid JSON: ", e.what()));
  }
  return index;
}

absl::StatusOr<std::unique_ptr<TensorStore>> TensorStore::Open(const std::string& model_dir) {
  auto store = std::make_unique<TensorStore>();
  const std::string index_path = model_dir + "/" + kIndexFile;

  // Shard file name -> one tensor the index maps to it (for error messages); in file order.
  std::vector<std::pair<std::string, std::string>> shards;
  std::map<std::string, std::string> weight_map;  // tensor -> shard
  const bool sharded = FileExists(index_path);
  if (sharded) {
    std::ifstream in(index_path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in) return absl::DataLossError(absl::StrCat(index_path, ": cannot read"));
    absl::StatusOr<SafetensorsIndex> index = ParseSafetensorsIndex(text.str(), index_path);
    if (!index.ok()) return index.status();
    weight_map = std::move(index->weight_map);
    shards = std::move(index->shards);
  } else if (FileExists(model_dir + "/" + kSingleFile)) {
    shards.emplace_back(kSingleFile, "");
  } else {
    return absl::NotFoundError(
        absl::StrCat("no ", kSingleFile, " or ", kIndexFile, " in ", model_dir));
  }

  for (const auto& [shard, example_tensor] : shards) {
    const std::string path = model_dir + "/" + shard;
    if (sharded && !FileExists(path)) {
      return absl::NotFoundError(absl::StrCat(index_path, " names shard ", shard, " (tensor \"",
                                              example_tensor, "\"), which is missing: ", path));
    }
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
    if (!file.ok()) return file.status();
    for (const auto& [name, info] : (*file)->tensors()) {
      const auto [it, inserted] = store->index_.emplace(name, &info);
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", name, "\" is in both ", it->second->file, " and ", path));
      }
    }
    store->files_.push_back(*std::move(file));
  }

  for (const auto& [tensor, shard] : weight_map) {
    const TensorInfo* info = store->Find(tensor);
    if (info == nullptr || info->file != model_dir + "/" + shard) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map puts tensor \"",
                                                     tensor, "\" in ", shard,
                                                     ", which does not hold it"));
    }
  }
  spdlog::debug("{}: {} tensors, {} bytes in {} file(s)", model_dir, store->index_.size(),
                store->total_bytes(), store->files_.size());
  return store;
}

void DropMappedPages(const std::byte* data, size_t bytes) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(data) / page * page;
  const auto end = (reinterpret_cast<uintptr_t>(data) + bytes + page - 1) / page * page;
  (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace moebatch
