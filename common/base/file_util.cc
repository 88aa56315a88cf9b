#include "common/base/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace e3 {

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

absl::Status MakeDirs(const std::string& path) {
  if (path.empty() || IsDirectory(path)) return absl::OkStatus();
  const std::string parent = Dirname(path);
  if (parent != path && !parent.empty()) {
    absl::Status s = MakeDirs(parent);
    if (!s.ok()) return s;
  }
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot create directory: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status RemoveAll(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return absl::OkStatus();
  if (!S_ISDIR(st.st_mode)) {
    if (::unlink(path.c_str()) != 0) {
      return absl::PermissionDeniedError(absl::StrCat(path, ": cannot remove: ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }
  auto remove_one = [](const char* p, const struct stat*, int, struct FTW*) -> int { return ::remove(p); };
  if (::nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot remove: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status RenamePath(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return absl::DataLossError(absl::StrCat("rename ", from, " -> ", to, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot list: ", std::strerror(errno)));
  std::vector<std::string> out;
  while (struct dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(std::move(name));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

std::string Dirname(const std::string& path) {
  size_t end = path.size();
  while (end > 1 && path[end - 1] == '/') --end;
  size_t slash = path.rfind('/', end - 1);
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return ss.str();
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot open to sync: ", std::strerror(errno)));
  const bool ok = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return absl::DataLossError(absl::StrCat(dir, ": fsync failed: ", std::strerror(err)));
  return absl::OkStatus();
}

namespace {

// Writes all of `pieces` to `fd`; returns the bytes written and, when short,
// the errno of the failing write.
std::pair<uint64_t, int> WriteAll(int fd, const std::vector<absl::string_view>& pieces) {
  uint64_t written = 0;
  for (absl::string_view piece : pieces) {
    size_t done = 0;
    while (done < piece.size()) {
      const ssize_t n = ::write(fd, piece.data() + done, piece.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return {written + done, errno};
      if (n == 0) return {written + done, EIO};
      done += static_cast<size_t>(n);
    }
    written += done;
  }
  return {written, 0};
}

}  // namespace

absl::Status WriteFilePiecesAtomically(const std::string& path,
                                       const std::vector<absl::string_view>& pieces) {
  uint64_t total = 0;
  for (absl::string_view piece : pieces) total += piece.size();
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat(tmp, ": cannot open for writing: ", std::strerror(errno)));
  auto [written, err] = WriteAll(fd, pieces);
  // The contents reach the disk before the rename makes them the file's:
  // a crash leaves the old file or the whole new one, never a torn one.
  // fsync can fail too where the filesystem allocates late (ENOSPC).
  const bool synced = err == 0 && ::fsync(fd) == 0;
  if (err == 0 && !synced) err = errno;
  ::close(fd);
  if (err != 0) {
    std::remove(tmp.c_str());
    const std::string what =
        written < total ? absl::StrCat("write failed after ", written, " of ", total, " bytes (",
                                       total - written, " bytes not written)")
                        : absl::StrCat("fsync of all ", total, " bytes failed");
    return absl::DataLossError(absl::StrCat(path, ": ", what, " to ", tmp, ": ", std::strerror(err)));
  }
  E3_RETURN_IF_ERROR(RenamePath(tmp, path));
  return SyncDirectory(Dirname(path));
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  return WriteFilePiecesAtomically(path, {absl::string_view(contents)});
}

absl::StatusOr<std::string> MakeTempDir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = JoinPath(base != nullptr && *base ? base : "/tmp", prefix + "XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(tmpl, ": mkdtemp failed: ", std::strerror(errno)));
  }
  return tmpl;
}

std::string SelfExeDir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  return Dirname(std::string(buf, static_cast<size_t>(n)));
}

}  // namespace e3
