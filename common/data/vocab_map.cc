#include "common/data/vocab_map.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/safetensors.h"

namespace e3 {
namespace {

constexpr char kD2t[] = "d2t";
constexpr char kT2d[] = "t2d";
constexpr char kMetaDraftVocab[] = "draft_vocab_size";
constexpr char kMetaTargetVocab[] = "target_vocab_size";
constexpr char kMetaCounted[] = "counted_tokens";

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&out, i ? ", " : "", shape[i]);
  return out + "]";
}

// Reads an integer metadata entry, when present, into `value`.
absl::Status ReadMetaInt(const std::map<std::string, std::string>& metadata, const std::string& key,
                         const std::string& path, bool* present, int64_t* value) {
  auto it = metadata.find(key);
  *present = it != metadata.end();
  if (!*present) return absl::OkStatus();
  if (!absl::SimpleAtoi(it->second, value)) {
    return absl::DataLossError(absl::StrCat(path, ": metadata \"", key, "\" is \"", it->second,
                                            "\"; expected an integer"));
  }
  return absl::OkStatus();
}

}  // namespace

TokenCounter::TokenCounter(int64_t target_vocab_size)
    : counts_(static_cast<size_t>(std::max<int64_t>(target_vocab_size, 0)), 0) {}

absl::Status TokenCounter::Add(absl::Span<const int32_t> input_ids,
                               absl::Span<const uint8_t> loss_mask, const std::string& what) {
  if (input_ids.size() != loss_mask.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", input_ids.size(), " input_ids but ",
                                                   loss_mask.size(), " loss_mask values"));
  }
  const int64_t vocab = target_vocab_size();
  // Validate first so a bad sample leaves the counts untouched.
  for (size_t t = 0; t < input_ids.size(); ++t) {
    if (loss_mask[t] && (input_ids[t] < 0 || input_ids[t] >= vocab)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": token ", t, " has id ", input_ids[t],
                                                     "; expected 0 <= id < target vocab ", vocab));
    }
  }
  for (size_t t = 0; t < input_ids.size(); ++t) {
    if (loss_mask[t]) {
      ++counts_[static_cast<size_t>(input_ids[t])];
      ++total_;
    }
  }
  return absl::OkStatus();
}

absl::Status TokenCounter::Add(const Sample& sample) {
  return Add(sample.input_ids, sample.loss_mask,
             absl::StrCat("sample ", sample.id, " (line ", sample.line, ")"));
}

std::vector<int64_t> VocabMap::TargetIds() const {
  std::vector<int64_t> ids(d2t.size());
  for (size_t i = 0; i < d2t.size(); ++i) ids[i] = static_cast<int64_t>(i) + d2t[i];
  return ids;
}

absl::StatusOr<VocabMap> BuildVocabMap(const TokenCounter& counter, int64_t draft_vocab_size) {
  const int64_t vocab = counter.target_vocab_size();
  if (draft_vocab_size < 1 || draft_vocab_size > vocab) {
    return absl::InvalidArgumentError(absl::StrCat("draft vocab size is ", draft_vocab_size,
                                                   "; expected 1 <= size <= target vocab ", vocab));
  }
  const std::vector<int64_t>& counts = counter.counts();
  std::vector<int64_t> seen;
  for (int64_t id = 0; id < vocab; ++id) {
    if (counts[id] > 0) seen.push_back(id);
  }
  // Most frequent first; equal counts go to the lower id so the choice
  // never depends on iteration order.
  auto more_frequent = [&](int64_t a, int64_t b) {
    return counts[a] != counts[b] ? counts[a] > counts[b] : a < b;
  };
  const size_t take = std::min(seen.size(), static_cast<size_t>(draft_vocab_size));
  std::partial_sort(seen.begin(), seen.begin() + take, seen.end(), more_frequent);
  seen.resize(take);

  VocabMap map;
  map.target_vocab_size = vocab;
  map.counted_tokens = counter.total();
  map.t2d.assign(static_cast<size_t>(vocab), 0);
  for (int64_t id : seen) map.t2d[id] = 1;
  // Too few distinct tokens seen: pad with the lowest unused ids, as
  // SpecForge pads with range(draft_vocab_size).
  int64_t chosen = static_cast<int64_t>(seen.size());
  for (int64_t id = 0; id < vocab && chosen < draft_vocab_size; ++id) {
    if (!map.t2d[id]) {
      map.t2d[id] = 1;
      ++chosen;
    }
  }
  map.d2t.reserve(static_cast<size_t>(draft_vocab_size));
  for (int64_t id = 0; id < vocab; ++id) {
    if (map.t2d[id]) map.d2t.push_back(id - static_cast<int64_t>(map.d2t.size()));
  }
  return map;
}

absl::StatusOr<VocabMap> CalibrateVocabMap(absl::Span<const Sample> samples,
                                           int64_t target_vocab_size, int64_t draft_vocab_size) {
  if (target_vocab_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("target vocab size is ", target_vocab_size, "; expected >= 1"));
  }
  TokenCounter counter(target_vocab_size);
  for (const Sample& sample : samples) E3_RETURN_IF_ERROR(counter.Add(sample));
  return BuildVocabMap(counter, draft_vocab_size);
}

absl::Status ValidateVocabMap(const VocabMap& map, const std::string& source) {
  const int64_t vocab = map.target_vocab_size;
  const int64_t n = map.draft_vocab_size();
  auto bad = [&](const std::string& field, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", field, ": ", what));
  };
  if (static_cast<int64_t>(map.t2d.size()) != vocab) {
    return bad(
        kT2d, absl::StrCat("has ", map.t2d.size(), " entries; expected target vocab size ", vocab));
  }
  if (n < 1 || n > vocab) {
    return bad(kD2t, absl::StrCat("has ", n, " entries; expected 1 <= draft vocab <= target vocab ",
                                  vocab));
  }
  int64_t marked = 0;
  for (int64_t id = 0; id < vocab; ++id) {
    if (map.t2d[id] > 1) {
      return bad(kT2d, absl::StrCat("holds ", static_cast<int>(map.t2d[id]), " at id ", id,
                                    "; expected 0 or 1"));
    }
    marked += map.t2d[id];
  }
  int64_t previous = -1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t target = i + map.d2t[i];
    if (target < 0 || target >= vocab) {
      return bad(kD2t, absl::StrCat("entry ", i, " maps to target id ", target,
                                    "; expected 0 <= id < ", vocab));
    }
    if (target <= previous) {
      return bad(kD2t,
                 absl::StrCat("entry ", i, " maps to target id ", target, ", not above entry ",
                              i - 1, "'s ", previous, "; expected strictly increasing target ids"));
    }
    if (!map.t2d[target]) {
      return bad(kT2d, absl::StrCat("is false at target id ", target, ", which d2t entry ", i,
                                    " maps to"));
    }
    previous = target;
  }
  if (marked != n) {
    return bad(kT2d, absl::StrCat("marks ", marked, " target ids but d2t maps ", n,
                                  "; expected them to agree"));
  }
  return absl::OkStatus();
}

absl::Status SaveVocabMap(const VocabMap& map, const std::string& path) {
  E3_RETURN_IF_ERROR(ValidateVocabMap(map, path));
  TensorToWrite d2t;
  d2t.name = kD2t;
  d2t.dtype = DType::kI64;
  d2t.shape = {map.draft_vocab_size()};
  d2t.data.resize(map.d2t.size() * sizeof(int64_t));
  // Little-endian host, as safetensors stores it.
  std::memcpy(d2t.data.data(), map.d2t.data(), d2t.data.size());
  TensorToWrite t2d;
  t2d.name = kT2d;
  t2d.dtype = DType::kBool;
  t2d.shape = {map.target_vocab_size};
  t2d.data = map.t2d;
  std::map<std::string, std::string> metadata = {
      {kMetaDraftVocab, absl::StrCat(map.draft_vocab_size())},
      {kMetaTargetVocab, absl::StrCat(map.target_vocab_size)},
      {kMetaCounted, absl::StrCat(map.counted_tokens)},
  };
  return WriteSafetensors(path, {std::move(d2t), std::move(t2d)}, metadata);
}

absl::StatusOr<VocabMap> LoadVocabMap(const std::string& path) {
  E3_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
  auto tensor_error = [&](const char* name, const std::string& what) {
    return absl::DataLossError(absl::StrCat(path, ": tensor \"", name, "\": ", what));
  };
  E3_ASSIGN_OR_RETURN(TensorView d2t, file->Get(kD2t));
  E3_ASSIGN_OR_RETURN(TensorView t2d, file->Get(kT2d));
  if (d2t.dtype != DType::kI64) {
    return tensor_error(
        kD2t, absl::StrCat("dtype is ", std::string(DTypeName(d2t.dtype)), "; expected I64"));
  }
  if (t2d.dtype != DType::kBool) {
    return tensor_error(
        kT2d, absl::StrCat("dtype is ", std::string(DTypeName(t2d.dtype)), "; expected BOOL"));
  }
  if (d2t.shape.size() != 1) {
    return tensor_error(
        kD2t, absl::StrCat("shape is ", ShapeString(d2t.shape), "; expected [draft_vocab_size]"));
  }
  if (t2d.shape.size() != 1) {
    return tensor_error(
        kT2d, absl::StrCat("shape is ", ShapeString(t2d.shape), "; expected [target_vocab_size]"));
  }
  VocabMap map;
  map.target_vocab_size = t2d.shape[0];
  map.d2t.resize(static_cast<size_t>(d2t.shape[0]));
  if (d2t.nbytes > 0) std::memcpy(map.d2t.data(), d2t.data, d2t.nbytes);
  map.t2d.assign(t2d.data, t2d.data + t2d.nbytes);

  bool present = false;
  int64_t value = 0;
  E3_RETURN_IF_ERROR(ReadMetaInt(file->metadata(), kMetaDraftVocab, path, &present, &value));
  if (present && value != map.draft_vocab_size()) {
    return absl::DataLossError(absl::StrCat(path, ": metadata \"", kMetaDraftVocab, "\" is ", value,
                                            " but tensor \"d2t\" has ", map.draft_vocab_size(),
                                            " entries"));
  }
  E3_RETURN_IF_ERROR(ReadMetaInt(file->metadata(), kMetaTargetVocab, path, &present, &value));
  if (present && value != map.target_vocab_size) {
    return absl::DataLossError(absl::StrCat(path, ": metadata \"", kMetaTargetVocab, "\" is ",
                                            value, " but tensor \"t2d\" has ",
                                            map.target_vocab_size, " entries"));
  }
  E3_RETURN_IF_ERROR(ReadMetaInt(file->metadata(), kMetaCounted, path, &present, &value));
  if (present) map.counted_tokens = value;

  absl::Status valid = ValidateVocabMap(map, path);
  if (!valid.ok()) return absl::DataLossError(valid.message());
  return map;
}

absl::StatusOr<VocabCoverage> ComputeCoverage(const VocabMap& map,
                                              absl::Span<const Sample> samples) {
  VocabCoverage coverage;
  for (const Sample& sample : samples) {
    if (sample.input_ids.size() != sample.loss_mask.size()) {
      return absl::InvalidArgumentError(absl::StrCat("sample ", sample.id, " (line ", sample.line,
                                                     "): input_ids and loss_mask lengths differ"));
    }
    for (size_t t = 0; t < sample.input_ids.size(); ++t) {
      if (!sample.loss_mask[t]) continue;
      const int32_t id = sample.input_ids[t];
      if (id < 0 || id >= map.target_vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("sample ", sample.id, " (line ", sample.line, "): token ", t, " has id ",
                         id, "; expected 0 <= id < target vocab ", map.target_vocab_size));
      }
      ++coverage.loss_tokens;
      coverage.covered += map.t2d[id] ? 1 : 0;
    }
  }
  return coverage;
}

}  // namespace e3
