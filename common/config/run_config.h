// The run config: one struct per section of settings.h, each field a row
// there with the row's default. Components take their own section
// (`const ScheduleSettings&`, ...), never a repacked copy.
#ifndef E3_COMMON_CONFIG_RUN_CONFIG_H_
#define E3_COMMON_CONFIG_RUN_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/config/settings.h"

namespace e3 {

#define E3_CONFIG_FIELD(Type, key, default_value, ...) Type key = default_value;
#define E3_CONFIG_SECTION_STRUCT(Struct, member, yaml, ROWS) \
  struct Struct {                                          \
    ROWS(E3_CONFIG_FIELD)                                  \
  };
E3_RUN_CONFIG_SECTIONS(E3_CONFIG_SECTION_STRUCT)
#undef E3_CONFIG_SECTION_STRUCT
#undef E3_CONFIG_FIELD

struct RunConfig {
  std::string source;  // where the values came from, for messages

#define E3_CONFIG_SECTION_MEMBER(Struct, member, yaml, ROWS) Struct member;
  E3_RUN_CONFIG_SECTIONS(E3_CONFIG_SECTION_MEMBER)
#undef E3_CONFIG_SECTION_MEMBER

  // The keys a file, an override or a flag set, by dotted path, with their
  // values as text (lists joined by their separator).
  std::map<std::string, std::string> given;
};

}  // namespace e3

#endif  // E3_COMMON_CONFIG_RUN_CONFIG_H_
