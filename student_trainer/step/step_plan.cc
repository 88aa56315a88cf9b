#include "student_trainer/step/step_plan.h"

#include <algorithm>
#include <cstring>

#include <ATen/record_function.h>

#include "common/base/status_macros.h"
#include "student_trainer/step/batch_checks.h"
#include "student_trainer/step/pinned_staging.h"

namespace e3 {
namespace {

// The positions each step's midlayer runs over. Step 0 runs over all of
// them: its keys form every later query's causal block. A row at step j >= 1
// feeds only its own row at later steps, so from step 1 on a position no
// step from j on trains can be left out, once that leaves out enough rows
// to pay for the gathers (the rows then shrink step by step, each step's a
// subset of the previous one's). A step never runs empty: one that trains
// nothing keeps the previous step's first row.
std::vector<std::vector<int64_t>> MidlayerRows(const std::vector<std::vector<char>>& trained,
                                               int64_t tokens, bool skip) {
  constexpr double kMaxKeptFraction = 0.95;
  const int64_t steps = static_cast<int64_t>(trained.size());
  std::vector<std::vector<char>> later(steps);  // some step >= j trains t
  std::vector<char> any(tokens, 0);
  for (int64_t j = steps - 1; j >= 0; --j) {
    for (int64_t t = 0; t < tokens; ++t) any[t] = any[t] || trained[j][t];
    later[j] = any;
  }
  std::vector<std::vector<int64_t>> rows(steps);
  bool compact = false;
  for (int64_t j = 0; j < steps; ++j) {
    const int64_t kept = std::count(later[j].begin(), later[j].end(), 1);
    compact = compact || (skip && j > 0 && kept <= kMaxKeptFraction * tokens);
    rows[j].reserve(compact ? kept : tokens);
    for (int64_t t = 0; t < tokens; ++t) {
      if (!compact || later[j][t]) rows[j].push_back(t);
    }
    if (rows[j].empty()) rows[j].push_back(rows[j - 1].front());
  }
  return rows;
}

// For each of `rows`, its index in `among` (a superset, sorted).
std::vector<int64_t> IndicesAmong(const std::vector<int64_t>& rows, const std::vector<int64_t>& among,
                                  int64_t tokens) {
  std::vector<int64_t> index_of(tokens, -1);
  for (size_t i = 0; i < among.size(); ++i) index_of[among[i]] = static_cast<int64_t>(i);
  std::vector<int64_t> out;
  out.reserve(rows.size());
  for (int64_t t : rows) out.push_back(index_of[t]);
  return out;
}

// rows[0] where the n rows are consecutive integers, else -1.
int64_t FirstOfRange(const int64_t* rows, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (rows[i] != rows[0] + static_cast<int64_t>(i)) return -1;
  }
  return n == 0 ? -1 : rows[0];
}

// Per position: its sample's first and end positions and the sample's index.
struct SampleOf {
  std::vector<int64_t> start, end, sample;
};

SampleOf Samples(const std::vector<int64_t>& cu) {
  const int64_t T = cu.back();
  SampleOf s{std::vector<int64_t>(T), std::vector<int64_t>(T), std::vector<int64_t>(T)};
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    std::fill(s.start.begin() + cu[b], s.start.begin() + cu[b + 1], cu[b]);
    std::fill(s.end.begin() + cu[b], s.end.begin() + cu[b + 1], cu[b + 1]);
    std::fill(s.sample.begin() + cu[b], s.sample.begin() + cu[b + 1], static_cast<int64_t>(b));
  }
  return s;
}

// Copies `bytes` bytes (filled by `fill` into host memory) to a new device
// byte tensor through the device's upload staging buffer.
template <typename Fill>
at::Tensor UploadBytes(int64_t bytes, const at::Device& device, Fill fill) {
  PinnedStaging& s = PinnedStaging::For(device, StagingDirection::kToDevice);
  const at::Tensor pinned = s.Reserve(bytes);
  fill(static_cast<char*>(pinned.data_ptr()));
  at::Tensor on_device = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device));
  on_device.copy_(pinned.narrow(0, 0, bytes), /*non_blocking=*/true);
  s.RecordCopies();
  return on_device;
}

// The plan's two arrays on `device`: the longs, and the row weights in
// `weight_type`.
std::pair<at::Tensor, at::Tensor> UploadArrays(const TttPlan& p, const at::Device& device,
                                               at::ScalarType weight_type) {
  if (!device.is_cuda()) {
    return {torch::tensor(p.longs, torch::kLong),
            torch::tensor(p.row_weights, torch::kDouble).to(weight_type)};
  }
  TORCH_CHECK(weight_type == at::kFloat || weight_type == at::kDouble, "UploadTttPlan: row weights in ",
              weight_type, "; expected float32 or float64");
  const int64_t long_bytes = static_cast<int64_t>(p.longs.size() * sizeof(int64_t));
  const int64_t weights = static_cast<int64_t>(p.row_weights.size());
  const int64_t weight_bytes = weights * static_cast<int64_t>(c10::elementSize(weight_type));
  at::Tensor bytes = UploadBytes(long_bytes + weight_bytes, device, [&](char* dst) {
    std::memcpy(dst, p.longs.data(), static_cast<size_t>(long_bytes));
    if (weight_type == at::kDouble) {
      std::memcpy(dst + long_bytes, p.row_weights.data(), static_cast<size_t>(weight_bytes));
    } else {
      float* w = reinterpret_cast<float*>(dst + long_bytes);
      for (int64_t i = 0; i < weights; ++i) w[i] = static_cast<float>(p.row_weights[static_cast<size_t>(i)]);
    }
  });
  return {bytes.narrow(0, 0, long_bytes).view(at::kLong),
          bytes.narrow(0, long_bytes, weight_bytes).view(weight_type)};
}

}  // namespace

TttPlanInputsDownload::TttPlanInputsDownload(const TeacherBatch& batch) {
  RECORD_USER_SCOPE("e3::ttt_fast::StartPlanInputsDownload");
  at::Tensor* dst[] = {&ids_, &top_, &mask_, &cu_};
  const at::Tensor src[] = {batch.input_ids, batch.target_argmax, batch.loss_mask, batch.cu_seqlens};
  constexpr int64_t kAlign = 64;
  std::vector<int64_t> offsets;
  int64_t bytes = 0;
  for (const at::Tensor& t : src) {
    if (t.device().is_cpu()) continue;
    if (!staged_on_) staged_on_ = t.device();
    if (t.device() != *staged_on_) continue;
    offsets.push_back(bytes);
    bytes += (t.numel() * static_cast<int64_t>(t.element_size()) + kAlign - 1) / kAlign * kAlign;
  }
  PinnedStaging* staging = nullptr;
  at::Tensor pinned;
  if (staged_on_) {
    staging = &PinnedStaging::For(*staged_on_, StagingDirection::kToHost);
    pinned = staging->Reserve(bytes);
  }
  size_t next = 0;
  for (size_t i = 0; i < 4; ++i) {
    const at::Tensor& t = src[i];
    if (!staged_on_ || t.device() != *staged_on_) {
      // On the host already, or (unusually) on a second device: a plain,
      // synchronising copy.
      *dst[i] = t.to(at::kCPU).contiguous();
      continue;
    }
    const int64_t n = t.numel() * static_cast<int64_t>(t.element_size());
    *dst[i] = pinned.narrow(0, offsets[next++], n).view(t.scalar_type()).view(t.sizes());
    dst[i]->copy_(t, /*non_blocking=*/true);
  }
  if (staging != nullptr) staging->RecordCopies();
}

absl::StatusOr<TttPlanInputs> TttPlanInputsDownload::Finish(const Eagle3DraftImpl& draft) {
  if (staged_on_) PinnedStaging::For(*staged_on_, StagingDirection::kToHost).WaitForCopies();
  TttPlanInputs in;
  // Own copies: the pinned buffer is rewritten by the next step's download.
  const at::Tensor cu = cu_.to(at::kLong).clone();
  in.cu.assign(cu.data_ptr<int64_t>(), cu.data_ptr<int64_t>() + cu.numel());
  E3_RETURN_IF_ERROR(CheckCuSeqlens(in.cu, ids_.numel()));
  in.batch.ids = ids_.to(at::kLong).clone();
  in.batch.top = top_.to(at::kLong).clone();
  in.batch.mask = (mask_ != 0).contiguous();
  E3_RETURN_IF_ERROR(CheckIdRange("input_ids", in.batch.ids, draft.config().vocab_size));
  E3_RETURN_IF_ERROR(CheckIdRange("target_argmax", in.batch.top, draft.config().vocab_size));
  return in;
}

TttPlan MakeTttPlan(const std::vector<uint8_t>& t2d, const TttHostBatch& batch, std::vector<int64_t> cu,
                    const TttOptions& options) {
  RECORD_USER_SCOPE("e3::ttt_fast::MakePlan");  // for the profiler: host work the GPU waits for
  TttPlan p;
  p.tokens = cu.back();
  p.length = options.length;
  p.cu = std::move(cu);
  const int64_t T = p.tokens, L = p.length;
  p.pad_rows = static_cast<int64_t>(p.cu.size() - 1) * L;
  const int64_t* id = batch.ids.data_ptr<int64_t>();
  const int64_t* am = batch.top.data_ptr<int64_t>();
  const bool* lm = batch.mask.data_ptr<bool>();
  const SampleOf s = Samples(p.cu);

  // Step 0's masks: a sample's last position has no next token, and a
  // position trains only where the target's next token is in the draft vocab.
  std::vector<char> loss0(T), pos0(T);
  for (int64_t t = 0; t < T; ++t) {
    loss0[t] = lm[t] && t + 1 < s.end[t];
    pos0[t] = loss0[t] && t2d[static_cast<size_t>(am[t + 1 < T ? t + 1 : t])] != 0;
  }
  auto shifted = [&](const std::vector<char>& m, int64_t t, int64_t k) {
    return t + k < s.end[t] && m[t + k];
  };

  std::vector<std::vector<char>> trained(L, std::vector<char>(T));
  for (int64_t j = 0; j < L; ++j) {
    for (int64_t t = 0; t < T; ++t) trained[j][t] = shifted(pos0, t, j);
  }
  const bool all_rows = options.keep_logits || options.keep_token_losses;
  const std::vector<std::vector<int64_t>> mid =
      MidlayerRows(trained, T, options.skip_untrained_rows && !all_rows);

  // Upper bound of the upload: ids and padding, embedding rows, positions,
  // head rows and targets, compacted steps' rows twice, counts, cu.
  p.longs.reserve(static_cast<size_t>(T + p.pad_rows + 5 * L * T + T + 2 * L) + p.cu.size());
  p.longs.insert(p.longs.end(), id, id + T);
  p.longs.insert(p.longs.end(), p.pad_rows, 0);
  // Step j's row t reads position t + j + 1's embedding; past the sample's
  // end, padding row (sample, overshoot): distinct rows, so the steps'
  // gradient sum needs no atomics (ops/step_rows.h).
  for (int64_t j = 0; j < L; ++j) {
    p.mid_rows.push_back(static_cast<int64_t>(mid[j].size()));
    const size_t first = p.longs.size();
    for (int64_t t : mid[j]) {
      const int64_t next = t + j + 1;
      p.longs.push_back(next < s.end[t] ? next : T + s.sample[t] * L + (next - s.end[t]));
    }
    p.embed_first_row.push_back(FirstOfRange(p.longs.data() + first, p.longs.size() - first));
  }
  for (int64_t t = 0; t < T; ++t) p.longs.push_back(t - s.start[t]);
  p.row_weights.reserve(static_cast<size_t>(L * T));
  std::vector<int64_t> rows, targets;
  for (int64_t j = 0; j < L; ++j) {
    rows.clear();
    targets.clear();
    int64_t loss_tokens = 0, position_tokens = 0;
    for (int64_t t = 0; t < T; ++t) {
      loss_tokens += shifted(loss0, t, j);
      position_tokens += trained[j][t];
      if (!trained[j][t] && !all_rows) continue;
      rows.push_back(t);
      targets.push_back(t + j + 1 < s.end[t] ? t + j + 1 : t);
      p.row_weights.push_back(trained[j][t] ? 1.0 : 0.0);
    }
    if (p.compacted(j)) rows = IndicesAmong(rows, mid[j], T);
    p.head_rows.push_back(static_cast<int64_t>(rows.size()));
    p.head_first_row.push_back(FirstOfRange(rows.data(), rows.size()));
    p.longs.insert(p.longs.end(), rows.begin(), rows.end());
    p.longs.insert(p.longs.end(), targets.begin(), targets.end());
    p.loss_tokens.push_back(loss_tokens);
    p.position_tokens.push_back(position_tokens);
  }
  for (int64_t j = 1; j < L; ++j) {
    if (!p.compacted(j)) continue;
    const std::vector<int64_t> from_prev = IndicesAmong(mid[j], mid[j - 1], T);
    p.longs.insert(p.longs.end(), mid[j].begin(), mid[j].end());
    p.longs.insert(p.longs.end(), from_prev.begin(), from_prev.end());
  }
  for (int64_t j = 0; j < L; ++j) {
    p.longs.push_back(p.loss_tokens[j]);
    p.longs.push_back(p.position_tokens[j]);
  }
  p.longs.insert(p.longs.end(), p.cu.begin(), p.cu.end());
  return p;
}

TttDevicePlan UploadTttPlan(const TttPlan& p, const at::Device& device, at::ScalarType weight_type,
                            double step_weight) {
  RECORD_USER_SCOPE("e3::ttt_fast::UploadPlan");
  const std::pair<at::Tensor, at::Tensor> arrays = UploadArrays(p, device, weight_type);
  const at::Tensor &longs = arrays.first, &weights = arrays.second;
  const int64_t T = p.tokens;
  TttDevicePlan d;
  int64_t at = 0;
  auto take = [&](int64_t n) {
    at::Tensor v = longs.narrow(0, at, n);
    at += n;
    return v;
  };
  d.ext_ids = take(T + p.pad_rows);
  for (int64_t j = 0; j < p.length; ++j) d.embed_rows.push_back(take(p.mid_rows[j]));
  d.embed_first_row = p.embed_first_row;
  d.positions = take(T);
  int64_t w_at = 0;
  double sw = 1.0;
  for (int64_t j = 0; j < p.length; ++j) {
    const int64_t n = p.head_rows[j];
    ops::HeadStepRows s;
    s.rows = take(n);
    s.target_rows = take(n);
    s.row_weight = weights.narrow(0, w_at, n);
    s.step_weight = sw;
    s.trained_positions = p.position_tokens[j];
    s.first_row = p.head_first_row[j];
    w_at += n;
    sw *= step_weight;
    d.head.push_back(std::move(s));
  }
  d.mid_positions.resize(p.length);
  d.mid_from_prev.resize(p.length);
  for (int64_t j = 1; j < p.length; ++j) {
    if (!p.compacted(j)) continue;
    d.mid_positions[j] = take(p.mid_rows[j]);
    d.mid_from_prev[j] = take(p.mid_rows[j]);
  }
  d.counts = take(2 * p.length).view({p.length, 2});
  d.cu_seqlens = take(static_cast<int64_t>(p.cu.size()));
  return d;
}

}  // namespace e3
