// A file with the given contents under /tmp, removed when the object goes:
// for tests of readers that take a path (tokenizer.json and the like).
#ifndef E3_TESTS_COMMON_TEMP_FILE_H_
#define E3_TESTS_COMMON_TEMP_FILE_H_

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace e3::testing {

class TempFile {
 public:
  explicit TempFile(const std::string& contents) {
    char name[] = "/tmp/e3_test_file_XXXXXX";
    const int fd = mkstemp(name);
    close(fd);
    path_ = name;
    std::ofstream(path_, std::ios::binary) << contents;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace e3::testing

#endif  // E3_TESTS_COMMON_TEMP_FILE_H_
