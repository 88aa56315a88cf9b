// Small POSIX file helpers. Code that links LibTorch must not use
// std::filesystem: pip's libtorch.so (2.x) exports its own copies of some
// std::filesystem symbols, and calls bind to them and crash (seen:
// std::filesystem::remove_all jumping to address 0 on the GPU machine).
// These helpers use plain POSIX calls instead.
#ifndef E3_COMMON_BASE_FILE_UTIL_H_
#define E3_COMMON_BASE_FILE_UTIL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace e3 {

bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);
bool IsRegularFile(const std::string& path);
// mkdir -p.
absl::Status MakeDirs(const std::string& path);
// rm -rf; a missing path is OK.
absl::Status RemoveAll(const std::string& path);
absl::Status RenamePath(const std::string& from, const std::string& to);
// Entry names (no "." or ".."), sorted.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path);
std::string JoinPath(const std::string& a, const std::string& b);
std::string Dirname(const std::string& path);
absl::StatusOr<std::string> ReadFileToString(const std::string& path);
// Writes to `path`.tmp.<pid>, fsyncs it, renames it into place and fsyncs
// the directory: after a crash `path` holds the old contents or the whole
// new ones. Processes writing the same path never share a temporary file.
// A failed write (disk full, file size limit) removes the temporary and
// names the file, the bytes written and the bytes it could not write; the
// old file stays.
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);
// The same for contents given as consecutive pieces (a header and tensor
// data), so that large files are not copied into one buffer first.
absl::Status WriteFilePiecesAtomically(const std::string& path,
                                       const std::vector<absl::string_view>& pieces);
// fsync of a directory: makes the renames and creations inside it durable.
absl::Status SyncDirectory(const std::string& dir);
// A fresh directory under $TMPDIR (or /tmp) named <prefix>XXXXXX.
absl::StatusOr<std::string> MakeTempDir(const std::string& prefix);
// Directory of the running executable.
std::string SelfExeDir();

}  // namespace e3

#endif  // E3_COMMON_BASE_FILE_UTIL_H_
