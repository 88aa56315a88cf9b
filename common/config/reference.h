// docs/config.md: every setting of settings.h as a Markdown reference,
// section by section (key, type, default, flag, who reads it, help). It is
// generated (`e3_launch --config_reference > docs/config.md`), and a test
// fails when the committed file differs.
#ifndef E3_COMMON_CONFIG_REFERENCE_H_
#define E3_COMMON_CONFIG_REFERENCE_H_

#include <string>

namespace e3 {

std::string ConfigReferenceMarkdown();

}  // namespace e3

#endif  // E3_COMMON_CONFIG_REFERENCE_H_
