// The value of the unlabelled sample `name` in a Prometheus text
// exposition, or -1 where it is absent.
#ifndef E3_TESTS_METRIC_VALUE_H_
#define E3_TESTS_METRIC_VALUE_H_

#include <string>

namespace e3::testing {

inline double MetricValue(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = ("\n" + text).find(key);
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + key.size() - 1));
}

}  // namespace e3::testing

#endif  // E3_TESTS_METRIC_VALUE_H_
