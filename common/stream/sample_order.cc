#include "common/stream/sample_order.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace e3 {
namespace {

// SplitMix64's increment (2^64 / golden ratio) and output finalizer.
constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Seeds one epoch's stream. Both inputs go through the finalizer so that
// nearby (seed, epoch) pairs give unrelated streams.
uint64_t EpochStreamSeed(uint64_t seed, int64_t epoch) {
  return Mix64(Mix64(seed) ^ (static_cast<uint64_t>(epoch) * kGoldenGamma + kGoldenGamma));
}

}  // namespace

uint64_t SplitMix64::Next() {
  state_ += kGoldenGamma;
  return Mix64(state_);
}

uint64_t SplitMix64::Below(uint64_t bound) {
  // Reject the lowest (2^64 mod bound) values so every residue is equally
  // likely; the loop almost never runs twice.
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    uint64_t r = Next();
    if (r >= threshold) return r % bound;
  }
}

std::vector<int64_t> EpochOrder(int64_t num_samples, uint64_t seed, int64_t epoch) {
  if (num_samples <= 0) return {};
  std::vector<int64_t> order(static_cast<size_t>(num_samples));
  for (int64_t i = 0; i < num_samples; ++i) order[i] = i;
  SplitMix64 rng(EpochStreamSeed(seed, epoch));
  for (int64_t i = num_samples - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

absl::StatusOr<ShardSpec> ShardSpec::Create(int rank, int world) {
  if (world < 1 || world > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size is ", world, "; expected 1 <= world size <= ", kMaxWorldSize));
  }
  if (rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank is ", rank, "; expected 0 <= rank < world size ", world));
  }
  return ShardSpec(rank, world);
}

int64_t ShardSpec::ShareSize(int64_t n) const {
  if (n <= rank_) return 0;
  return (n - rank_ + world_ - 1) / world_;
}

std::string ShardSpec::ToString() const { return absl::StrCat("rank ", rank_, " of ", world_); }

absl::StatusOr<std::vector<int64_t>> ShardForRank(absl::Span<const int64_t> indices, int rank,
                                                  int world) {
  auto shard = ShardSpec::Create(rank, world);
  if (!shard.ok()) return shard.status();
  return shard->ShareOf(indices);
}

absl::StatusOr<std::vector<GlobalBatch>> PackBatches(absl::Span<const int64_t> order,
                                                     absl::Span<const int64_t> lengths,
                                                     const BatcherOptions& options, int64_t epoch) {
  if (options.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch token budget is ", options.max_tokens, "; expected >= 1"));
  }
  if (options.max_samples < 0) {
    return absl::InvalidArgumentError(absl::StrCat("batch sample limit is ", options.max_samples,
                                                   "; expected >= 0 (0: no limit)"));
  }
  const int64_t num_samples = static_cast<int64_t>(lengths.size());
  std::vector<GlobalBatch> batches;
  GlobalBatch current;
  auto close = [&]() {
    if (current.sample_ids.empty()) return;
    current.epoch = epoch;
    current.index = static_cast<int64_t>(batches.size());
    batches.push_back(std::move(current));
    current = GlobalBatch();
  };
  for (size_t pos = 0; pos < order.size(); ++pos) {
    const int64_t id = order[pos];
    if (id < 0 || id >= num_samples) {
      return absl::InvalidArgumentError(absl::StrCat("order position ", pos, " names sample ", id,
                                                     "; expected 0 <= id < ", num_samples));
    }
    const int64_t len = lengths[id];
    if (len < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample ", id, " has length ", len, "; expected >= 1 token"));
    }
    if (len > options.max_tokens) {
      if (options.oversize == OversizePolicy::kError) {
        return absl::InvalidArgumentError(
            absl::StrCat("sample ", id, " has ", len, " tokens, more than the batch budget of ",
                         options.max_tokens, " (raise the budget or cut samples with max_length)"));
      }
      close();
      current.sample_ids.push_back(id);
      current.num_tokens = len;
      close();
      continue;
    }
    const bool over_tokens = current.num_tokens + len > options.max_tokens;
    const bool over_samples =
        options.max_samples > 0 &&
        static_cast<int64_t>(current.sample_ids.size()) >= options.max_samples;
    if (over_tokens || over_samples) close();
    current.sample_ids.push_back(id);
    current.num_tokens += len;
  }
  close();
  return batches;
}

}  // namespace e3
