// CPython embedded in this process, for the one job only Python does
// exactly: rendering Hugging Face chat templates with Jinja2, as
// transformers does (common/text/chat_template.h). The interpreter starts at
// the first call and lives until the process exits; calls from any thread
// run one at a time, each whole (a lock, then the GIL).
//
// Which Python: the libpython this binary links, with its own standard
// library and site-packages. A virtual environment of the same Python
// version is used when $E3_PYTHON names its python3, or else when
// $VIRTUAL_ENV is set (the GPU machine's pip environment).
#ifndef E3_COMMON_TEXT_EMBEDDED_PYTHON_H_
#define E3_COMMON_TEXT_EMBEDDED_PYTHON_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace e3 {

// Loads `source` as the module `module` (the first call for that name;
// later calls reuse it) and returns module.function(*args) for str
// arguments and a str result. A Python exception comes back as
// InvalidArgument "ExceptionType: message" (with the template line for
// Jinja's syntax errors); a missing interpreter or module as
// FailedPrecondition saying what to install.
absl::StatusOr<std::string> CallPython(const std::string& module, std::string_view source,
                                       const std::string& function, const std::vector<std::string>& args);

}  // namespace e3

#endif  // E3_COMMON_TEXT_EMBEDDED_PYTHON_H_
