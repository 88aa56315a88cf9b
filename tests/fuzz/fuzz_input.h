// Shared by the libFuzzer harnesses: hostile bytes as the file a parser
// opens (the parsers take paths, as the services give them), and a check
// that aborts, so a broken invariant is a crash the fuzzer keeps.
#ifndef E3_TESTS_FUZZ_FUZZ_INPUT_H_
#define E3_TESTS_FUZZ_FUZZ_INPUT_H_

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/base/file_util.h"

namespace e3::fuzz {

// Writes `data` to `name` in this process's scratch directory (made once,
// removed at exit) and returns its path.
inline std::string AsFile(const uint8_t* data, size_t size, const std::string& name) {
  static const std::string dir = [] {
    std::string d = MakeTempDir("e3fuzz-").value();
    static std::string to_remove = d;
    std::atexit([] { (void)RemoveAll(to_remove); });
    return d;
  }();
  const std::string path = JoinPath(dir, name);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return path;
}

inline std::string AsString(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

inline std::string SourcePath(const std::string& rel) {
  return std::string(E3_SOURCE_DIR) + "/" + rel;
}

}  // namespace e3::fuzz

// An invariant the code under test promises; a violation aborts, which
// libFuzzer reports as a crash and keeps the input.
#define E3_FUZZ_CHECK(cond)                                                             \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

#endif  // E3_TESTS_FUZZ_FUZZ_INPUT_H_
