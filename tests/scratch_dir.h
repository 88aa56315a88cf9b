// Scratch space for tests under ::testing::TempDir(), named after the test
// process. Each path is removed when the test that asked for it passes,
// and kept, with its path printed, when the test fails: the logs of a
// failure stay to read, and repeated runs do not fill the disk (a full
// CTest run left about 170 directories, 850 MB, under /tmp before).
//
// Ask for scratch only inside a test (its body, SetUp or TearDown): the
// path goes when that test ends.
#ifndef E3_TESTS_SCRATCH_DIR_H_
#define E3_TESTS_SCRATCH_DIR_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "common/base/file_util.h"

namespace e3::testing {

// A gtest listener holding the paths the running test asked for.
class ScratchCleanup : public ::testing::EmptyTestEventListener {
 public:
  // Appended to gtest's listeners on first use; gtest owns it from then on.
  static ScratchCleanup& Get() {
    static ScratchCleanup* const instance = [] {
      auto* cleanup = new ScratchCleanup;
      ::testing::UnitTest::GetInstance()->listeners().Append(cleanup);
      return cleanup;
    }();
    return *instance;
  }

  void Add(const std::string& path) {
    std::lock_guard<std::mutex> lock(mu_);
    paths_.push_back(path);
  }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    std::vector<std::string> paths;
    {
      std::lock_guard<std::mutex> lock(mu_);
      paths.swap(paths_);
    }
    for (const std::string& path : paths) {
      if (info.result()->Failed()) {
        std::fprintf(stderr, "%s.%s failed: its scratch stays at %s\n", info.test_suite_name(), info.name(),
                     path.c_str());
      } else {
        (void)RemoveAll(path);
      }
    }
  }

 private:
  std::mutex mu_;
  std::vector<std::string> paths_;
};

// TempDir()/<name>_<pid><suffix>, created by nobody (a file or directory
// the test makes), removed when the test passes.
inline std::string ScratchPath(const std::string& name, const std::string& suffix = "") {
  const std::string path = JoinPath(::testing::TempDir(), name + "_" + std::to_string(::getpid()) + suffix);
  ScratchCleanup::Get().Add(path);
  return path;
}

// The same path as an empty directory.
inline std::string ScratchDir(const std::string& name) {
  const std::string dir = ScratchPath(name);
  (void)RemoveAll(dir);
  (void)MakeDirs(dir);
  return dir;
}

}  // namespace e3::testing

#endif  // E3_TESTS_SCRATCH_DIR_H_
