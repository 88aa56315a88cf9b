// A soft file size limit for this process while in scope, with SIGXFSZ
// ignored so that write() fails with EFBIG as it would with ENOSPC on a
// full disk. In-process (no fork): LibTorch's thread pools do not survive
// a fork.
#ifndef E3_TESTS_FILE_SIZE_LIMIT_H_
#define E3_TESTS_FILE_SIZE_LIMIT_H_

#include <sys/resource.h>

#include <csignal>

namespace e3::testing {

class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &old_);
    rlimit lower = old_;
    lower.rlim_cur = bytes;
    ok_ = ::setrlimit(RLIMIT_FSIZE, &lower) == 0;
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  void (*old_handler_)(int) = nullptr;
  bool ok_ = false;
};

}  // namespace e3::testing

#endif  // E3_TESTS_FILE_SIZE_LIMIT_H_
