#include "student_trainer/state/checkpoint_checksums.h"

#include <sys/stat.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/crc32c.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace e3 {
namespace {

using Json = nlohmann::json;

std::string Hex(uint32_t crc) { return absl::StrFormat("%08x", crc); }

bool PlainName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos;
}

absl::StatusOr<int64_t> SizeOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return absl::NotFoundError(absl::StrCat(path, ": missing"));
  return static_cast<int64_t>(st.st_size);
}

}  // namespace

std::string ChecksumManifestToJson(const ChecksumManifest& manifest) {
  Json files = Json::object();
  for (const auto& [name, sum] : manifest) files[name] = {{"bytes", sum.bytes}, {"crc32c", Hex(sum.crc32c)}};
  return Json{{"files", files}}.dump(2) + "\n";
}

absl::StatusOr<ChecksumManifest> ParseChecksumManifest(const std::string& text, const std::string& source) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("files") || !j["files"].is_object()) {
    return absl::DataLossError(absl::StrCat(source, ": expected an object with a \"files\" object"));
  }
  ChecksumManifest manifest;
  for (const auto& [name, entry] : j["files"].items()) {
    const std::string where = absl::StrCat(source, ": files.", name.substr(0, 64));
    uint32_t crc = 0;
    if (!PlainName(name) || !entry.is_object() || !entry.contains("bytes") ||
        !entry["bytes"].is_number_unsigned() || !entry.contains("crc32c") || !entry["crc32c"].is_string() ||
        entry["crc32c"].get<std::string>().size() != 8 ||
        !absl::SimpleHexAtoi(entry["crc32c"].get<std::string>(), &crc)) {
      return absl::DataLossError(
          absl::StrCat(where, ": expected a plain file name with {\"bytes\": n, \"crc32c\": 8 hex digits}"));
    }
    manifest[name] = {static_cast<int64_t>(entry["bytes"].get<uint64_t>()), crc};
  }
  return manifest;
}

absl::Status WriteChecksums(const std::string& dir) {
  E3_ASSIGN_OR_RETURN(const std::vector<std::string> names, ListDir(dir));
  ChecksumManifest manifest;
  for (const std::string& name : names) {
    const std::string path = JoinPath(dir, name);
    if (name == kChecksumsFile || !IsRegularFile(path)) continue;
    E3_ASSIGN_OR_RETURN(const int64_t bytes, SizeOf(path));
    E3_ASSIGN_OR_RETURN(const uint32_t crc, Crc32cOfFile(path));
    manifest[name] = {bytes, crc};
  }
  return WriteFileAtomically(JoinPath(dir, kChecksumsFile), ChecksumManifestToJson(manifest));
}

absl::Status VerifyChecksums(const std::string& dir) {
  const std::string manifest_path = JoinPath(dir, kChecksumsFile);
  if (!PathExists(manifest_path)) return absl::OkStatus();
  E3_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(manifest_path));
  E3_ASSIGN_OR_RETURN(const ChecksumManifest manifest, ParseChecksumManifest(text, manifest_path));
  for (const auto& [name, want] : manifest) {
    const std::string path = JoinPath(dir, name);
    absl::StatusOr<int64_t> bytes = SizeOf(path);
    if (!bytes.ok()) return absl::DataLossError(bytes.status().message());
    if (*bytes != want.bytes) {
      return absl::DataLossError(absl::StrCat(path, ": ", *bytes, " bytes, but ", kChecksumsFile, " records ",
                                              want.bytes, " (the file changed after the checkpoint was written)"));
    }
    E3_ASSIGN_OR_RETURN(const uint32_t crc, Crc32cOfFile(path));
    if (crc != want.crc32c) {
      return absl::DataLossError(absl::StrCat(path, ": CRC-32C ", Hex(crc), ", but ", kChecksumsFile,
                                              " records ", Hex(want.crc32c),
                                              " (the file changed after the checkpoint was written)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace e3
