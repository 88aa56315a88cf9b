// Picks the projections' cuBLASLt algorithms by the time of the whole
// forward's GEMM sequence, once per teacher start (or from a cache file).
//
// Why in sequence: a dense forward can run at the board's power cap
// (bench/results/2026-12-02-teacher-vs-transformers.md), so how fast a GEMM runs depends on the
// clock that the rest of the sequence leaves it. Candidates that win when
// timed alone gain nothing in a forward; judged by the whole sequence,
// some choices do save GEMM time (bench/results/2026-12-02-teacher-kernels-gemm-tuning.md).
//
// What runs: every projection of the forward in order (`sites`, with the
// model's own weights), on random activations of `rows` rows. The
// distinct problems (gemm.h GemmProblem) are the coordinates of a
// coordinate descent: one problem's candidates at a time, the others at
// their current choice, each candidate judged by the median time of the
// whole sequence; a new choice must save `min_gain` of it twice, in the
// scan and again in alternated rounds against the incumbent, where the
// scan's two fastest are confirmed side by side (single timings of a
// sequence vary by ~0.3%).
//
// Exactness: a candidate is admitted only if its outputs equal the
// untuned path's (the heuristic's first choice) bit for bit, at `rows`
// and at the smallest row count the choice will cover. Candidates are the
// heuristic's own, without split-K, so each output is summed over K in
// the same order; the check makes that a fact rather than an assumption.
// A tuned teacher therefore serves exactly what an untuned one does.
#ifndef E3_TEACHER_SERVER_LAYERS_GEMM_TUNING_H_
#define E3_TEACHER_SERVER_LAYERS_GEMM_TUNING_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/torch/gemm.h"
#include "common/torch/torch_core.h"

namespace e3 {

// One projection of the forward, as DecoderLM runs it.
struct GemmSite {
  at::Tensor weight;       // [out, in]
  at::Tensor bias;         // [out] or undefined
  bool residual = false;   // the residual is added in this GEMM's epilogue
};

struct GemmTuningOptions {
  // Rows (tokens) per forward to tune for: the teacher's token budget. The
  // choices cover [GemmTuningResult::min_rows, rows].
  int64_t rows = 8192;
  int max_candidates = 16;  // per problem, the heuristic's first choice included
  int repeats = 3;          // timed sequences per measurement (median), after one untimed
  double min_gain = 0.003;
  int confirm_rounds = 3;
  int passes = 2;
  int confirm_candidates = 2;  // DescentOptions::confirm_candidates
  // A JSON file of earlier tunings (written atomically; several teachers
  // may share one): a record for this device, cuBLASLt version, row count
  // and set of problems is used instead of tuning; a new tuning is added.
  // Empty: no cache.
  std::string cache_path;
  // Progress lines (tuning an 8B model takes about a minute).
  std::function<void(const std::string&)> log;
};

struct TunedProblem {
  GemmProblem problem;
  int sites = 0;          // GEMMs of this problem per forward
  int candidates = 0;     // admitted, the first choice included
  int rejected = 0;       // candidates whose outputs differed from the first choice's
  bool changed = false;   // a candidate other than the heuristic's first choice won
  LtAlgo algo;
  std::string algo_description;
};

// The GEMM sequence at one row count with the tuned choices and with the
// untuned path's (the heuristic's first choice for that row count), ms,
// means of alternated rounds.
struct RowCheck {
  int64_t rows = 0;
  double untuned_ms = 0, tuned_ms = 0;
};

struct GemmTuningResult {
  std::vector<TunedProblem> problems;
  // The choices apply to forwards of [min_rows, rows] rows.
  int64_t rows = 0, min_rows = 0;
  // Where a choice changed, at TuningCheckRows(rows); min_rows is the last
  // of these down to which every check won or tied (within min_gain).
  // Empty from a cache or when nothing changed.
  std::vector<RowCheck> checks;
  bool from_cache = false;
  // Why nothing was tuned (not CUDA, no cuBLASLt problem), else empty.
  std::string skipped;
  // One line for the startup log.
  std::string Summary() const;
};

// Tunes `sites` and installs the choices (SetTunedGemmAlgo) for
// GemmPath::kCublasLtTuned. Sites the cuBLASLt path does not take (CPU,
// fp32, sizes not multiples of 8) are left out; with none left the result
// says why in `skipped`. Errors: invalid options, c10 failures.
absl::StatusOr<GemmTuningResult> TuneGemmsInSequence(const std::vector<GemmSite>& sites,
                                                     const GemmTuningOptions& options);

// The row counts a changed choice is checked at, descending and without
// repeats (each at least 1): the budget,
// two ragged counts below it whose last 128-row tile is partly filled
// (rows - rows/32 - 61, rows*7/8 - 29: tiles fill otherwise than at the
// budget, and there the heuristic may pick another algorithm), 3/4 and
// 1/2 of it; those below rows/2 left out.
std::vector<int64_t> TuningCheckRows(int64_t rows);

// The search itself. counts[p]: candidates of coordinate p, index 0 the
// starting choice; cost(choice) measures one configuration (ms). Returns
// the final choice. Pure, so that its rules are tested on the CPU.
struct DescentOptions {
  double min_gain = 0.003;
  int confirm_rounds = 3;
  int passes = 2;
  // How many of the scan's fastest candidates (each must clear the bar in
  // the scan) go to the alternated confirmation; the fastest mean there
  // wins if it clears the bar again.
  int confirm_candidates = 2;
};
std::vector<int> DescendCoordinates(const std::vector<int>& counts,
                                    const std::function<double(const std::vector<int>&)>& cost,
                                    const DescentOptions& options,
                                    const std::function<void(const std::string&)>& log = {});

// The cache file's records (one per device, library version, rows and set
// of problems). Parse errors name the file and the field.
struct GemmTuningRecord {
  std::string device_name;
  int64_t cublaslt_version = 0;
  int64_t rows = 0, min_rows = 0;
  std::vector<TunedProblem> problems;  // problem.device is not stored (0 on load)
};
absl::StatusOr<std::vector<GemmTuningRecord>> ParseGemmTuningCache(const std::string& text, const std::string& path);
std::string SerializeGemmTuningCache(const std::vector<GemmTuningRecord>& records);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_GEMM_TUNING_H_
