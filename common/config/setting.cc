#include "common/config/setting.h"

#include <cmath>
#include <type_traits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config/listen_address.h"
#include "common/model/dtype.h"

namespace e3 {
namespace {

using Kind = Check::Kind;

// ---- Scalars: text to value, value to text.

bool ParseScalar(const std::string& s, bool* out) {
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s));
  if (v != "true" && v != "false") return false;
  *out = v == "true";
  return true;
}
bool ParseScalar(const std::string& s, int64_t* out) { return absl::SimpleAtoi(s, out); }
bool ParseScalar(const std::string& s, uint64_t* out) { return absl::SimpleAtoi(s, out); }
bool ParseScalar(const std::string& s, double* out) { return absl::SimpleAtod(s, out) && std::isfinite(*out); }
bool ParseScalar(const std::string& s, std::string* out) {
  *out = s;
  return true;
}

std::string Text(bool v) { return v ? "true" : "false"; }
std::string Text(int64_t v) { return absl::StrCat(v); }
std::string Text(uint64_t v) { return absl::StrCat(v); }
// The shortest %g text that reads back as the same double.
std::string Text(double v) {
  for (int precision = 1; precision <= 17; ++precision) {
    std::string text = absl::StrFormat("%.*g", precision, v);
    double back = 0;
    if (absl::SimpleAtod(text, &back) && back == v) return text;
  }
  return absl::StrFormat("%.17g", v);
}
std::string Text(const std::string& v) { return v; }

// ---- Checks on parsed values.

bool InRange(const Check& c, double v) {
  if (c.kind == Kind::kRange) return v >= c.lo && v <= c.hi;
  if (c.kind == Kind::kPort) return v >= c.lo && v <= 65535;
  return true;
}

bool Accepts(const Check& c, bool) { return c.kind == Kind::kAny; }
bool Accepts(const Check& c, int64_t v) { return InRange(c, static_cast<double>(v)); }
bool Accepts(const Check& c, uint64_t v) { return InRange(c, static_cast<double>(v)); }
bool Accepts(const Check& c, double v) { return InRange(c, v); }
bool Accepts(const Check& c, const std::string& v) {
  switch (c.kind) {
    case Kind::kChoice:
      for (const std::string& choice : c.choices) {
        if (v == choice) return true;
      }
      return false;
    case Kind::kNonEmpty:
      return !v.empty();
    case Kind::kDtype:
      return v.empty() || ParseComputeDType(v).ok();
    case Kind::kListenAddress:
      return CheckListenAddress(v, "").ok();
    default:
      return true;
  }
}

// ---- Words for what a check expects of a type.

std::string Number(double v) {
  if (v == kMaxInt64) return "2^63 - 1";
  return Text(v);
}

std::string ExpectedInteger(const Check& c) {
  if (c.kind == Kind::kPort) {
    const std::string special = c.lo < 0 ? " (-1: none, 0: a free one)" : (c.lo == 0 ? " (0: a free one)" : "");
    return absl::StrCat("a port in [", Number(c.lo), ", 65535]", special);
  }
  if (c.kind != Kind::kRange) return "an integer";
  if (c.hi >= kMaxInt64) {
    if (c.lo == 1) return "a positive integer";
    if (c.lo == 0) return "a non-negative integer";
    return absl::StrCat("an integer >= ", Number(c.lo));
  }
  return absl::StrCat("an integer in [", Number(c.lo), ", ", Number(c.hi), "]");
}

std::string ExpectedNumber(const Check& c) {
  if (c.kind != Kind::kRange) return "a number";
  if (c.lo == kTiny) return "a positive number";
  if (c.hi == kBelowOne) return absl::StrCat("a number in [", Number(c.lo), ", 1)");
  if (std::isinf(c.hi)) return c.lo == 0 ? "a non-negative number" : absl::StrCat("a number >= ", Number(c.lo));
  return absl::StrCat("a number in [", Number(c.lo), ", ", Number(c.hi), "]");
}

std::string ExpectedString(const Check& c) {
  switch (c.kind) {
    case Kind::kChoice: {
      std::vector<std::string> quoted = c.choices;
      const std::string last = quoted.back();
      quoted.pop_back();
      return quoted.empty() ? last : absl::StrCat(absl::StrJoin(quoted, ", "), " or ", last);
    }
    case Kind::kNonEmpty:
      return "a non-empty string";
    case Kind::kDtype:
      return "float32, bfloat16 or float16";
    case Kind::kPath:
      return "a path";
    case Kind::kListenAddress:
      return "host:port, [ipv6]:port or unix:path, with a port in [0, 65535]";
    default:
      return "a string";
  }
}

std::string Expected(const Check& c, bool) { return "true or false"; }
std::string Expected(const Check& c, int64_t) { return ExpectedInteger(c); }
std::string Expected(const Check& c, uint64_t) { return "a non-negative integer"; }
std::string Expected(const Check& c, double) { return ExpectedNumber(c); }
std::string Expected(const Check& c, const std::string&) { return ExpectedString(c); }
std::string Expected(const Check& c, const std::vector<int64_t>&) {
  return c.lo == 0 ? "a list of non-negative integers" : "a list of integers";
}
std::string Expected(const Check& c, const std::vector<std::string>&) {
  return c.kind == Kind::kWords ? "a list of flags (--name=value)" : "a list";
}

std::string TypeName(bool) { return "bool"; }
std::string TypeName(int64_t) { return "integer"; }
std::string TypeName(uint64_t) { return "integer"; }
std::string TypeName(double) { return "number"; }
std::string TypeName(const std::string&) { return "string"; }
template <typename T>
std::string TypeName(const std::vector<T>&) {
  return "list";
}

// ---- Storing a raw value: scalars and lists.

template <typename T>
bool Store(const RawValue& raw, const Check& check, T* field, std::string* text) {
  T v{};
  if (raw.is_list || !ParseScalar(raw.scalar, &v) || !Accepts(check, v)) return false;
  *field = v;
  *text = Text(v);
  return true;
}

// A list's items: YAML's, or a scalar split at commas or whitespace.
std::vector<std::string> Items(const RawValue& raw, const Check& check) {
  std::vector<std::string> items = raw.items;
  if (!raw.is_list) {
    items = check.kind == Kind::kWords
                ? std::vector<std::string>(absl::StrSplit(raw.scalar, absl::ByAnyChar(" \t\n"), absl::SkipEmpty()))
                : std::vector<std::string>(absl::StrSplit(raw.scalar, ',', absl::SkipWhitespace()));
  }
  for (std::string& item : items) item = std::string(absl::StripAsciiWhitespace(item));
  return items;
}

char Separator(const Check& check) { return check.kind == Kind::kWords ? ' ' : ','; }

template <typename T>
bool Store(const RawValue& raw, const Check& check, std::vector<T>* field, std::string* text) {
  std::vector<T> values;
  for (const std::string& item : Items(raw, check)) {
    T v{};
    if (item.empty() || !ParseScalar(item, &v)) return false;
    if constexpr (std::is_arithmetic_v<T>) {
      if (v < check.lo) return false;
    }
    values.push_back(v);
  }
  *field = values;
  std::vector<std::string> texts;
  for (const T& v : values) texts.push_back(Text(v));
  *text = absl::StrJoin(texts, std::string(1, Separator(check)));
  return true;
}

template <typename T>
RawValue Get(const T& value) {
  RawValue raw;
  raw.scalar = Text(value);
  return raw;
}
template <typename T>
RawValue Get(const std::vector<T>& values) {
  RawValue raw;
  raw.is_list = true;
  for (const T& v : values) raw.items.push_back(Text(v));
  return raw;
}

template <typename T>
constexpr bool kIsList = false;
template <typename T>
constexpr bool kIsList<std::vector<T>> = true;

template <typename Section, typename T>
Setting Declare(const char* section, const char* key, Section RunConfig::*member, T Section::*field, Check check,
                unsigned roles, const char* flag, const char* help) {
  Setting s;
  s.section = section;
  s.key = key;
  s.path = absl::StrCat(section, ".", key);
  const T example{};
  s.type = TypeName(example);
  s.expected = Expected(check, example);
  s.help = help;
  s.roles = roles;
  s.flag = flag;
  s.check = check;
  s.is_bool = std::is_same_v<T, bool>;
  s.is_list = kIsList<T>;
  s.list_separator = Separator(check);
  s.set = [member, field, check](const RawValue& raw, RunConfig& c, std::string* text) {
    return Store(raw, check, &((c.*member).*field), text);
  };
  s.get = [member, field](const RunConfig& c) { return Get((c.*member).*field); };
  s.default_text = ValueText(s, s.get(RunConfig{}));
  return s;
}

std::vector<Setting> Declared() {
  std::vector<Setting> out;
#define E3_SETTING_ROW(Type, key, default_value, check, roles, flag, help) \
  out.push_back(Declare(yaml, #key, member, &SectionT::key, check, roles, flag, help));
#define E3_SETTING_SECTION(Struct, member_name, yaml_name, ROWS) \
  {                                                              \
    using SectionT = Struct;                                     \
    const char* yaml = yaml_name;                                \
    auto member = &RunConfig::member_name;                       \
    ROWS(E3_SETTING_ROW)                                         \
  }
  E3_RUN_CONFIG_SECTIONS(E3_SETTING_SECTION)
#undef E3_SETTING_SECTION
#undef E3_SETTING_ROW
  return out;
}

}  // namespace

std::string RawValue::Describe() const {
  if (!is_list) return absl::StrCat("\"", scalar, "\"");
  return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
}

std::string ValueText(const Setting& setting, const RawValue& value) {
  if (!value.is_list) return value.scalar;
  return absl::StrJoin(value.items, std::string(1, setting.list_separator));
}

const std::vector<Setting>& AllSettings() {
  static const std::vector<Setting>* settings = new std::vector<Setting>(Declared());
  return *settings;
}

const Setting* FindSetting(const std::string& path) {
  for (const Setting& s : AllSettings()) {
    if (s.path == path) return &s;
  }
  return nullptr;
}

const std::vector<std::string>& SettingSections() {
  static const std::vector<std::string>* sections = [] {
    auto* out = new std::vector<std::string>;
    for (const Setting& s : AllSettings()) {
      if (out->empty() || out->back() != s.section) out->push_back(s.section);
    }
    return out;
  }();
  return *sections;
}

const std::vector<DeprecatedFlag>& DeprecatedFlags() {
  static const std::vector<DeprecatedFlag>* flags = new std::vector<DeprecatedFlag>{
      {"seed", kTeacher, "data.seed"},
      {"seed", kStudent, "draft.init_seed"},
      {"max_credit_window", kTeacher, "teachers.credit_window"},
      {"tp_master_addr", kTeacher, "teachers.master_addr"},
      {"tp_master_port", kTeacher, "teachers.master_port"},
  };
  return *flags;
}

const Setting* SettingOfFlag(const std::string& flag, unsigned role, bool* old_spelling) {
  if (old_spelling != nullptr) *old_spelling = false;
  for (const Setting& s : AllSettings()) {
    if (s.ReadBy(role) && s.flag == flag && !flag.empty()) return &s;
  }
  for (const DeprecatedFlag& d : DeprecatedFlags()) {
    if ((d.roles & role) != 0 && d.old_flag == flag) {
      if (old_spelling != nullptr) *old_spelling = true;
      return FindSetting(d.path);
    }
  }
  return nullptr;
}

}  // namespace e3
