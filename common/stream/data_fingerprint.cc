#include "common/stream/data_fingerprint.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

#include <limits>
#include <type_traits>

namespace e3 {
namespace {

template <typename T>
void Compare(const T& a, const T& b, const char* what, std::vector<std::string>* out) {
  if (a == b) return;
  out->push_back(absl::StrCat(what, ": cursor ", a, ", teacher ", b));
}

// A string field as a message shows it (an empty one reads "none").
std::string Shown(const std::string& s) { return s.empty() ? std::string("none") : s; }

}  // namespace

std::string FingerprintHex(uint64_t hash) { return absl::StrFormat("%016x", hash); }

std::vector<std::string> FingerprintDifferences(const DataFingerprint& c, const DataFingerprint& t) {
  std::vector<std::string> d;
  Compare(Shown(c.dataset), Shown(t.dataset), "data file (--data)", &d);
  Compare(Shown(c.chat_template), Shown(t.chat_template),
          "chat template (--chat_template, --chat_template_kwargs, --train_reasoning, --train_on_all_tokens)", &d);
  Compare(Shown(c.samples), Shown(t.samples), "tokenized samples (--max_seq_len, --max_samples, --regenerate)", &d);
  Compare(c.data_seed, t.data_seed, "sample order (--data_seed)", &d);
  Compare(c.epochs, t.epochs, "epochs (--epochs)", &d);
  if (c.num_data_shards != t.num_data_shards || c.data_shard != t.data_shard) {
    d.push_back(absl::StrCat("shard layout (--num_data_shards/--data_shard): cursor ", c.data_shard, " of ",
                             c.num_data_shards, ", teacher ", t.data_shard, " of ", t.num_data_shards));
  }
  Compare(c.tokens_per_batch, t.tokens_per_batch, "token budget (--tokens_per_batch)", &d);
  Compare(Shown(c.draft_vocab), Shown(t.draft_vocab), "draft vocab (--draft_vocab_size, --vocab_map)", &d);
  // The plan is the subscriber's own: its side is the subscription now.
  if (!c.aux_layers.empty() && !t.aux_layers.empty() && c.aux_layers != t.aux_layers) {
    d.push_back(absl::StrCat("aux layers the draft reads (--aux_layer_ids, --draft_algorithm): cursor ", c.aux_layers,
                             ", this subscription ", t.aux_layers));
  }
  if (!c.features.empty() && !t.features.empty() && c.features != t.features) {
    d.push_back(absl::StrCat("tensors the draft reads (--draft_algorithm, --dflash_labels): cursor ", c.features,
                             ", this subscription ", t.features));
  }
  return d;
}

absl::Status CheckSameDataStream(const DataFingerprint& cursor, const DataFingerprint& teacher,
                                 const std::string& who) {
  if (cursor.empty() || teacher.empty()) return absl::OkStatus();
  const std::vector<std::string> differ = FingerprintDifferences(cursor, teacher);
  if (differ.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      who, " was made for another data stream than this teacher serves, so its batch ids would name other samples; ",
      "differs: ", absl::StrJoin(differ, "; "),
      ". Restart the teacher with the run's data and settings and the student with its draft settings, or start the "
      "student afresh (a new --checkpoint_dir)"));
}

nlohmann::json FingerprintToJson(const DataFingerprint& f) {
  return {{"dataset", f.dataset},         {"chat_template", f.chat_template},
          {"samples", f.samples},         {"data_seed", f.data_seed},
          {"epochs", f.epochs},           {"num_data_shards", f.num_data_shards},
          {"data_shard", f.data_shard},   {"tokens_per_batch", f.tokens_per_batch},
          {"draft_vocab", f.draft_vocab}, {"aux_layers", f.aux_layers},
          {"features", f.features}};
}

absl::StatusOr<DataFingerprint> FingerprintFromJson(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return absl::DataLossError(absl::StrCat(where, " is not an object"));
  DataFingerprint f;
  auto text = [&](const char* key, std::string* out) -> absl::Status {
    auto it = j.find(key);
    if (it == j.end()) return absl::OkStatus();
    if (!it->is_string() || it->get<std::string>().size() > 256) {
      return absl::DataLossError(absl::StrCat(where, ".", key, ": expected a string of at most 256 characters"));
    }
    *out = it->get<std::string>();
    return absl::OkStatus();
  };
  auto integer = [&](const char* key, auto* out) -> absl::Status {
    auto it = j.find(key);
    if (it == j.end()) return absl::OkStatus();
    using T = std::remove_pointer_t<decltype(out)>;
    const bool fits = it->is_number_unsigned() ? it->template get<uint64_t>() <= static_cast<uint64_t>(
                                                                                     std::numeric_limits<T>::max())
                                               : it->is_number_integer() && it->template get<int64_t>() >= 0 &&
                                                     it->template get<int64_t>() <= std::numeric_limits<T>::max();
    if (!fits) return absl::DataLossError(absl::StrCat(where, ".", key, ": expected an integer >= 0"));
    *out = it->template get<T>();
    return absl::OkStatus();
  };
  for (auto [key, out] : {std::pair{"dataset", &f.dataset}, {"chat_template", &f.chat_template},
                          {"samples", &f.samples}, {"draft_vocab", &f.draft_vocab},
                          {"aux_layers", &f.aux_layers}, {"features", &f.features}}) {
    if (absl::Status s = text(key, out); !s.ok()) return s;
  }
  for (absl::Status s : {integer("data_seed", &f.data_seed), integer("epochs", &f.epochs),
                         integer("num_data_shards", &f.num_data_shards), integer("data_shard", &f.data_shard),
                         integer("tokens_per_batch", &f.tokens_per_batch)}) {
    if (!s.ok()) return s;
  }
  return f;
}

}  // namespace e3
