// Draft-vocab calibration (DESIGN.md "Draft vocab"), with SpecForge's
// semantics (specforge/data/preprocessing.py, generate_vocab_mapping_file):
// the N target tokens seen most often at trained positions form the draft
// vocab. d2t[i] = target_id - i maps draft id i to its target id, and t2d
// marks the chosen target ids; both ship in the exported checkpoint.
#ifndef E3_COMMON_DATA_VOCAB_MAP_H_
#define E3_COMMON_DATA_VOCAB_MAP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/data/dataset.h"

namespace e3 {

// Counts target token ids at loss_mask == 1 positions.
class TokenCounter {
 public:
  explicit TokenCounter(int64_t target_vocab_size);

  // InvalidArgument when lengths differ, or an id at a trained position
  // lies outside [0, target_vocab_size); `what` names the sample in the
  // message. Nothing is counted from a sample that fails.
  absl::Status Add(absl::Span<const int32_t> input_ids, absl::Span<const uint8_t> loss_mask,
                   const std::string& what = "sample");
  absl::Status Add(const Sample& sample);

  int64_t target_vocab_size() const { return static_cast<int64_t>(counts_.size()); }
  const std::vector<int64_t>& counts() const { return counts_; }
  int64_t total() const { return total_; }  // trained positions counted

 private:
  std::vector<int64_t> counts_;
  int64_t total_ = 0;
};

struct VocabMap {
  int64_t target_vocab_size = 0;
  std::vector<int64_t> d2t;    // [draft_vocab_size]; target id = i + d2t[i]
  std::vector<uint8_t> t2d;    // [target_vocab_size]; 1 where the id is in the draft vocab
  int64_t counted_tokens = 0;  // trained tokens the calibration saw

  int64_t draft_vocab_size() const { return static_cast<int64_t>(d2t.size()); }
  int64_t DraftToTarget(int64_t draft_id) const { return draft_id + d2t[draft_id]; }
  bool InDraft(int64_t target_id) const {
    return target_id >= 0 && target_id < target_vocab_size && t2d[target_id] != 0;
  }
  // The chosen target ids, ascending (draft id order).
  std::vector<int64_t> TargetIds() const;
};

// Picks the draft_vocab_size most frequent ids (ties: lower id first);
// when fewer distinct ids were seen, fills with the lowest unseen ids.
// InvalidArgument unless 1 <= draft_vocab_size <= target vocab.
absl::StatusOr<VocabMap> BuildVocabMap(const TokenCounter& counter, int64_t draft_vocab_size);

// Counts `samples` and builds the map.
absl::StatusOr<VocabMap> CalibrateVocabMap(absl::Span<const Sample> samples,
                                           int64_t target_vocab_size, int64_t draft_vocab_size);

// Checks the invariants LoadVocabMap checks; `source` prefixes messages.
absl::Status ValidateVocabMap(const VocabMap& map, const std::string& source = "vocab map");

// Tensors "d2t" I64 [N] and "t2d" BOOL [V], metadata draft_vocab_size,
// target_vocab_size and counted_tokens.
absl::Status SaveVocabMap(const VocabMap& map, const std::string& path);

// Reads a file SaveVocabMap wrote, or any safetensors holding d2t and t2d
// (an exported draft checkpoint); metadata is checked when present. A
// corrupt file is DataLoss naming the file and the field.
absl::StatusOr<VocabMap> LoadVocabMap(const std::string& path);

struct VocabCoverage {
  int64_t loss_tokens = 0;  // trained positions seen
  int64_t covered = 0;      // of those, ids in the draft vocab
  double fraction() const {
    return loss_tokens == 0 ? 0.0 : static_cast<double>(covered) / loss_tokens;
  }
};

// Fraction of trained target tokens the draft vocab can express: an upper
// bound on the draft's per-token accuracy. Ids outside the target vocab
// are an error naming the sample.
absl::StatusOr<VocabCoverage> ComputeCoverage(const VocabMap& map,
                                              absl::Span<const Sample> samples);

}  // namespace e3

#endif  // E3_COMMON_DATA_VOCAB_MAP_H_
