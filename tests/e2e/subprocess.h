// (No std::filesystem: these binaries link LibTorch; see common/base/file_util.h.)
// Launches the real teacher_server and student_trainer binaries for
// end-to-end tests, with bounded waits and cleanup on failure.
#ifndef E3_TESTS_E2E_SUBPROCESS_H_
#define E3_TESTS_E2E_SUBPROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/base/file_util.h"
#include "tests/scratch_dir.h"

namespace e3::testing {

inline std::string BuildDir() {
  // Test binaries live in <build>/tests.
  return Dirname(SelfExeDir());
}
inline std::string TeacherBinary() { return BuildDir() + "/teacher_server/teacher_server"; }
inline std::string StudentBinary() { return BuildDir() + "/student_trainer/student_trainer"; }

// The teacher_server command line the end-to-end tests start from: the
// model in `model_dir` on the bundled conversations, served on loopback
// with its port written to `dir`/port and one worker thread (CI has two
// cores), then `flags` (data limits, ledger, drain behaviour).
inline std::vector<std::string> TeacherArgv(const std::string& dir, const std::string& model_dir,
                                            const std::vector<std::string>& flags) {
  const std::string src = E3_SOURCE_DIR;
  std::vector<std::string> argv = {TeacherBinary(), "--model_dir=" + model_dir,
                                   "--data=" + src + "/examples/data/train_conversations.jsonl",
                                   "--listen=127.0.0.1:0", "--port_file=" + dir + "/port", "--threads=1"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return argv;
}

// TeacherArgv serving the bundled tiny-code-llama.
inline std::vector<std::string> TinyTeacherArgv(const std::string& dir, const std::vector<std::string>& flags) {
  return TeacherArgv(dir, std::string(E3_SOURCE_DIR) + "/examples/tiny-code-llama", flags);
}

// What the child runs under besides its arguments.
struct SubprocessLimits {
  // RLIMIT_FSIZE: no file the process writes may grow past this (0: no
  // limit). It stands in for a full disk, portably (no mount, no root);
  // SIGXFSZ keeps its default, so the process must ignore it itself to see
  // EFBIG instead of dying. The process's output then reaches its log
  // through a pipe, which the limit does not cover: only the files the
  // process writes itself fill up.
  rlim_t file_size_bytes = 0;
  // A process group of its own (its pid): a test can then kill it with
  // every process it started, kill(-pid, sig), as a crash of its machine
  // or container would.
  bool own_process_group = false;
};

class Subprocess {
 public:
  Subprocess(std::vector<std::string> argv, const std::string& log_path, const SubprocessLimits& limits = {})
      : log_(log_path) {
    int pipe_fds[2] = {-1, -1};
    const bool piped = limits.file_size_bytes > 0 && ::pipe2(pipe_fds, O_CLOEXEC) == 0;
    pid_ = ::fork();
    if (pid_ == 0) {
      if (limits.own_process_group) ::setpgid(0, 0);
      int fd = piped ? pipe_fds[1] : ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      if (limits.file_size_bytes > 0) {
        const rlimit limit{limits.file_size_bytes, limits.file_size_bytes};
        if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(126);
      }
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    // Both sides set it, so it holds whichever runs first.
    if (pid_ > 0 && limits.own_process_group) ::setpgid(pid_, pid_);
    if (piped) {
      ::close(pipe_fds[1]);
      copier_ = std::thread([read_fd = pipe_fds[0], log_path] { CopyToLog(read_fd, log_path); });
    }
  }
  ~Subprocess() {
    if (running()) {
      ::kill(pid_, SIGKILL);
      Wait(std::chrono::seconds(5));
    }
    if (copier_.joinable()) copier_.join();  // EOF once the process is gone
  }
  bool running() const { return pid_ > 0 && !status_.has_value(); }
  pid_t pid() const { return pid_; }
  void Signal(int sig) { if (running()) ::kill(pid_, sig); }
  // The wait status once the process ends within `timeout`.
  std::optional<int> Wait(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!status_.has_value()) {
      int st = 0;
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        status_ = st;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return status_;
  }
  std::string Log() const {
    std::ifstream f(log_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

 private:
  // Appends what the process writes to its log, until it closes its end.
  static void CopyToLog(int read_fd, const std::string& log_path) {
    const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    char buf[4096];
    while (true) {
      const ssize_t n = ::read(read_fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      if (log >= 0 && ::write(log, buf, static_cast<size_t>(n)) < 0) break;
    }
    if (log >= 0) ::close(log);
    ::close(read_fd);
  }

  pid_t pid_ = -1;
  std::string log_;
  std::optional<int> status_;
  std::thread copier_;
};

inline bool WaitForFile(const std::string& path, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!PathExists(path)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The port a service wrote to its --port_file (the file's first line).
inline std::string ReadPortFile(const std::string& path) {
  const std::string p = ReadFile(path);
  return p.substr(0, p.find('\n'));
}

}  // namespace e3::testing

#endif  // E3_TESTS_E2E_SUBPROCESS_H_
