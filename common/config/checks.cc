#include "common/config/checks.h"

#include "absl/strings/str_split.h"

namespace e3 {
namespace {

Check Of(Check::Kind kind, double lo = 0, double hi = 0) {
  Check c;
  c.kind = kind;
  c.lo = lo;
  c.hi = hi;
  return c;
}

}  // namespace

Check Any() { return Of(Check::Kind::kAny); }
Check Range(double lo, double hi) { return Of(Check::Kind::kRange, lo, hi); }
Check Choice(const char* choices) {
  Check c = Of(Check::Kind::kChoice);
  c.choices = absl::StrSplit(choices, '|');
  return c;
}
Check Path() { return Of(Check::Kind::kPath); }
Check NonEmpty() { return Of(Check::Kind::kNonEmpty); }
Check Dtype() { return Of(Check::Kind::kDtype); }
Check Port(int min) { return Of(Check::Kind::kPort, min, 65535); }
Check ListenAddress() { return Of(Check::Kind::kListenAddress); }
Check Commas(double min_item) { return Of(Check::Kind::kCommas, min_item); }
Check Words() { return Of(Check::Kind::kWords); }

}  // namespace e3
