// What a setting's value must be, as the rows of settings.h write it, and
// who reads the setting. A check knows nothing of the setting's type: the
// registry (setting.h) applies it to the parsed value and words what was
// expected from it and the type ("an integer in [1, 64]").
#ifndef E3_COMMON_CONFIG_CHECKS_H_
#define E3_COMMON_CONFIG_CHECKS_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace e3 {

// Who reads a setting; or'd in a row.
enum SettingRole : unsigned { kTeacher = 1u, kStudent = 2u, kLauncher = 4u };

inline constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();
inline constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
inline constexpr double kInf = std::numeric_limits<double>::infinity();
// An open upper bound of 1 (AdamW's betas).
inline constexpr double kBelowOne = 0.999999999;
// An open lower bound of 0.
inline constexpr double kTiny = 1e-300;

struct Check {
  enum class Kind {
    kAny,            // any value of the type
    kRange,          // a number in [lo, hi]
    kChoice,         // one of `choices`
    kPath,           // a path (not checked for existence here: the planner and the services do)
    kNonEmpty,       // a non-empty string
    kDtype,          // float32, bfloat16, float16 or empty
    kPort,           // a port in [lo, 65535]
    kListenAddress,  // host:port, [ipv6]:port or unix:path
    kCommas,         // a list; a scalar splits at commas; integer items >= lo
    kWords,          // a list; a scalar splits at whitespace
  };
  Kind kind = Kind::kAny;
  double lo = 0, hi = 0;
  std::vector<std::string> choices;
};

Check Any();
Check Range(double lo, double hi);
// "a|b|c".
Check Choice(const char* choices);
Check Path();
Check NonEmpty();
Check Dtype();
Check Port(int min);
Check ListenAddress();
Check Commas(double min_item = -kInf);
Check Words();

}  // namespace e3

#endif  // E3_COMMON_CONFIG_CHECKS_H_
