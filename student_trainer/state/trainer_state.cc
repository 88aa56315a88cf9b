#include "student_trainer/state/trainer_state.h"

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace e3 {
namespace {

using Json = nlohmann::json;

// A value as an error shows it: at most 64 characters of its JSON.
std::string Shown(const Json& value) {
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > 64) text = text.substr(0, 61) + "...";
  return text;
}

// The value at `key` as an integer >= 0; `fallback` when absent and
// `required` is false.
absl::StatusOr<int64_t> NonNegative(const Json& object, const char* key, const std::string& where,
                                    bool required, int64_t fallback = 0) {
  auto it = object.find(key);
  if (it == object.end()) {
    if (!required) return fallback;
    return absl::DataLossError(absl::StrCat(where, key, " is missing; expected an integer >= 0"));
  }
  // A value past int64 parses as unsigned; it is out of range all the same.
  if (!it->is_number_integer() || (it->is_number_unsigned() && it->get<uint64_t>() > INT64_MAX) ||
      it->get<int64_t>() < 0) {
    return absl::DataLossError(
        absl::StrCat(where, key, " is ", Shown(*it), "; expected an integer >= 0"));
  }
  return it->get<int64_t>();
}

}  // namespace

std::string TrainerStateToJson(const TrainerState& state) {
  Json cursors = Json::array();
  for (const StreamCursor& c : state.cursors) {
    Json cursor = {{"epoch", c.epoch}, {"next_batch", c.next_batch}};
    if (c.consumed >= 0) cursor["consumed"] = c.consumed;
    if (!c.data.empty()) cursor["fingerprint"] = FingerprintToJson(c.data);
    cursors.push_back(std::move(cursor));
  }
  Json j = {{"step", state.step},
            {"cursors", cursors},
            {"tokens", state.tokens},
            {"skipped_batches", state.skipped_batches},
            {"subscriber_id", state.subscriber_id}};
  return j.dump(2);
}

absl::StatusOr<TrainerState> ParseTrainerState(const std::string& text, const std::string& source) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError(absl::StrCat(source, ": not a JSON object"));
  }
  const std::string where = absl::StrCat(source, ": ");
  TrainerState st;
  auto step = NonNegative(j, "step", where, true);
  if (!step.ok()) return step.status();
  st.step = *step;
  auto cursors = j.find("cursors");
  if (cursors == j.end() || !cursors->is_array()) {
    return absl::DataLossError(absl::StrCat(where, "cursors is ",
                                            cursors == j.end() ? "missing" : Shown(*cursors),
                                            "; expected an array"));
  }
  for (size_t i = 0; i < cursors->size(); ++i) {
    const Json& c = (*cursors)[i];
    const std::string at = absl::StrCat(where, "cursors[", i, "].");
    if (!c.is_object())
      return absl::DataLossError(absl::StrCat(at.substr(0, at.size() - 1), " is not an object"));
    auto epoch = NonNegative(c, "epoch", at, false);
    if (!epoch.ok()) return epoch.status();
    auto next = NonNegative(c, "next_batch", at, false);
    if (!next.ok()) return next.status();
    auto consumed = NonNegative(c, "consumed", at, false, -1);
    if (!consumed.ok()) return consumed.status();
    StreamCursor cursor{*epoch, *next, {}, *consumed};
    if (c.contains("fingerprint")) {
      auto data = FingerprintFromJson(c["fingerprint"], absl::StrCat(at, "fingerprint"));
      if (!data.ok()) return data.status();
      cursor.data = *data;
    }
    st.cursors.push_back(std::move(cursor));
  }
  auto tokens = NonNegative(j, "tokens", where, false);
  if (!tokens.ok()) return tokens.status();
  st.tokens = *tokens;
  auto skipped = NonNegative(j, "skipped_batches", where, false);
  if (!skipped.ok()) return skipped.status();
  st.skipped_batches = *skipped;
  auto id = j.find("subscriber_id");
  if (id != j.end()) {
    if (!id->is_string()) {
      return absl::DataLossError(
          absl::StrCat(where, "subscriber_id is ", Shown(*id), "; expected a string"));
    }
    st.subscriber_id = id->get<std::string>();
  }
  return st;
}

absl::Status CheckCursorsAgainstSteps(const TrainerState& state, const std::string& source) {
  int64_t taken = 0;
  for (size_t i = 0; i < state.cursors.size(); ++i) {
    const StreamCursor& c = state.cursors[i];
    if (c.consumed < 0) return absl::OkStatus();  // counted nowhere: nothing to hold it to
    const bool in_first_epoch = c.epoch == 0;
    if ((in_first_epoch && c.next_batch != c.consumed) || (!in_first_epoch && c.next_batch > c.consumed)) {
      return absl::DataLossError(absl::StrCat(
          source, ": cursors[", i, "] is at ", c.epoch, ":", c.next_batch, ", but ", c.consumed,
          " batches were taken from that stream; the cursor was edited, or the file belongs to another run"));
    }
    taken += c.consumed;
  }
  if (!state.cursors.empty() && taken != state.step + state.skipped_batches) {
    return absl::DataLossError(absl::StrCat(source, ": ", taken, " batches were taken, but step ", state.step,
                                            " and ", state.skipped_batches,
                                            " skipped batches account for ", state.step + state.skipped_batches,
                                            "; the file was edited, or belongs to another run"));
  }
  return absl::OkStatus();
}

}  // namespace e3
