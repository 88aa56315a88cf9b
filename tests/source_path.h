// A path inside the source tree (E3_SOURCE_DIR, set for every test).
#ifndef E3_TESTS_SOURCE_PATH_H_
#define E3_TESTS_SOURCE_PATH_H_

#include <string>

namespace e3::testing {

inline std::string SourcePath(const std::string& rel) { return std::string(E3_SOURCE_DIR) + "/" + rel; }

}  // namespace e3::testing

#endif  // E3_TESTS_SOURCE_PATH_H_
