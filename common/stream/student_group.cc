#include "common/stream/student_group.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace e3 {

absl::Status CheckStudentGroupName(const std::string& name, const std::string& where) {
  if (name.size() > kMaxStudentGroupName) {
    return absl::InvalidArgumentError(absl::StrCat(where, " is ", name.size(), " characters; expected at most ",
                                                   kMaxStudentGroupName));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') {
      return absl::InvalidArgumentError(absl::StrCat(where, " \"", absl::CEscape(name), "\" has '",
                                                     absl::CEscape(std::string(1, c)), "' at ", i,
                                                     "; expected letters, digits, '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

std::string DescribeStudentGroup(const std::string& name) {
  return name.empty() ? std::string("the default student group") : absl::StrCat("student group \"", name, "\"");
}

}  // namespace e3
