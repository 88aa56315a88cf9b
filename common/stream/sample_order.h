// Deterministic sample order, data-parallel sharding and token-budget
// batching. Every teacher and student must agree on which sample lands in
// which batch and on which rank, from (seed, epoch) alone, so nothing here
// depends on the standard library's unspecified RNG algorithms.
#ifndef E3_COMMON_STREAM_SAMPLE_ORDER_H_
#define E3_COMMON_STREAM_SAMPLE_ORDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace e3 {

// SplitMix64 (Steele, Lea, Flood 2014): a tiny generator whose output is
// fully specified, so every platform and compiler sees the same stream.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [0, bound), without modulo bias (rejection sampling).
  // `bound` must be >= 1.
  uint64_t Below(uint64_t bound);

 private:
  uint64_t state_;
};

// A permutation of [0, num_samples), fixed by (seed, epoch): Fisher-Yates
// over a SplitMix64 stream whose seed mixes both. Different epochs give
// different orders. num_samples <= 0 gives an empty order.
std::vector<int64_t> EpochOrder(int64_t num_samples, uint64_t seed, int64_t epoch);

// The most data-parallel ranks one world may have. A peer names its rank
// and world on the wire, so both are bounded before anything is sized by
// them; the teacher's batch ids (teacher_server/engine/engine.h) leave room for
// exactly this many ranks.
constexpr int kMaxWorldSize = 10000;

// One data-parallel rank's place in the world. DESIGN.md: element i of a
// global batch belongs to rank i mod world.
class ShardSpec {
 public:
  // InvalidArgument unless 1 <= world <= kMaxWorldSize and 0 <= rank < world.
  static absl::StatusOr<ShardSpec> Create(int rank, int world);

  int rank() const { return rank_; }
  int world() const { return world_; }
  bool is_first() const { return rank_ == 0; }
  // The rank that owns position `i` of a global batch.
  int OwnerOf(int64_t i) const { return static_cast<int>(i % world_); }
  bool Owns(int64_t i) const { return OwnerOf(i) == rank_; }
  // How many of the first `n` positions this rank owns.
  int64_t ShareSize(int64_t n) const;
  // This rank's elements of a global list, in their global order.
  template <typename T>
  std::vector<T> ShareOf(absl::Span<const T> global) const {
    std::vector<T> out;
    out.reserve(ShareSize(static_cast<int64_t>(global.size())));
    for (size_t i = static_cast<size_t>(rank_); i < global.size(); i += world_)
      out.push_back(global[i]);
    return out;
  }
  template <typename T>
  std::vector<T> ShareOf(const std::vector<T>& global) const {
    return ShareOf(absl::MakeConstSpan(global));
  }
  std::string ToString() const;  // "rank 1 of 4"

 private:
  ShardSpec(int rank, int world) : rank_(rank), world_(world) {}
  int rank_;
  int world_;
};

// Rank `rank`'s share of `indices` (positions rank, rank+world, ...), with
// rank and world validated.
absl::StatusOr<std::vector<int64_t>> ShardForRank(absl::Span<const int64_t> indices, int rank,
                                                  int world);

// What to do with a sample longer than the whole token budget.
enum class OversizePolicy {
  // The sample gets a global batch of its own. Use when the budget is a
  // throughput target rather than a memory limit.
  kOwnBatch,
  // InvalidArgument naming the sample: the budget is a hard memory limit,
  // and a silent oversize batch would run out of memory mid-epoch instead.
  kError,
};

struct BatcherOptions {
  // Upper bound on the summed length of the samples of one global batch.
  int64_t max_tokens = 0;
  // Upper bound on samples per global batch; 0 means no bound.
  int64_t max_samples = 0;
  // Default kError: the dataset's max_length cut keeps samples within the
  // budget, so an oversize sample means mismatched settings.
  OversizePolicy oversize = OversizePolicy::kError;
};

struct GlobalBatch {
  int64_t epoch = 0;
  int64_t index = 0;                // position among this epoch's batches
  std::vector<int64_t> sample_ids;  // in epoch order; shard with ShardSpec
  int64_t num_tokens = 0;           // sum of the samples' lengths
};

// Packs whole samples, in `order`, greedily into global batches: a batch
// closes when the next sample would exceed max_tokens or max_samples.
// `lengths[id]` is sample id's token count (>= 1). Deterministic: the same
// inputs always give the same batches.
absl::StatusOr<std::vector<GlobalBatch>> PackBatches(absl::Span<const int64_t> order,
                                                     absl::Span<const int64_t> lengths,
                                                     const BatcherOptions& options, int64_t epoch);

}  // namespace e3

#endif  // E3_COMMON_STREAM_SAMPLE_ORDER_H_
