#include "teacher_server/generation.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "teacher_server/layers/kv_cache.h"

namespace e3 {
namespace {

// One forward that appends `tokens[s]` to cache sequence `sequences[s]`
// and returns the model's argmax after each sample's last token.
absl::StatusOr<std::vector<int32_t>> AppendAndPredict(CausalLM& model, KvCache& cache,
                                                      const std::vector<int64_t>& sequences,
                                                      const std::vector<std::vector<int32_t>>& tokens) {
  std::vector<int64_t> ids, positions, cu{0};
  for (size_t s = 0; s < sequences.size(); ++s) {
    const int64_t past = cache.lengths()[sequences[s]];
    for (size_t i = 0; i < tokens[s].size(); ++i) {
      ids.push_back(tokens[s][i]);
      positions.push_back(past + static_cast<int64_t>(i));
    }
    cu.push_back(static_cast<int64_t>(ids.size()));
  }
  const at::Device device = model.options().device;
  E3_ASSIGN_OR_RETURN(PackedBatch batch,
                      MakePackedBatch(torch::tensor(ids, torch::kLong), cu, model.config().vocab_size, device));
  batch.position_ids = torch::tensor(positions, torch::kLong).to(device);
  E3_RETURN_IF_ERROR(cache.BeginAppend(sequences, cu));
  ForwardOptions fwd;
  fwd.return_argmax = true;
  fwd.kv_cache = &cache;
  auto out = model.Forward(batch, fwd);
  cache.CommitAppend();
  if (!out.ok()) return out.status();
  const at::Tensor argmax = out->target_argmax.to(at::kCPU, at::kInt);
  std::vector<int32_t> next;
  for (size_t s = 0; s < sequences.size(); ++s) next.push_back(argmax[cu[s + 1] - 1].item<int32_t>());
  return next;
}

// Prefills the prompts of one group in forwards of about prefill_tokens,
// returning each one's first generated token.
absl::StatusOr<std::vector<int32_t>> Prefill(CausalLM& model, KvCache& cache,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             const GreedyOptions& options) {
  std::vector<int32_t> first(prompts.size());
  size_t begin = 0;
  while (begin < prompts.size()) {
    std::vector<int64_t> sequences;
    std::vector<std::vector<int32_t>> tokens;
    int64_t budget = 0;
    for (size_t s = begin; s < prompts.size(); ++s) {
      const int64_t n = static_cast<int64_t>(prompts[s].size());
      if (!sequences.empty() && budget + n > options.prefill_tokens) break;
      sequences.push_back(static_cast<int64_t>(s));
      tokens.push_back(prompts[s]);
      budget += n;
    }
    E3_ASSIGN_OR_RETURN(std::vector<int32_t> next, AppendAndPredict(model, cache, sequences, tokens));
    for (size_t i = 0; i < sequences.size(); ++i) first[sequences[i]] = next[i];
    begin += sequences.size();
  }
  return first;
}

absl::StatusOr<std::vector<std::vector<int32_t>>> GenerateGroup(CausalLM& model,
                                                                const std::vector<std::vector<int32_t>>& prompts,
                                                                const GreedyOptions& options) {
  const ModelConfig& c = model.config();
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  KvCache cache(c.num_hidden_layers, static_cast<int64_t>(prompts.size()), longest + options.max_new_tokens,
                c.num_key_value_heads, c.head_dim,
                torch::TensorOptions().dtype(model.options().dtype).device(model.options().device));
  std::vector<std::vector<int32_t>> out(prompts.size());
  E3_ASSIGN_OR_RETURN(std::vector<int32_t> next, Prefill(model, cache, prompts, options));
  const std::set<int32_t> stop(options.stop_ids.begin(), options.stop_ids.end());
  std::vector<int64_t> active;
  for (size_t s = 0; s < prompts.size(); ++s) active.push_back(static_cast<int64_t>(s));
  while (!active.empty()) {
    if (options.cancel != nullptr && options.cancel->load()) return absl::CancelledError("generation cancelled");
    std::vector<int64_t> still;
    std::vector<std::vector<int32_t>> feed;
    for (size_t i = 0; i < active.size(); ++i) {
      const int64_t s = active[i];
      out[s].push_back(next[i]);
      if (stop.count(next[i]) || static_cast<int64_t>(out[s].size()) >= options.max_new_tokens) continue;
      still.push_back(s);
      feed.push_back({next[i]});
    }
    active = std::move(still);
    if (active.empty()) break;
    E3_ASSIGN_OR_RETURN(next, AppendAndPredict(model, cache, active, feed));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<int32_t>>> GreedyContinuations(CausalLM& model,
                                                                      const std::vector<std::vector<int32_t>>& prompts,
                                                                      const GreedyOptions& options) {
  for (size_t s = 0; s < prompts.size(); ++s) {
    if (prompts[s].empty()) return absl::InvalidArgumentError(absl::StrCat("prompt ", s, " is empty"));
  }
  std::vector<std::vector<int32_t>> out;
  if (options.max_new_tokens <= 0) return std::vector<std::vector<int32_t>>(prompts.size());
  const size_t group = static_cast<size_t>(std::max<int64_t>(1, options.max_sequences));
  for (size_t begin = 0; begin < prompts.size(); begin += group) {
    const size_t end = std::min(prompts.size(), begin + group);
    std::vector<std::vector<int32_t>> part(prompts.begin() + begin, prompts.begin() + end);
    auto done = GenerateGroup(model, part, options);
    if (!done.ok()) {
      return absl::Status(done.status().code(), absl::StrCat("generating prompts ", begin, "..", end - 1, ": ",
                                                            done.status().message()));
    }
    for (auto& c : *done) out.push_back(std::move(c));
    if (options.on_progress) options.on_progress(static_cast<int64_t>(end), static_cast<int64_t>(prompts.size()));
  }
  return out;
}

}  // namespace e3
