#include "common/model/safetensors.h"

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "nlohmann/json.hpp"

namespace e3 {
namespace {

// A header larger than this is not a plausible safetensors header; the
// reference implementation uses the same bound.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

absl::Status Corrupt(const std::string& path, const std::string& tensor, const std::string& what) {
  if (tensor.empty()) return absl::DataLossError(absl::StrCat(path, ": ", what));
  return absl::DataLossError(absl::StrCat(path, ": tensor \"", tensor, "\": ", what));
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  auto mapped = MmapFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  auto out = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  out->file_ = std::move(mapped).value();
  const uint8_t* base = out->file_->data();
  const uint64_t size = out->file_->size();
  if (size < 8) {
    return Corrupt(path, "", absl::StrCat("file is ", size, " bytes, shorter than the 8-byte header length"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];
  if (header_len > kMaxHeaderBytes) {
    return Corrupt(path, "", absl::StrCat("header length ", header_len, " exceeds the ",
                                          kMaxHeaderBytes, "-byte limit"));
  }
  if (header_len > size - 8) {
    return Corrupt(path, "", absl::StrCat("header length ", header_len, " runs past the end of the ",
                                          size, "-byte file (truncated?)"));
  }
  const uint8_t* data_start = base + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;

  nlohmann::json header = nlohmann::json::parse(base + 8, base + 8 + header_len, nullptr,
                                                /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Corrupt(path, "", "header is not a JSON object");
  }
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) return Corrupt(path, "", "__metadata__ is not an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) {
          return Corrupt(path, "", absl::StrCat("__metadata__.", m.key(), " is not a string"));
        }
        out->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) return Corrupt(path, name, "entry is not an object");
    auto dt = entry.find("dtype");
    if (dt == entry.end() || !dt->is_string()) return Corrupt(path, name, "missing string field \"dtype\"");
    auto dtype = ParseDType(dt->get<std::string>());
    if (!dtype.ok()) return Corrupt(path, name, std::string(dtype.status().message()));
    auto sh = entry.find("shape");
    if (sh == entry.end() || !sh->is_array()) return Corrupt(path, name, "missing array field \"shape\"");
    TensorView view;
    view.name = name;
    view.dtype = *dtype;
    view.file = path;
    uint64_t numel = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        return Corrupt(path, name, "shape holds a value that is not a non-negative integer");
      }
      uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > (UINT64_MAX / dim)) return Corrupt(path, name, "shape overflows");
      numel *= dim;
      view.shape.push_back(static_cast<int64_t>(dim));
    }
    auto off = entry.find("data_offsets");
    if (off == entry.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned()) {
      return Corrupt(path, name, "\"data_offsets\" must be two non-negative integers");
    }
    uint64_t begin = (*off)[0].get<uint64_t>();
    uint64_t end = (*off)[1].get<uint64_t>();
    if (begin > end) {
      return Corrupt(path, name, absl::StrCat("data_offsets [", begin, ", ", end, "] are reversed"));
    }
    if (end > data_size) {
      return Corrupt(path, name,
                     absl::StrCat("data_offsets end ", end, " lies past the ", data_size,
                                  "-byte data section (file truncated or header lies)"));
    }
    uint64_t elem = DTypeSize(view.dtype);
    if (numel > UINT64_MAX / elem || numel * elem != end - begin) {
      return Corrupt(path, name,
                     absl::StrCat("shape and dtype need ", numel * elem, " bytes but data_offsets span ",
                                  end - begin));
    }
    view.data = data_start + begin;
    view.nbytes = end - begin;
    out->tensors_.emplace(name, std::move(view));
  }
  return out;
}

absl::StatusOr<TensorView> SafetensorsFile::Get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path(), ": no tensor named \"", name, "\""));
  }
  return it->second;
}

std::vector<std::string> SafetensorsFile::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, view] : tensors_) names.push_back(name);
  return names;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::map<std::string, const TensorToWrite*> sorted;
  for (const auto& t : tensors) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat(path, ": tensor \"", t.name, "\" has a negative dim"));
      numel *= static_cast<uint64_t>(d);
    }
    if (numel * DTypeSize(t.dtype) != t.data.size()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor \"", t.name, "\" holds ", t.data.size(),
                                                     " bytes, its shape and dtype need ",
                                                     numel * DTypeSize(t.dtype)));
    }
    if (!sorted.emplace(t.name, &t).second) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor \"", t.name, "\" given twice"));
    }
  }
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : sorted) {
    header[name] = {{"dtype", DTypeName(t->dtype)},
                    {"shape", t->shape},
                    {"data_offsets", {offset, offset + t->data.size()}}};
    offset += t->data.size();
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');  // align the data section
  uint64_t n = text.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(n >> (8 * i));
  std::vector<absl::string_view> pieces = {absl::string_view(len, 8), text};
  for (const auto& [name, t] : sorted) {
    pieces.emplace_back(reinterpret_cast<const char*>(t->data.data()), t->data.size());
  }
  // Durable: checkpoints and exports are built from these files, and a
  // `latest` pointer must never name a file the disk has not got.
  return WriteFilePiecesAtomically(path, pieces);
}

}  // namespace e3
