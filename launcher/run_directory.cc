#include "launcher/run_directory.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"

namespace e3 {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", ::strerror(errno)));
}

// Writes all of `text` to `fd`.
absl::Status WriteAll(int fd, const std::string& text, const std::string& path) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno(path);
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// The pid a lock file names; 0 when it names none (being written).
long LockHolder(int fd) {
  char buf[32] = {0};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  long pid = 0;
  if (n <= 0 || !absl::SimpleAtoi(absl::StripAsciiWhitespace(buf), &pid)) return 0;
  return pid;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RunDirectoryLock>> RunDirectoryLock::Acquire(
    const std::string& out) {
  const std::string path = JoinPath(out, "e3_launch.lock");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Errno(path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    const long holder = LockHolder(fd);
    ::close(fd);
    if (error != EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat(path, ": flock: ", ::strerror(error)));
    }
    return absl::FailedPreconditionError(
        holder > 0 ? absl::StrCat(out, " is in use by e3_launch pid ", holder)
                   : absl::StrCat(out, " is in use by another e3_launch"));
  }
  // The file is never removed: a launcher that unlinked it could leave the
  // next two locking different files.
  absl::Status written =
      ::ftruncate(fd, 0) == 0 ? WriteAll(fd, absl::StrCat(::getpid(), "\n"), path) : Errno(path);
  if (!written.ok()) {
    ::close(fd);
    return written;
  }
  return std::unique_ptr<RunDirectoryLock>(new RunDirectoryLock(fd));
}

RunDirectoryLock::~RunDirectoryLock() { ::close(fd_); }

absl::StatusOr<std::string> RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::getrandom(raw.data() + done, bytes - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno("getrandom");
    done += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : raw) {
    hex.push_back(kHex[c >> 4]);
    hex.push_back(kHex[c & 15]);
  }
  return hex;
}

absl::Status WriteAuthToken(const std::string& path) {
  E3_ASSIGN_OR_RETURN(const std::string token, RandomHex(32));
  E3_RETURN_IF_ERROR(RemoveStale(path));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return Errno(path);
  // The mode given to open is masked by the umask, which can only take
  // permissions away; set it anyway, so the file says 0600 whatever it is.
  absl::Status status = ::fchmod(fd, 0600) == 0 ? WriteAll(fd, token + "\n", path) : Errno(path);
  if (::close(fd) != 0 && status.ok()) status = Errno(path);
  return status;
}

absl::StatusOr<std::string> RotateLog(const std::string& log) {
  if (!PathExists(log)) return std::string();
  for (int k = 1;; ++k) {
    const std::string to = absl::StrCat(log, ".", k);
    if (PathExists(to)) continue;
    E3_RETURN_IF_ERROR(RenamePath(log, to));
    return to;
  }
}

absl::Status RemoveStale(const std::string& path) {
  if (::unlink(path.c_str()) == 0 || errno == ENOENT) return absl::OkStatus();
  return Errno(absl::StrCat("removing ", path));
}

std::vector<pid_t> ProcessesWithArgument(const std::string& arg) {
  std::vector<pid_t> out;
  const pid_t self = ::getpid();
  for (const std::string& entry : ListDir("/proc").value_or(std::vector<std::string>())) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry, &pid) || pid == self) continue;
    // A process that ended since the listing has no file: skip it.
    absl::StatusOr<std::string> cmdline = ReadFileToString(JoinPath("/proc/" + entry, "cmdline"));
    if (!cmdline.ok()) continue;
    for (absl::string_view a : absl::StrSplit(*cmdline, '\0')) {
      if (a == arg) {
        out.push_back(pid);
        break;
      }
    }
  }
  return out;
}

}  // namespace e3
