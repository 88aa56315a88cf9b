#include "common/config/reference.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/config/setting.h"

namespace e3 {
namespace {

std::string ReaderNames(const Setting& s) {
  std::vector<std::string> who;
  if (s.ReadBy(kTeacher)) who.push_back("teacher");
  if (s.ReadBy(kStudent)) who.push_back("student");
  if (s.ReadBy(kLauncher)) who.push_back("launcher");
  return absl::StrJoin(who, ", ");
}

// A table cell: pipes escaped, nothing on a second line.
std::string Cell(const std::string& text) { return absl::StrReplaceAll(text, {{"|", "\\|"}, {"\n", " "}}); }

}  // namespace

std::string ConfigReferenceMarkdown() {
  std::string md =
      "# Configuration reference\n\n"
      "Generated from `common/config/settings.h` by `e3_launch --config_reference`; do not edit by hand "
      "(a test fails when this file differs from the declarations).\n\n"
      "Every setting is a key of the run config (YAML `section: {key: value}`, or a `section.key=value` "
      "override to `e3_launch`) and, for the services that read it, a command-line flag (`--flag=value`, "
      "or `--section.key=value`). A flag on the command line wins over the config file, which wins over "
      "the default.\n";
  std::string section;
  for (const Setting& s : AllSettings()) {
    if (s.section != section) {
      section = s.section;
      absl::StrAppend(&md, "\n## ", section, "\n\n| key | value | default | flag | read by | what it does |\n",
                      "|---|---|---|---|---|---|\n");
    }
    const std::string def = s.default_text.empty() ? "\"\"" : s.default_text;
    const std::string flag = s.flag.empty() ? "" : absl::StrCat("`--", s.flag, "`");
    absl::StrAppend(&md, "| `", s.key, "` | ", Cell(s.expected), " | `", Cell(def), "` | ", flag, " | ",
                    ReaderNames(s), " | ", Cell(s.help), " |\n");
  }
  return md;
}

}  // namespace e3
