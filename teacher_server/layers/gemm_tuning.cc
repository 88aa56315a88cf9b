#include "teacher_server/layers/gemm_tuning.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/gpu/cuda_runtime.h"
#include "nlohmann/json.hpp"

namespace e3 {
namespace {

using nlohmann::json;

constexpr const char* kCacheFormat = "e3-gemm-tuning-1";

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The weights the cuBLASLt path can take (LtGemm's checks on W and the
// bias; the activations the tuner makes itself always pass).
bool OnLtPath(const GemmSite& s) {
  const at::Tensor& w = s.weight;
  if (!w.defined() || !w.is_cuda() || w.dim() != 2 || !w.is_contiguous()) return false;
  const at::ScalarType st = w.scalar_type();
  if (st != at::kBFloat16 && st != at::kHalf) return false;
  if (w.size(0) % 8 != 0 || w.size(1) % 8 != 0) return false;
  const at::Tensor& b = s.bias;
  return !b.defined() || (b.scalar_type() == st && b.dim() == 1 && b.size(0) == w.size(0) && b.is_contiguous() &&
                          b.device() == w.device());
}

GemmProblem ProblemOf(const GemmSite& s) {
  return GemmProblem{s.weight.device().index(), s.weight.scalar_type(), s.weight.size(0), s.weight.size(1),
                     s.bias.defined(), s.residual};
}

// Same shape, whatever the device.
bool SameShape(const GemmProblem& a, const GemmProblem& b) {
  GemmProblem c = b;
  c.device = a.device;
  return a == c;
}

std::string DtypeName(at::ScalarType t) { return t == at::kBFloat16 ? "bfloat16" : "float16"; }

std::string AlgoHex(const LtAlgo& a) {
  std::string out;
  for (uint64_t w : a.words) absl::StrAppend(&out, out.empty() ? "" : ":", absl::StrFormat("%016x", w));
  return out;
}

bool ParseAlgoHex(const std::string& text, LtAlgo* a) {
  if (text.size() != 8 * 16 + 7) return false;
  for (size_t i = 0; i < 8; ++i) {
    const std::string word = text.substr(i * 17, 16);
    if (i < 7 && text[i * 17 + 16] != ':') return false;
    if (word.find_first_not_of("0123456789abcdef") != std::string::npos) return false;
    a->words[i] = std::strtoull(word.c_str(), nullptr, 16);
  }
  return true;
}

// The problems of a tuning, in first-appearance order, and how many sites
// each has.
struct Problems {
  std::vector<GemmProblem> list;
  std::vector<int> sites;
  int IndexOf(const GemmProblem& p) const {
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i] == p) return static_cast<int>(i);
    }
    return -1;
  }
};

// A record of the cache that matches this device, library, rows and set of
// problems, or null.
const GemmTuningRecord* FindRecord(const std::vector<GemmTuningRecord>& records, const std::string& device_name,
                                   int64_t rows, const Problems& problems) {
  for (const GemmTuningRecord& r : records) {
    if (r.device_name != device_name || r.cublaslt_version != CublasLtVersion() || r.rows != rows ||
        r.problems.size() != problems.list.size()) {
      continue;
    }
    bool all = true;
    for (const TunedProblem& t : r.problems) {
      bool found = false;
      for (const GemmProblem& p : problems.list) found = found || SameShape(p, t.problem);
      all = all && found;
    }
    if (all) return &r;
  }
  return nullptr;
}

// Reads the cache; a missing file is an empty cache, an unreadable or
// corrupt one is logged and treated as empty (it is rewritten after the
// tuning).
std::vector<GemmTuningRecord> ReadCache(const GemmTuningOptions& o) {
  if (o.cache_path.empty() || !PathExists(o.cache_path)) return {};
  auto text = ReadFileToString(o.cache_path);
  auto records = text.ok() ? ParseGemmTuningCache(*text, o.cache_path)
                           : absl::StatusOr<std::vector<GemmTuningRecord>>(text.status());
  if (!records.ok()) {
    if (o.log) o.log(absl::StrCat("GEMM tuning cache ignored: ", records.status().message()));
    return {};
  }
  return std::move(records).value();
}

// Writes the cache's `records` with `record` added, replacing one for the
// same device, library, rows and problems. WriteFileAtomically writes a
// file of this process's own and renames it, so teachers sharing the
// cache never read half of one.
absl::Status WriteCache(const GemmTuningOptions& o, std::vector<GemmTuningRecord> records,
                        const GemmTuningRecord& record, const Problems& problems) {
  const GemmTuningRecord* same = FindRecord(records, record.device_name, record.rows, problems);
  if (same != nullptr) records.erase(records.begin() + (same - records.data()));
  records.push_back(record);
  const std::string dir = Dirname(o.cache_path);
  if (!dir.empty()) E3_RETURN_IF_ERROR(MakeDirs(dir));
  return WriteFileAtomically(o.cache_path, SerializeGemmTuningCache(records));
}

absl::Status CheckOptions(const GemmTuningOptions& o) {
  if (o.rows < 16) return absl::InvalidArgumentError(absl::StrCat("GEMM tuning rows ", o.rows, ": expected >= 16"));
  if (o.max_candidates < 1 || o.repeats < 1 || o.confirm_rounds < 1 || o.passes < 1 || o.confirm_candidates < 1) {
    return absl::InvalidArgumentError(
        "GEMM tuning: max_candidates, repeats, confirm_rounds, passes and confirm_candidates must be >= 1");
  }
  if (!(o.min_gain >= 0 && o.min_gain < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("GEMM tuning min_gain ", o.min_gain, ": expected [0, 1)"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string GemmTuningResult::Summary() const {
  if (!skipped.empty()) return absl::StrCat("GEMM algorithms not tuned: ", skipped);
  int changed = 0;
  std::string which;
  for (const TunedProblem& p : problems) {
    if (!p.changed) continue;
    ++changed;
    absl::StrAppend(&which, which.empty() ? "" : "; ", p.problem.Name(), " x", p.sites, ": ", p.algo_description);
  }
  std::string line = absl::StrCat("GEMM algorithms for ", min_rows, "-", rows, " rows",
                                  from_cache ? " (from the cache)" : "", ": ", changed, " of ", problems.size(),
                                  " problems off the heuristic's first choice");
  if (!which.empty()) absl::StrAppend(&line, " (", which, ")");
  for (const RowCheck& c : checks) {
    absl::StrAppend(&line, &c == &checks.front() ? "; GEMM sequence against the heuristic's: " : ", ", c.rows,
                    absl::StrFormat(" rows %.2f -> %.2f ms (%.3fx)", c.untuned_ms, c.tuned_ms,
                                    c.untuned_ms / c.tuned_ms));
  }
  return line;
}

std::vector<int64_t> TuningCheckRows(int64_t rows) {
  std::vector<int64_t> out;
  for (int64_t n : {rows, rows - rows / 32 - 61, rows * 7 / 8 - 29, rows * 3 / 4, rows / 2}) {
    if (n >= 1 && n >= rows / 2) out.push_back(n);
  }
  std::sort(out.rbegin(), out.rend());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int> DescendCoordinates(const std::vector<int>& counts,
                                    const std::function<double(const std::vector<int>&)>& cost,
                                    const DescentOptions& options,
                                    const std::function<void(const std::string&)>& log) {
  std::vector<int> best(counts.size(), 0);
  for (int pass = 0; pass < options.passes; ++pass) {
    bool moved = false;
    for (size_t p = 0; p < counts.size(); ++p) {
      if (counts[p] < 2) continue;
      const double incumbent = cost(best);
      // The scan: every other candidate once; those that clear the bar,
      // fastest first, become contenders.
      std::vector<std::pair<double, int>> scanned;
      for (int c = 0; c < counts[p]; ++c) {
        if (c == best[p]) continue;
        std::vector<int> trial = best;
        trial[p] = c;
        const double t = cost(trial);
        if (t <= incumbent * (1 - options.min_gain)) scanned.emplace_back(t, c);
      }
      if (scanned.empty()) continue;
      std::sort(scanned.begin(), scanned.end());
      const size_t contenders_max = static_cast<size_t>(std::max(1, options.confirm_candidates));
      if (scanned.size() > contenders_max) scanned.resize(contenders_max);
      // The scan's minimum of many noisy timings is biased low, and its
      // runner-up may be the real winner: confirm the contenders against
      // the incumbent in alternated rounds.
      std::vector<double> with(scanned.size(), 0);
      double without = 0;
      for (int r = 0; r < options.confirm_rounds; ++r) {
        for (size_t k = 0; k < scanned.size(); ++k) {
          std::vector<int> trial = best;
          trial[p] = scanned[k].second;
          with[k] += cost(trial);
        }
        without += cost(best);
      }
      const size_t winner = static_cast<size_t>(std::min_element(with.begin(), with.end()) - with.begin());
      const bool keep = with[winner] < without * (1 - options.min_gain);
      std::vector<int> trial = best;
      trial[p] = scanned[winner].second;
      if (log) {
        std::string contenders;
        for (size_t k = 0; k < scanned.size(); ++k) {
          absl::StrAppend(&contenders, k == 0 ? "" : ", ",
                          absl::StrFormat("candidate %d %.3f ms", scanned[k].second, with[k] / options.confirm_rounds));
        }
        log(absl::StrFormat("  coordinate %d: %s against %d %.3f ms (means of %d alternated rounds): %s",
                            static_cast<int>(p), contenders, best[p], without / options.confirm_rounds,
                            options.confirm_rounds,
                            keep ? absl::StrCat("candidate ", scanned[winner].second, " taken") : "kept"));
      }
      if (keep) {
        best = trial;
        moved = true;
      }
    }
    if (!moved) break;
  }
  return best;
}

absl::StatusOr<GemmTuningResult> TuneGemmsInSequence(const std::vector<GemmSite>& sites,
                                                     const GemmTuningOptions& options) {
  E3_RETURN_IF_ERROR(CheckOptions(options));
  GemmTuningResult result;
  result.rows = options.rows;
  result.min_rows = options.rows / 2;
  Problems problems;
  std::vector<const GemmSite*> lt_sites;
  for (const GemmSite& s : sites) {
    if (!OnLtPath(s)) continue;
    lt_sites.push_back(&s);
    const GemmProblem p = ProblemOf(s);
    const int i = problems.IndexOf(p);
    if (i < 0) {
      problems.list.push_back(p);
      problems.sites.push_back(1);
    } else {
      ++problems.sites[static_cast<size_t>(i)];
    }
  }
  if (problems.list.empty()) {
    result.skipped = "no projection on the cuBLASLt path (it needs CUDA and bf16/fp16 weights)";
    return result;
  }
  const int device = problems.list[0].device;
  const std::string device_name = CudaDeviceName(device);
  const int64_t rows = options.rows, half = options.rows / 2;
  auto log = [&](const std::string& line) {
    if (options.log) options.log(line);
  };

  const std::vector<GemmTuningRecord> cached = ReadCache(options);
  if (const GemmTuningRecord* r = FindRecord(cached, device_name, rows, problems); r != nullptr) {
    for (const TunedProblem& t : r->problems) {
      for (size_t i = 0; i < problems.list.size(); ++i) {
        if (!SameShape(problems.list[i], t.problem)) continue;
        TunedProblem tp = t;
        tp.problem = problems.list[i];
        tp.sites = problems.sites[i];
        if (tp.changed) SetTunedGemmAlgo(tp.problem, r->min_rows, r->rows, tp.algo);
        result.problems.push_back(tp);
      }
    }
    result.min_rows = r->min_rows;
    result.from_cache = true;
    return result;
  }

  try {
    torch::NoGradGuard no_grad;
    // Activations of unit scale (the normed hidden states' order): random
    // mantissas draw the power real operands do, which constant inputs
    // would not.
    std::map<int64_t, at::Tensor> x_by_in, residual_by_out;
    for (const GemmProblem& p : problems.list) {
      const auto opts = at::TensorOptions().dtype(p.dtype).device(at::Device(at::kCUDA, p.device));
      if (!x_by_in.count(p.in)) x_by_in[p.in] = torch::randn({rows, p.in}, opts);
      if (p.residual && !residual_by_out.count(p.out)) residual_by_out[p.out] = torch::randn({rows, p.out}, opts);
    }
    auto gemm = [&](const GemmSite& s, int64_t n, GemmPath path) {
      const at::Tensor r = s.residual ? residual_by_out.at(s.weight.size(0)).narrow(0, 0, n) : at::Tensor();
      return Gemm(x_by_in.at(s.weight.size(1)).narrow(0, 0, n), s.weight, s.bias, r, path);
    };

    // Each problem's candidates, the heuristic's first choice first; only
    // those that reproduce the untuned path's bits.
    std::vector<std::vector<LtAlgo>> candidates(problems.list.size());
    result.problems.resize(problems.list.size());
    for (size_t i = 0; i < problems.list.size(); ++i) {
      const GemmProblem& p = problems.list[i];
      TunedProblem& t = result.problems[i];
      t.problem = p;
      t.sites = problems.sites[i];
      const GemmSite* site = nullptr;
      for (const GemmSite* s : lt_sites) {
        if (site == nullptr && ProblemOf(*s) == p) site = s;
      }
      const std::vector<LtAlgo> all = LtCandidates(p, rows, options.max_candidates);
      const at::Tensor want = gemm(*site, rows, GemmPath::kCublasLt);
      const at::Tensor want_half = gemm(*site, half, GemmPath::kCublasLt);
      for (size_t c = 0; c < all.size(); ++c) {
        if (c > 0) {
          SetTunedGemmAlgo(p, 1, std::numeric_limits<int64_t>::max(), all[c]);
          const bool same = gemm(*site, rows, GemmPath::kCublasLtTuned).equal(want) &&
                            gemm(*site, half, GemmPath::kCublasLtTuned).equal(want_half);
          ClearTunedGemmAlgo(p);
          if (!same) {
            ++t.rejected;
            continue;
          }
        }
        candidates[i].push_back(all[c]);
      }
      t.candidates = static_cast<int>(candidates[i].size());
      if (!candidates[i].empty()) {
        t.algo = candidates[i][0];
        t.algo_description = DescribeLtAlgo(t.algo);
      }
      log(absl::StrCat("  ", p.Name(), " x", t.sites, ": ", t.candidates, " candidates (", t.rejected,
                       " rejected: other bits than the first choice)"));
    }

    // Time of the whole sequence at n rows with candidate choice[i] for
    // problem i: the median of `repeats` after one untimed run (which also
    // pays cuBLASLt's per-shape checks).
    auto install = [&](const std::vector<int>& choice) {
      for (size_t i = 0; i < problems.list.size(); ++i) {
        if (candidates[i].empty()) continue;
        SetTunedGemmAlgo(problems.list[i], 1, std::numeric_limits<int64_t>::max(),
                         candidates[i][static_cast<size_t>(choice[i])]);
      }
    };
    // With kCublasLt the untuned path runs (the heuristic's choice for each
    // exact row count), whatever `choice` says.
    auto sequence_ms = [&](const std::vector<int>& choice, int64_t n, GemmPath path) {
      if (path == GemmPath::kCublasLtTuned) install(choice);
      auto run = [&] {
        for (const GemmSite* s : lt_sites) (void)gemm(*s, n, path);
        torch::cuda::synchronize(device);
      };
      run();
      std::vector<double> ms;
      for (int r = 0; r < options.repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        run();
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      return Median(ms);
    };

    std::vector<int> counts;
    for (const auto& c : candidates) counts.push_back(static_cast<int>(c.size()));
    log(absl::StrCat("tuning the GEMM algorithms of ", lt_sites.size(), " projections (", problems.list.size(),
                     " problems) at ", rows, " rows on ", device_name));
    const DescentOptions descent{options.min_gain, options.confirm_rounds, options.passes,
                                 options.confirm_candidates};
    std::vector<int> choice = DescendCoordinates(
        counts, [&](const std::vector<int>& c) { return sequence_ms(c, rows, GemmPath::kCublasLtTuned); }, descent,
        log);
    const std::vector<int> first(problems.list.size(), 0);
    // Where the choice holds: the tuned set against the untuned path in
    // alternated rounds at TuningCheckRows (packed batches rarely fill the
    // budget exactly, and the heuristic picks per row count). The range
    // reaches down only as far as every check wins or ties.
    if (choice != first) {
      for (int64_t n : TuningCheckRows(rows)) {
        RowCheck check{n, 0, 0};
        for (int r = 0; r < options.confirm_rounds; ++r) {
          check.untuned_ms += sequence_ms(choice, n, GemmPath::kCublasLt) / options.confirm_rounds;
          check.tuned_ms += sequence_ms(choice, n, GemmPath::kCublasLtTuned) / options.confirm_rounds;
        }
        log(absl::StrFormat("  check at %d rows: tuned %.3f ms, untuned %.3f ms (%.4fx)", n, check.tuned_ms,
                            check.untuned_ms, check.untuned_ms / check.tuned_ms));
        result.checks.push_back(check);
      }
      result.min_rows = rows;
      for (const RowCheck& c : result.checks) {
        if (c.tuned_ms > c.untuned_ms * (1 + options.min_gain)) break;
        result.min_rows = c.rows;
      }
      // Lost even at the budget (the descent's gain was noise): keep the
      // heuristic's choices.
      if (result.checks.front().tuned_ms > result.checks.front().untuned_ms * (1 + options.min_gain)) choice = first;
    }
    // Only the changed problems are installed: elsewhere the untuned path's
    // own per-shape choice stays (it may differ between row counts).
    for (size_t i = 0; i < problems.list.size(); ++i) {
      ClearTunedGemmAlgo(problems.list[i]);
      TunedProblem& t = result.problems[i];
      if (candidates[i].empty()) continue;
      t.changed = choice[i] != 0;
      t.algo = candidates[i][static_cast<size_t>(choice[i])];
      t.algo_description = DescribeLtAlgo(t.algo);
      if (t.changed) SetTunedGemmAlgo(t.problem, result.min_rows, rows, t.algo);
    }
  } catch (const c10::Error& e) {
    for (const GemmProblem& p : problems.list) ClearTunedGemmAlgo(p);
    return absl::InternalError(absl::StrCat("GEMM tuning: ", e.what_without_backtrace()));
  }

  if (!options.cache_path.empty()) {
    GemmTuningRecord record{device_name, CublasLtVersion(), rows, result.min_rows, result.problems};
    if (absl::Status st = WriteCache(options, cached, record, problems); !st.ok()) {
      log(absl::StrCat("GEMM tuning cache not written: ", st.message()));
    }
  }
  return result;
}

std::string SerializeGemmTuningCache(const std::vector<GemmTuningRecord>& records) {
  json root;
  root["format"] = kCacheFormat;
  root["records"] = json::array();
  for (const GemmTuningRecord& r : records) {
    json rec;
    rec["device"] = r.device_name;
    rec["cublaslt_version"] = r.cublaslt_version;
    rec["rows"] = r.rows;
    rec["min_rows"] = r.min_rows;
    rec["problems"] = json::array();
    for (const TunedProblem& t : r.problems) {
      rec["problems"].push_back({{"dtype", DtypeName(t.problem.dtype)},
                                 {"out", t.problem.out},
                                 {"in", t.problem.in},
                                 {"bias", t.problem.bias},
                                 {"residual", t.problem.residual},
                                 {"sites", t.sites},
                                 {"changed", t.changed},
                                 {"algo", AlgoHex(t.algo)},
                                 {"description", t.algo_description}});
    }
    root["records"].push_back(std::move(rec));
  }
  return root.dump(1) + "\n";
}

absl::StatusOr<std::vector<GemmTuningRecord>> ParseGemmTuningCache(const std::string& text, const std::string& path) {
  const json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  if (!root.contains("format") || root["format"] != kCacheFormat) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": field \"format\": expected \"", kCacheFormat, "\""));
  }
  if (!root.contains("records") || !root["records"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": field \"records\": expected an array"));
  }
  std::vector<GemmTuningRecord> out;
  const json& records = root["records"];
  for (size_t i = 0; i < records.size(); ++i) {
    const json& r = records[i];
    const std::string where = absl::StrCat(path, ": records[", i, "]");
    auto field = [&](const json& obj, const std::string& loc, const char* name,
                     json::value_t type) -> absl::StatusOr<const json*> {
      const bool number = type == json::value_t::number_integer;
      if (!obj.is_object() || !obj.contains(name) ||
          (number ? !obj[name].is_number_integer() : obj[name].type() != type)) {
        const char* expected = number ? "an integer" : type == json::value_t::string ? "a string"
                               : type == json::value_t::boolean                     ? "true or false"
                                                                                    : "an array";
        return absl::InvalidArgumentError(absl::StrCat(loc, ": field \"", name, "\": expected ", expected));
      }
      return &obj[name];
    };
    GemmTuningRecord rec;
    E3_ASSIGN_OR_RETURN(const json* device, field(r, where, "device", json::value_t::string));
    E3_ASSIGN_OR_RETURN(const json* version, field(r, where, "cublaslt_version", json::value_t::number_integer));
    E3_ASSIGN_OR_RETURN(const json* rows, field(r, where, "rows", json::value_t::number_integer));
    E3_ASSIGN_OR_RETURN(const json* min_rows, field(r, where, "min_rows", json::value_t::number_integer));
    E3_ASSIGN_OR_RETURN(const json* problems, field(r, where, "problems", json::value_t::array));
    rec.device_name = device->get<std::string>();
    rec.cublaslt_version = version->get<int64_t>();
    rec.rows = rows->get<int64_t>();
    rec.min_rows = min_rows->get<int64_t>();
    if (rec.rows < 1 || rec.min_rows < 1 || rec.min_rows > rec.rows) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": fields \"min_rows\" and \"rows\": expected 1 <= min_rows <= rows, got ",
                       rec.min_rows, " and ", rec.rows));
    }
    for (size_t k = 0; k < problems->size(); ++k) {
      const json& p = (*problems)[k];
      const std::string loc = absl::StrCat(where, ".problems[", k, "]");
      E3_ASSIGN_OR_RETURN(const json* dtype, field(p, loc, "dtype", json::value_t::string));
      E3_ASSIGN_OR_RETURN(const json* out_f, field(p, loc, "out", json::value_t::number_integer));
      E3_ASSIGN_OR_RETURN(const json* in_f, field(p, loc, "in", json::value_t::number_integer));
      E3_ASSIGN_OR_RETURN(const json* bias, field(p, loc, "bias", json::value_t::boolean));
      E3_ASSIGN_OR_RETURN(const json* residual, field(p, loc, "residual", json::value_t::boolean));
      E3_ASSIGN_OR_RETURN(const json* changed, field(p, loc, "changed", json::value_t::boolean));
      E3_ASSIGN_OR_RETURN(const json* algo, field(p, loc, "algo", json::value_t::string));
      TunedProblem t;
      const std::string dt = dtype->get<std::string>();
      if (dt != "bfloat16" && dt != "float16") {
        return absl::InvalidArgumentError(absl::StrCat(loc, ": field \"dtype\": expected bfloat16 or float16, got \"",
                                                       dt, "\""));
      }
      t.problem = GemmProblem{0, dt == "bfloat16" ? at::kBFloat16 : at::kHalf, out_f->get<int64_t>(),
                              in_f->get<int64_t>(), bias->get<bool>(), residual->get<bool>()};
      if (t.problem.out < 1 || t.problem.in < 1) {
        return absl::InvalidArgumentError(absl::StrCat(loc, ": fields \"out\" and \"in\": expected positive sizes"));
      }
      t.changed = changed->get<bool>();
      if (!ParseAlgoHex(algo->get<std::string>(), &t.algo)) {
        return absl::InvalidArgumentError(
            absl::StrCat(loc, ": field \"algo\": expected 8 words of 16 lowercase hex digits joined by ':'"));
      }
      if (p.contains("sites") && p["sites"].is_number_integer()) t.sites = p["sites"].get<int>();
      if (p.contains("description") && p["description"].is_string()) {
        t.algo_description = p["description"].get<std::string>();
      }
      rec.problems.push_back(std::move(t));
    }
    out.push_back(std::move(rec));
  }
  return out;
}

}  // namespace e3
