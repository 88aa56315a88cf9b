#include "student_trainer/ops/head_row_chunks.h"

#include <algorithm>

#include "kernels/student_ops.h"

namespace e3::ops {
namespace {

// The steps to interleave, where every step with rows is a range step and
// at least two of them fit a chunk together; else none.
std::vector<int64_t> InterleavedSteps(const std::vector<HeadStepRows>& steps, int64_t chunk_rows) {
  std::vector<int64_t> runs;
  for (int64_t j = 0; j < static_cast<int64_t>(steps.size()); ++j) {
    if (steps[j].rows.numel() == 0) continue;
    if (steps[j].first_row < 0) return {};
    runs.push_back(j);
  }
  const auto k = static_cast<int64_t>(runs.size());
  return k >= 2 && k <= chunk_rows && k <= kernels::kMaxRowRuns ? runs : std::vector<int64_t>{};
}

// A segment's rows of a step's [T, ...] tensor: a view where they are a
// range, else gathered.
at::Tensor SegmentRows(const at::Tensor& values, const HeadStepRows& st, const Segment& seg) {
  if (st.first_row >= 0) return values.narrow(0, st.first_row + seg.begin, seg.length);
  return values.index_select(0, st.rows.narrow(0, seg.begin, seg.length));
}

// Concatenates; one tensor stays as it is (a view, when its rows were).
at::Tensor CatRows(const std::vector<at::Tensor>& parts) { return parts.size() == 1 ? parts[0] : at::cat(parts, 0); }

}  // namespace

std::vector<Chunk> Chunks(const std::vector<HeadStepRows>& steps, int64_t chunk_rows) {
  std::vector<Chunk> chunks;
  const std::vector<int64_t> runs = InterleavedSteps(steps, chunk_rows);
  if (!runs.empty()) {
    // Each chunk takes up to ceil(longest / pieces) rows of every step: at
    // most chunk_rows + k rows (the steps of a long sample differ by a row).
    int64_t longest = 0;
    for (int64_t j : runs) longest = std::max(longest, steps[j].rows.numel());
    const auto k = static_cast<int64_t>(runs.size());
    const int64_t pieces = (k * longest + chunk_rows - 1) / chunk_rows;
    for (int64_t p = 0; p < pieces; ++p) {
      Chunk c{{}, true};
      for (int64_t j : runs) {
        const int64_t n = steps[j].rows.numel();
        const int64_t begin = std::min(n, longest * p / pieces), end = std::min(n, longest * (p + 1) / pieces);
        c.segments.push_back({j, begin, end - begin});
      }
      chunks.push_back(std::move(c));
    }
    return chunks;
  }
  int64_t filled = chunk_rows;  // the last chunk is closed
  for (int64_t j = 0; j < static_cast<int64_t>(steps.size()); ++j) {
    const int64_t n = steps[j].rows.numel();
    if (n > 0 && steps[j].first_row >= 0) {
      const int64_t pieces = (n + chunk_rows - 1) / chunk_rows;
      for (int64_t p = 0, begin = 0; p < pieces; ++p) {
        const int64_t end = n * (p + 1) / pieces;
        chunks.push_back({{{j, begin, end - begin}}});
        begin = end;
      }
      filled = chunk_rows;
      continue;
    }
    for (int64_t begin = 0; begin < n;) {
      if (filled == chunk_rows) {
        chunks.emplace_back();
        filled = 0;
      }
      const int64_t take = std::min(n - begin, chunk_rows - filled);
      chunks.back().segments.push_back({j, begin, take});
      begin += take;
      filled += take;
    }
  }
  return chunks;
}

at::Tensor StepGradient(const at::Tensor& h, const HeadStepRows& st) {
  if (st.first_row < 0) return at::zeros_like(h);
  at::Tensor g = at::empty(h.sizes(), h.options());
  const int64_t end = st.first_row + st.rows.numel();
  if (st.first_row > 0) g.narrow(0, 0, st.first_row).zero_();
  if (end < h.size(0)) g.narrow(0, end, h.size(0) - end).zero_();
  return g;
}

at::Tensor ChunkGradientView(const std::vector<Segment>& chunk,
                             const std::vector<HeadStepRows>& steps,
                             const std::vector<at::Tensor>& dh) {
  if (chunk.size() != 1 || steps[chunk[0].step].first_row < 0) return {};
  const Segment& seg = chunk[0];
  return dh[seg.step].narrow(0, steps[seg.step].first_row + seg.begin, seg.length);
}

double AcceptanceNorm(const HeadStepRows& step) {
  return 1.0 / std::max(static_cast<double>(step.trained_positions), 1e-8);
}

StepRowConstants RowConstants(const std::vector<HeadStepRows>& steps, int64_t tokens) {
  StepRowConstants k;
  for (int64_t j = 0; j < static_cast<int64_t>(steps.size()); ++j) {
    const HeadStepRows& st = steps[j];
    const int64_t n = st.rows.numel();
    k.grad_scale.push_back(at::full({n}, st.step_weight / static_cast<double>(tokens), st.row_weight.options()));
    k.acc_scale.push_back(at::full({n}, st.step_weight * AcceptanceNorm(st), st.row_weight.options()));
    k.step.push_back(at::full({n}, j, st.target_rows.options()));
  }
  return k;
}

ChunkRows Gather(const std::vector<Segment>& chunk, const std::vector<at::Tensor>& hiddens,
                 const std::vector<HeadStepRows>& steps, const StepRowConstants& k) {
  std::vector<at::Tensor> x, tr, w, s, a, j;
  for (const Segment& seg : chunk) {
    const HeadStepRows& st = steps[seg.step];
    x.push_back(SegmentRows(hiddens[seg.step], st, seg));
    tr.push_back(st.target_rows.narrow(0, seg.begin, seg.length));
    w.push_back(st.row_weight.narrow(0, seg.begin, seg.length));
    s.push_back(k.grad_scale[seg.step].narrow(0, seg.begin, seg.length));
    a.push_back(k.acc_scale[seg.step].narrow(0, seg.begin, seg.length));
    j.push_back(k.step[seg.step].narrow(0, seg.begin, seg.length));
  }
  return {CatRows(x), CatRows(tr), CatRows(w), CatRows(s), CatRows(a), CatRows(j)};
}

void PutRows(at::Tensor& dst, const HeadStepRows& st, const Segment& seg, const at::Tensor& v) {
  if (st.first_row >= 0) {
    dst.narrow(0, st.first_row + seg.begin, seg.length).copy_(v);
  } else {
    dst.index_copy_(0, st.rows.narrow(0, seg.begin, seg.length), v);
  }
}

void KeepRows(const std::vector<Segment>& chunk, const std::vector<HeadStepRows>& steps,
                     const at::Tensor& values, std::vector<at::Tensor>* into) {
  int64_t offset = 0;
  for (const Segment& seg : chunk) {
    at::Tensor& dst = (*into)[seg.step];
    const at::Tensor v = values.narrow(0, offset, seg.length);
    PutRows(dst, steps[seg.step], seg, dst.dim() == 1 ? v.squeeze(1) : v);
    offset += seg.length;
  }
}

void ScatterRows(const std::vector<Segment>& chunk, const std::vector<HeadStepRows>& steps,
                        const at::Tensor& dx, std::vector<at::Tensor>* dh) {
  int64_t offset = 0;
  for (const Segment& seg : chunk) {
    PutRows((*dh)[seg.step], steps[seg.step], seg, dx.narrow(0, offset, seg.length));
    offset += seg.length;
  }
}

}  // namespace e3::ops
