#include "common/run_config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <functional>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/dtype.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace e3 {
namespace {

// A value as the file or an override wrote it: a scalar, or a list of
// scalars.
struct Raw {
  bool is_list = false;
  std::string scalar;
  std::vector<std::string> items;
  std::string Describe() const {
    if (!is_list) return absl::StrCat("\"", scalar, "\"");
    return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
  }
};

// One key: its public description, and how a value is read into the
// struct. `parse` stores the value and its flag text, or returns false when
// the value is not what `expected` says.
struct KeyDef {
  RunConfigKey key;
  // Lists: the separator of a scalar's items, and of the flag text.
  char list_separator = 0;
  std::function<bool(const Raw&, RunConfig&, std::string* text)> parse;
};

template <typename T>
using Accessor = std::function<T&(RunConfig&)>;

template <typename Section, typename T>
Accessor<T> Field(Section RunConfig::*section, T Section::*field) {
  return [section, field](RunConfig& c) -> T& { return (c.*section).*field; };
}

RunConfigKey Key(std::string path, std::string expected, std::string teacher_flag,
                 std::string student_flag) {
  return {std::move(path), std::move(expected), std::move(teacher_flag), std::move(student_flag)};
}

KeyDef IntKey(std::string path, Accessor<int64_t> field, int64_t min, int64_t max,
              std::string expected, std::string teacher_flag, std::string student_flag) {
  KeyDef d;
  d.key =
      Key(std::move(path), std::move(expected), std::move(teacher_flag), std::move(student_flag));
  d.parse = [field, min, max](const Raw& raw, RunConfig& c, std::string* text) {
    int64_t v;
    if (raw.is_list || !absl::SimpleAtoi(raw.scalar, &v) || v < min || v > max) return false;
    field(c) = v;
    *text = absl::StrCat(v);
    return true;
  };
  return d;
}

KeyDef SeedKey(std::string path, Accessor<uint64_t> field, std::string teacher_flag,
               std::string student_flag) {
  KeyDef d;
  d.key = Key(std::move(path), "a non-negative integer", std::move(teacher_flag),
              std::move(student_flag));
  d.parse = [field](const Raw& raw, RunConfig& c, std::string* text) {
    uint64_t v;
    if (raw.is_list || !absl::SimpleAtoi(raw.scalar, &v)) return false;
    field(c) = v;
    *text = absl::StrCat(v);
    return true;
  };
  return d;
}

KeyDef DoubleKey(std::string path, Accessor<double> field, double min, double max,
                 std::string expected, std::string student_flag) {
  KeyDef d;
  d.key = Key(std::move(path), std::move(expected), "", std::move(student_flag));
  d.parse = [field, min, max](const Raw& raw, RunConfig& c, std::string* text) {
    double v;
    if (raw.is_list || !absl::SimpleAtod(raw.scalar, &v) || !std::isfinite(v) || v < min ||
        v > max) {
      return false;
    }
    field(c) = v;
    *text = std::string(absl::StripAsciiWhitespace(raw.scalar));
    return true;
  };
  return d;
}

KeyDef BoolKey(std::string path, Accessor<bool> field, std::string teacher_flag) {
  KeyDef d;
  d.key = Key(std::move(path), "true or false", std::move(teacher_flag), "");
  d.parse = [field](const Raw& raw, RunConfig& c, std::string* text) {
    const std::string v = absl::AsciiStrToLower(raw.scalar);
    if (raw.is_list || (v != "true" && v != "false")) return false;
    field(c) = v == "true";
    *text = v;
    return true;
  };
  return d;
}

// A string; `check` (optional) accepts or refuses it.
KeyDef StringKey(std::string path, Accessor<std::string> field, std::string expected,
                 std::string teacher_flag, std::string student_flag,
                 std::function<bool(const std::string&)> check = nullptr) {
  KeyDef d;
  d.key =
      Key(std::move(path), std::move(expected), std::move(teacher_flag), std::move(student_flag));
  d.parse = [field, check](const Raw& raw, RunConfig& c, std::string* text) {
    if (raw.is_list || (check && !check(raw.scalar))) return false;
    field(c) = raw.scalar;
    *text = raw.scalar;
    return true;
  };
  return d;
}

std::function<bool(const std::string&)> OneOf(std::vector<std::string> choices) {
  return [choices](const std::string& v) {
    for (const std::string& c : choices) {
      if (v == c) return true;
    }
    return false;
  };
}

bool IsComputeDtypeOrEmpty(const std::string& v) { return v.empty() || ParseComputeDType(v).ok(); }

// A list of strings; a scalar is split at `separator` (whitespace when it
// is ' ').
KeyDef StringListKey(std::string path, Accessor<std::vector<std::string>> field, char separator,
                     std::string expected) {
  KeyDef d;
  d.key = Key(std::move(path), std::move(expected), "", "");
  d.list_separator = separator;
  d.parse = [field, separator](const Raw& raw, RunConfig& c, std::string* text) {
    std::vector<std::string> items = raw.items;
    if (!raw.is_list) {
      if (separator == ' ') {
        items = absl::StrSplit(raw.scalar, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
      } else {
        items = absl::StrSplit(raw.scalar, separator, absl::SkipWhitespace());
      }
    }
    for (std::string& item : items) {
      item = std::string(absl::StripAsciiWhitespace(item));
      if (item.empty()) return false;
    }
    field(c) = items;
    *text = absl::StrJoin(items, std::string(1, separator == ' ' ? '\n' : separator));
    return true;
  };
  return d;
}

KeyDef IntListKey(std::string path, Accessor<std::vector<int64_t>> field,
                  std::string teacher_flag) {
  KeyDef d;
  d.key = Key(std::move(path), "a list of non-negative integers", std::move(teacher_flag), "");
  d.list_separator = ',';
  d.parse = [field](const Raw& raw, RunConfig& c, std::string* text) {
    std::vector<std::string> items = raw.items;
    if (!raw.is_list) items = absl::StrSplit(raw.scalar, ',', absl::SkipWhitespace());
    std::vector<int64_t> values;
    for (const std::string& item : items) {
      int64_t v;
      if (!absl::SimpleAtoi(item, &v) || v < 0) return false;
      values.push_back(v);
    }
    field(c) = values;
    *text = absl::StrJoin(values, ",");
    return true;
  };
  return d;
}

constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

const std::vector<KeyDef>& KeyDefs() {
  using C = RunConfig;
  static const std::vector<KeyDef>* defs = new std::vector<KeyDef>{
      StringKey("model.dir", Field(&C::model, &C::Model::dir), "a model directory", "model_dir",
                ""),
      StringKey("data.train", Field(&C::data, &C::Data::train), "a jsonl path", "data", ""),
      StringKey("data.eval_prompts", Field(&C::data, &C::Data::eval_prompts), "a jsonl path",
                "eval_prompts", ""),
      IntKey("data.eval_samples", Field(&C::data, &C::Data::eval_samples), 0, kMaxInt64,
             "a non-negative integer", "eval_samples", ""),
      IntKey("data.eval_max_new_tokens", Field(&C::data, &C::Data::eval_max_new_tokens), 1,
             kMaxInt64, "a positive integer", "eval_max_new_tokens", ""),
      IntKey("data.max_seq_len", Field(&C::data, &C::Data::max_seq_len), 1, kMaxInt64,
             "a positive integer", "max_seq_len", ""),
      IntKey("data.max_samples", Field(&C::data, &C::Data::max_samples), 0, kMaxInt64,
             "a non-negative integer", "max_samples", ""),
      IntKey("data.max_line_bytes", Field(&C::data, &C::Data::max_line_bytes), 0, kMaxInt64,
             "a non-negative integer (0: no bound)", "max_line_bytes", ""),
      IntKey("data.epochs", Field(&C::data, &C::Data::epochs), 1, kMaxInt64, "a positive integer",
             "epochs", ""),
      SeedKey("data.seed", Field(&C::data, &C::Data::seed), "data_seed", ""),
      BoolKey("data.train_on_all_tokens", Field(&C::data, &C::Data::train_on_all_tokens),
              "train_on_all_tokens"),
      BoolKey("data.skip_malformed", Field(&C::data, &C::Data::skip_malformed), "skip_malformed"),
      BoolKey("data.regenerate", Field(&C::data, &C::Data::regenerate), "regenerate"),
      StringKey("template.file", Field(&C::chat_template, &C::Template::file), "a .jinja path",
                "chat_template", ""),
      StringKey("template.name", Field(&C::chat_template, &C::Template::name),
                "a chat template name", "chat_template_name", ""),
      StringKey("template.kwargs", Field(&C::chat_template, &C::Template::kwargs),
                "a JSON object or key=value,...", "chat_template_kwargs", ""),
      BoolKey("template.train_reasoning", Field(&C::chat_template, &C::Template::train_reasoning),
              "train_reasoning"),
      IntKey("draft.vocab_size", Field(&C::draft, &C::Draft::vocab_size), 1, kMaxInt64,
             "a positive integer", "draft_vocab_size", ""),
      StringKey("draft.vocab_map", Field(&C::draft, &C::Draft::vocab_map), "a vocab map path",
                "vocab_map", ""),
      StringKey("draft.init_from", Field(&C::draft, &C::Draft::init_from), "a draft export directory",
                "init_from", "init_from"),
      IntListKey("draft.aux_layer_ids", Field(&C::draft, &C::Draft::aux_layer_ids),
                 "aux_layer_ids"),
      IntKey("draft.ttt_length", Field(&C::draft, &C::Draft::ttt_length), 1, 64,
             "an integer in [1, 64]", "", "ttt_length"),
      StringKey("draft.ttt_positions", Field(&C::draft, &C::Draft::ttt_positions),
                "advancing or fixed", "", "ttt_positions", OneOf({"advancing", "fixed"})),
      StringKey("draft.ttt_loss", Field(&C::draft, &C::Draft::ttt_loss),
                "soft_ce, lk_alpha or lk_lambda", "", "ttt_loss", OneOf({"soft_ce", "lk_alpha", "lk_lambda"})),
      DoubleKey("draft.kl_scale", Field(&C::draft, &C::Draft::kl_scale), 0, kInf,
                "a non-negative number", "kl_scale"),
      DoubleKey("draft.kl_decay", Field(&C::draft, &C::Draft::kl_decay), 0, kInf,
                "a non-negative number", "kl_decay"),
      IntKey("draft.intermediate_size", Field(&C::draft, &C::Draft::intermediate_size), 0,
             kMaxInt64, "a non-negative integer", "", "intermediate_size"),
      SeedKey("draft.init_seed", Field(&C::draft, &C::Draft::init_seed), "", "init_seed"),
      StringKey("draft.kernels", Field(&C::draft, &C::Draft::kernels), "fast or reference", "",
                "student_kernels", OneOf({"fast", "reference"})),
      StringKey("draft.dtype", Field(&C::draft, &C::Draft::dtype), "float32, bfloat16 or float16",
                "", "dtype", IsComputeDtypeOrEmpty),
      StringKey("draft.export_dtype", Field(&C::draft, &C::Draft::export_dtype),
                "float32, bfloat16 or float16", "", "export_dtype", IsComputeDtypeOrEmpty),
      IntKey("schedule.tokens_per_batch", Field(&C::schedule, &C::Schedule::tokens_per_batch), 1,
             kMaxInt64, "a positive integer", "tokens_per_batch", ""),
      DoubleKey("schedule.lr", Field(&C::schedule, &C::Schedule::lr), 0, kInf,
                "a non-negative number", "lr"),
      DoubleKey("schedule.min_lr_ratio", Field(&C::schedule, &C::Schedule::min_lr_ratio), 0, 1,
                "a number in [0, 1]", "min_lr_ratio"),
      DoubleKey("schedule.warmup_ratio", Field(&C::schedule, &C::Schedule::warmup_ratio), 0, 1,
                "a number in [0, 1]", "warmup_ratio"),
      IntKey("schedule.warmup_steps", Field(&C::schedule, &C::Schedule::warmup_steps), -1,
             kMaxInt64, "an integer >= -1 (-1: from warmup_ratio)", "", "warmup_steps"),
      DoubleKey("schedule.weight_decay", Field(&C::schedule, &C::Schedule::weight_decay), 0, kInf,
                "a non-negative number", "weight_decay"),
      DoubleKey("schedule.adam_beta1", Field(&C::schedule, &C::Schedule::adam_beta1), 0,
                0.999999999, "a number in [0, 1)", "adam_beta1"),
      DoubleKey("schedule.adam_beta2", Field(&C::schedule, &C::Schedule::adam_beta2), 0,
                0.999999999, "a number in [0, 1)", "adam_beta2"),
      DoubleKey("schedule.grad_clip", Field(&C::schedule, &C::Schedule::grad_clip), 0, kInf,
                "a non-negative number (0: off)", "grad_clip"),
      IntKey("schedule.max_steps", Field(&C::schedule, &C::Schedule::max_steps), 0, kMaxInt64,
             "a non-negative integer (0: until the data ends)", "", "max_steps"),
      IntKey("schedule.checkpoint_every", Field(&C::schedule, &C::Schedule::checkpoint_every), 0,
             kMaxInt64, "a non-negative integer", "", "checkpoint_every"),
      IntKey("schedule.keep_checkpoints", Field(&C::schedule, &C::Schedule::keep_checkpoints), 2,
             kMaxInt, "an integer >= 2 (the newest and its fallback)", "", "keep_checkpoints"),
      StringKey("schedule.on_checkpoint_save_error",
                Field(&C::schedule, &C::Schedule::on_checkpoint_save_error), "stop or continue", "",
                "on_checkpoint_save_error", OneOf({"stop", "continue"})),
      StringKey("schedule.on_checkpoint_load_error",
                Field(&C::schedule, &C::Schedule::on_checkpoint_load_error), "stop or start_fresh",
                "", "on_checkpoint_load_error", OneOf({"stop", "start_fresh"})),
      IntKey("schedule.log_every", Field(&C::schedule, &C::Schedule::log_every), 0, kMaxInt,
             "a non-negative integer", "", "log_every"),
      IntKey("schedule.eval_every", Field(&C::schedule, &C::Schedule::eval_every), 0, kMaxInt64,
             "a non-negative integer", "", "eval_every"),
      IntKey("schedule.eval_chain", Field(&C::schedule, &C::Schedule::eval_chain), 1, 64,
             "an integer in [1, 64]", "", "eval_chain"),
      IntKey("schedule.early_stop_patience", Field(&C::schedule, &C::Schedule::early_stop_patience), 0,
             kMaxInt64, "a non-negative integer (0: never)", "", "early_stop_patience"),
      IntKey("schedule.credit_window", Field(&C::schedule, &C::Schedule::credit_window), 1, 1024,
             "an integer in [1, 1024]", "credit_window", "credit_window"),
      StringListKey("teachers.devices", Field(&C::teachers, &C::Teachers::devices), ',',
                    "a list of GPU indices or cpu"),
      IntKey("teachers.tp", Field(&C::teachers, &C::Teachers::tp), 1, 1024, "a positive integer",
             "tp_size", ""),
      IntKey("teachers.ep", Field(&C::teachers, &C::Teachers::ep), 1, 1024, "a positive integer",
             "ep_size", ""),
      StringKey("teachers.backend", Field(&C::teachers, &C::Teachers::backend), "auto, hf or sgl",
                "backend", "", OneOf({"auto", "hf", "sgl"})),
      StringKey("teachers.dtype", Field(&C::teachers, &C::Teachers::dtype),
                "float32, bfloat16 or float16", "dtype", "", IsComputeDtypeOrEmpty),
      IntKey("teachers.threads", Field(&C::teachers, &C::Teachers::threads), 0, 4096,
             "a non-negative integer (0: LibTorch's default)", "threads", ""),
      StringListKey("teachers.args", Field(&C::teachers, &C::Teachers::args), ' ',
                    "a list of teacher_server flags"),
      // deploy/prometheus/prometheus.yml scrapes a teacher at 9400.
      IntKey("teachers.metrics_port", Field(&C::teachers, &C::Teachers::metrics_port), -1, 65535,
             "a port (teacher group i's rank 0 serves /metrics on it + i; "
             "deploy/prometheus/prometheus.yml scrapes 9400), 0 (a free port) or -1 (none)",
             "", ""),
      StringListKey("students.devices", Field(&C::students, &C::Students::devices), ',',
                    "a list of GPU indices or cpu"),
      IntKey("students.threads", Field(&C::students, &C::Students::threads), 0, 4096,
             "a non-negative integer (0: LibTorch's default)", "", "threads"),
      StringListKey("students.args", Field(&C::students, &C::Students::args), ' ',
                    "a list of student_trainer flags"),
      // deploy/prometheus/prometheus.yml scrapes students at 9500 + rank.
      IntKey("students.metrics_port", Field(&C::students, &C::Students::metrics_port), -1, 65535,
             "a port (student rank r serves /metrics on it + r; deploy/prometheus/prometheus.yml "
             "scrapes 9500 + rank), 0 (a free port) or -1 (none)",
             "", ""),
      StringKey("run.out", Field(&C::run, &C::Run::out), "a directory", "", "",
                [](const std::string& v) { return !v.empty(); }),
      IntKey("run.master_port", Field(&C::run, &C::Run::master_port), 1, 65000,
             "a port in [1, 65000] (unused: the launcher's groups meet through files)", "", ""),
  };
  return *defs;
}

const KeyDef* FindKey(const std::string& path) {
  for (const KeyDef& d : KeyDefs()) {
    if (d.key.path == path) return &d;
  }
  return nullptr;
}

std::string SectionOf(const std::string& path) { return path.substr(0, path.find('.')); }

std::vector<std::string> Sections() {
  std::vector<std::string> out;
  for (const KeyDef& d : KeyDefs()) {
    const std::string s = SectionOf(d.key.path);
    if (out.empty() || out.back() != s) out.push_back(s);
  }
  return out;
}

std::string KnownKeys(const std::string& section) {
  std::vector<std::string> names;
  for (const KeyDef& d : KeyDefs()) {
    if (SectionOf(d.key.path) == section) names.push_back(d.key.path.substr(section.size() + 1));
  }
  return absl::StrJoin(names, ", ");
}

absl::Status KeyError(const std::string& where, const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", path, ": ", what));
}

absl::Status SetKey(const std::string& where, const std::string& path, const Raw& raw,
                    RunConfig& config) {
  const KeyDef* def = FindKey(path);
  if (def == nullptr) {
    const std::string section = SectionOf(path);
    if (path.find('.') == std::string::npos || KnownKeys(section).empty()) {
      return KeyError(
          where, path,
          absl::StrCat("unknown key (sections: ", absl::StrJoin(Sections(), ", "), ")"));
    }
    return KeyError(where, path,
                    absl::StrCat("unknown key (", section, " has: ", KnownKeys(section), ")"));
  }
  std::string text;
  if (!def->parse(raw, config, &text)) {
    return KeyError(where, path,
                    absl::StrCat("expected ", def->key.expected, ", got ", raw.Describe()));
  }
  config.given[path] = text;
  return absl::OkStatus();
}

// A YAML node as a Raw value; false for a map or a list of non-scalars.
bool ToRaw(const YAML::Node& node, Raw* raw) {
  if (node.IsNull()) return true;
  if (node.IsScalar()) {
    raw->scalar = node.Scalar();
    return true;
  }
  if (!node.IsSequence()) return false;
  raw->is_list = true;
  for (const YAML::Node& item : node) {
    if (!item.IsScalar()) return false;
    raw->items.push_back(item.Scalar());
  }
  return true;
}

// YAML leaves a repeated key to the reader; yaml-cpp keeps both and the
// last would silently win, so a key given twice is an error naming both
// lines. `first_line` remembers each name's line (1-based).
absl::Status CheckOnce(const YAML::Node& key, const std::string& path, const std::string& source,
                       std::map<std::string, int>* first_line) {
  const int line = key.Mark().line + 1;
  auto [it, inserted] = first_line->emplace(path, line);
  if (inserted) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(source, ":", line, ": ", path, ": given twice (first on line ", it->second, ")"));
}

absl::Status ReadDocument(const YAML::Node& root, const std::string& source, RunConfig& config) {
  if (root.IsNull()) return absl::OkStatus();
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": expected a map of sections (",
                                                   absl::StrJoin(Sections(), ", "), ")"));
  }
  std::map<std::string, int> seen;
  for (const auto& section : root) {
    const std::string name = section.first.as<std::string>();
    E3_RETURN_IF_ERROR(CheckOnce(section.first, name, source, &seen));
    if (KnownKeys(name).empty()) {
      return KeyError(
          source, name,
          absl::StrCat("unknown section (sections: ", absl::StrJoin(Sections(), ", "), ")"));
    }
    if (section.second.IsNull()) continue;
    if (!section.second.IsMap()) {
      return KeyError(source, name, absl::StrCat("expected a map (keys: ", KnownKeys(name), ")"));
    }
    for (const auto& entry : section.second) {
      const std::string path = absl::StrCat(name, ".", entry.first.as<std::string>());
      E3_RETURN_IF_ERROR(CheckOnce(entry.first, path, source, &seen));
      Raw raw;
      if (!ToRaw(entry.second, &raw)) {
        const KeyDef* def = FindKey(path);
        return KeyError(source, path,
                        absl::StrCat("expected ", def != nullptr ? def->key.expected : "a value",
                                     ", got a map"));
      }
      E3_RETURN_IF_ERROR(SetKey(source, path, raw, config));
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyOverride(const std::string& override_text, RunConfig& config) {
  const std::string where = absl::StrCat("override '", override_text, "'");
  const size_t eq = override_text.find('=');
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected section.key=value"));
  }
  const std::string path(absl::StripAsciiWhitespace(override_text.substr(0, eq)));
  const std::string value = override_text.substr(eq + 1);
  Raw raw;
  raw.scalar = std::string(absl::StripAsciiWhitespace(value));
  // A flow list ([0, 1]) or a quoted string reads as YAML; anything YAML
  // cannot read is taken as written.
  if (absl::StartsWith(raw.scalar, "[") || absl::StartsWith(raw.scalar, "\"") ||
      absl::StartsWith(raw.scalar, "'")) {
    try {
      Raw parsed;
      if (ToRaw(YAML::Load(raw.scalar), &parsed)) raw = parsed;
    } catch (const YAML::Exception&) {
    }
  }
  return SetKey(where, path, raw, config);
}

// A base port whose `count` processes take base, base + 1, ...: the last
// must still be a port.
absl::Status CheckPortRange(const RunConfig& c, const std::string& key, int64_t base,
                            int64_t count, const std::string& what) {
  constexpr int64_t kLastPort = 65535;
  if (base <= 0 || base + count - 1 <= kLastPort) return absl::OkStatus();
  return KeyError(c.source, key,
                  absl::StrCat(base, " + ", count, " ", what, " - 1 = ", base + count - 1,
                               " is past the last port (", kLastPort, ")"));
}

// Checks between keys, once every value is in.
absl::Status CheckConsistent(const RunConfig& c) {
  if (c.teachers.tp % c.teachers.ep != 0) {
    return KeyError(c.source, "teachers.ep",
                    absl::StrCat(c.teachers.ep, " does not divide teachers.tp (", c.teachers.tp,
                                 "): experts are split over a teacher's TP ranks"));
  }
  if (!c.teachers.devices.empty() &&
      static_cast<int64_t>(c.teachers.devices.size()) % c.teachers.tp != 0) {
    return KeyError(
        c.source, "teachers.devices",
        absl::StrCat(c.teachers.devices.size(), " devices do not divide into groups of ",
                     "teachers.tp (", c.teachers.tp, ")"));
  }
  const int64_t teacher_groups = static_cast<int64_t>(c.teachers.devices.size()) / c.teachers.tp;
  E3_RETURN_IF_ERROR(CheckPortRange(c, "teachers.metrics_port", c.teachers.metrics_port,
                                    teacher_groups, "teacher group(s)"));
  return CheckPortRange(c, "students.metrics_port", c.students.metrics_port,
                        static_cast<int64_t>(c.students.devices.size()), "student rank(s)");
}

}  // namespace

const std::vector<RunConfigKey>& RunConfigKeys() {
  static const std::vector<RunConfigKey>* keys = [] {
    auto* out = new std::vector<RunConfigKey>;
    for (const KeyDef& d : KeyDefs()) out->push_back(d.key);
    return out;
  }();
  return *keys;
}

absl::StatusOr<RunConfig> ParseRunConfig(const std::string& yaml, const std::string& source,
                                         const std::vector<std::string>& overrides) {
  RunConfig config;
  config.source = source;
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg));
  }
  E3_RETURN_IF_ERROR(ReadDocument(root, source, config));
  for (const std::string& o : overrides) E3_RETURN_IF_ERROR(ApplyOverride(o, config));
  E3_RETURN_IF_ERROR(CheckConsistent(config));
  return config;
}

absl::StatusOr<RunConfig> LoadRunConfig(const std::string& path,
                                        const std::vector<std::string>& overrides) {
  E3_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseRunConfig(text, path, overrides);
}

absl::StatusOr<std::vector<ServiceFlag>> ServiceFlags(const RunConfig& config, ServiceRole role) {
  std::vector<ServiceFlag> out;
  for (const KeyDef& d : KeyDefs()) {
    const std::string& flag =
        role == ServiceRole::kTeacher ? d.key.teacher_flag : d.key.student_flag;
    auto it = config.given.find(d.key.path);
    if (flag.empty() || it == config.given.end()) continue;
    out.push_back({d.key.path, flag, it->second});
  }
  const bool teacher = role == ServiceRole::kTeacher;
  const std::string key = teacher ? "teachers.args" : "students.args";
  for (const std::string& arg : teacher ? config.teachers.args : config.students.args) {
    if (!absl::StartsWith(arg, "-")) {
      return KeyError(config.source, key,
                      absl::StrCat("expected flags (--name=value), got \"", arg, "\""));
    }
    const std::string body(
        absl::StripLeadingAsciiWhitespace(absl::StripPrefix(absl::StripPrefix(arg, "-"), "-")));
    const size_t eq = body.find('=');
    if (eq != std::string::npos) {
      out.push_back({key, body.substr(0, eq), body.substr(eq + 1)});
    } else {  // a boolean on (or, as --noname, off: the applier tells which)
      out.push_back({key, body, "true"});
    }
  }
  return out;
}

std::string RunConfigToYaml(const RunConfig& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const std::string& section : Sections()) {
    bool open = false;
    for (const KeyDef& d : KeyDefs()) {
      auto it = config.given.find(d.key.path);
      if (SectionOf(d.key.path) != section || it == config.given.end()) continue;
      if (!open) {
        out << YAML::Key << section << YAML::Value << YAML::BeginMap;
        open = true;
      }
      out << YAML::Key << d.key.path.substr(section.size() + 1) << YAML::Value;
      if (d.list_separator != 0) {
        const char sep = d.list_separator == ' ' ? '\n' : d.list_separator;
        const std::vector<std::string> items = absl::StrSplit(it->second, sep, absl::SkipEmpty());
        out << YAML::Flow << items;
      } else {
        out << YAML::DoubleQuoted << it->second;
      }
    }
    if (open) out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace e3
