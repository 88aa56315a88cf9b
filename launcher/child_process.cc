#include "launcher/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace e3 {

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv,
    const std::vector<std::pair<std::string, std::string>>& env, const std::string& log_path) {
  if (::access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(argv[0], ": not an executable (build it first?)"));
  }
  const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::FailedPreconditionError(absl::StrCat(log_path, ": ", ::strerror(errno)));
  // Everything the child needs is prepared before fork: after it, only
  // async-signal-safe calls.
  std::vector<std::string> args = argv;
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("fork: ", ::strerror(errno)));
  }
  if (pid == 0) {
    // A launcher that dies, even of SIGKILL, takes its processes with it:
    // they get SIGTERM, on which the services drain and checkpoint. (The
    // signal follows the thread that forked; the launcher forks from its
    // main thread, which lives as long as it does.) A parent already gone
    // before the call would send nothing: then end here.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(128 + SIGTERM);
    for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::execv(cargs[0], cargs.data());
    ::_exit(127);
  }
  ::close(fd);
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid));
}

ChildProcess::~ChildProcess() {
  if (Running()) {
    Signal(SIGKILL);
    WaitFor(std::chrono::seconds(5));
  }
}

bool ChildProcess::Running() {
  if (status_.has_value()) return false;
  int st = 0;
  if (::waitpid(pid_, &st, WNOHANG) == pid_) {
    status_ = st;
    ended_ = Clock::now();
    return false;
  }
  return true;
}

bool ChildProcess::Succeeded() const {
  return status_.has_value() && WIFEXITED(*status_) && WEXITSTATUS(*status_) == 0;
}

std::string ChildProcess::DescribeEnd() const {
  if (!status_.has_value()) return "running";
  if (WIFEXITED(*status_)) return absl::StrCat("exit ", WEXITSTATUS(*status_));
  if (WIFSIGNALED(*status_))
    return absl::StrCat("signal ", WTERMSIG(*status_), " (", ::strsignal(WTERMSIG(*status_)), ")");
  return absl::StrCat("wait status ", *status_);
}

double ChildProcess::SecondsRunning() const {
  return std::chrono::duration<double>(ended_.value_or(Clock::now()) - started_).count();
}

void ChildProcess::Signal(int sig) {
  if (!status_.has_value()) ::kill(pid_, sig);
}

bool ChildProcess::WaitFor(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Running()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::vector<std::string> TailLines(const std::string& path, size_t lines, size_t max_bytes) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return {};
  const std::streamoff size = f.tellg();
  const std::streamoff limit = static_cast<std::streamoff>(max_bytes);
  const std::streamoff from = size > limit ? size - limit : 0;
  f.seekg(from);
  std::string text(static_cast<size_t>(size - from), '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    while (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    // A terminal would show what follows the last carriage return.
    const size_t cr = line.rfind('\r');
    if (cr != absl::string_view::npos) line = line.substr(cr + 1);
    if (!line.empty()) out.emplace_back(line);
  }
  if (from > 0 && !out.empty()) out.erase(out.begin());  // a partial first line
  if (out.size() > lines) out.erase(out.begin(), out.end() - static_cast<std::ptrdiff_t>(lines));
  return out;
}

}  // namespace e3
