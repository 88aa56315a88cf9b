// Runs a tensor-parallel teacher as real processes: this test binary
// starts itself once per rank (env E3_TP_CHILD), the ranks meet over a c10d
// group on loopback (Gloo on CPU, NCCL on GPUs), rank 0 drives forwards
// through TpLeader and the others serve them with RunTpFollower, exactly as
// teacher_server does. Rank 0 also runs the unsharded model in-process and
// writes how far the sharded outputs are from it (and from transformers'
// golden fp32 outputs) to a JSON file the parent reads.
#ifndef E3_TESTS_TEACHER_SERVER_TP_HARNESS_H_
#define E3_TESTS_TEACHER_SERVER_TP_HARNESS_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/model/model_dir.h"
#include "nlohmann/json.hpp"
#include "teacher_server/layers/fp8_head_argmax.h"
#include "teacher_server/models/causal_lm.h"
#include "teacher_server/parallel/micro_batches.h"
#include "teacher_server/runtime/tp_control.h"
#include "tests/e2e/subprocess.h"
#include "tests/free_port.h"
#include "tests/teacher_server/golden_fixture.h"
#include "tests/teacher_server/trimmed_vocab_model.h"

namespace e3::testing {

struct TpRun {
  TpRun() = default;
  // The fields that name a layout; the rest keep their defaults.
  TpRun(std::string golden_case, int tp_size, int ep_size, bool cuda = false, std::string dtype = "float32")
      : golden_case(std::move(golden_case)), tp_size(tp_size), ep_size(ep_size), cuda(cuda), dtype(std::move(dtype)) {}

  std::string golden_case;
  int tp_size = 2;
  int ep_size = 1;
  bool cuda = false;
  std::string dtype = "float32";
  std::string follower_fault;  // "exit_after_load": rank 1 dies before any forward
  bool sgl = false;             // the sgl backend (SetBackend("sgl")) on every rank
  // ModelOptions::tp_overlap_min_tokens on rank 0 (-1: the default). The
  // fixtures' batches are a few hundred tokens: 1 makes sgl split them.
  // The other ranks then start with the split off (0): the leader's choice
  // must reach them (ForwardOptions::micro_batch_split), or their
  // collectives would not line up with rank 0's.
  int64_t overlap_min_tokens = -1;
  // Rows cut from the end of the vocabulary (a trimmed copy of the model,
  // TrimmedVocabModel): 1 on a vocab of 256 gives two ranks shards of 128
  // and 127 rows, so rank 1's lm_head is not a multiple of 16 and never
  // takes the FP8 candidate search while rank 0's can. The input ids are
  // taken modulo the trimmed vocab, so HF's golden outputs no longer apply.
  int64_t vocab_trim = 0;
};

inline void PrintTo(const TpRun& r, std::ostream* os) {
  *os << r.golden_case << " tp=" << r.tp_size << " ep=" << r.ep_size << (r.cuda ? " cuda " : " cpu ") << r.dtype
      << (r.sgl ? " sgl" : " hf") << (r.overlap_min_tokens >= 0 ? " overlap" : "")
      << (r.vocab_trim > 0 ? " vocab-" + std::to_string(r.vocab_trim) : "");
}

// model_dir: the model the ranks load (the golden case's, or a trimmed copy).
inline std::string EncodeRun(const TpRun& r, int rank, int port, const std::string& out,
                             const std::string& model_dir) {
  return absl::StrCat(r.golden_case, "|", rank, "|", r.tp_size, "|", r.ep_size, "|", port, "|", r.cuda ? 1 : 0, "|",
                      r.dtype, "|", r.follower_fault, "|", r.sgl ? 1 : 0, "|", out, "|", r.overlap_min_tokens, "|",
                      model_dir);
}

// The body of one rank (called from the child-role test).
inline void RunTpChild(const std::string& spec) {
  std::vector<std::string> f = absl::StrSplit(spec, '|');
  ASSERT_EQ(f.size(), 12u) << spec;
  const GoldenCase c = LoadGoldenCase(f[0]);
  const int rank = std::stoi(f[1]), size = std::stoi(f[2]), ep = std::stoi(f[3]), port = std::stoi(f[4]);
  const bool cuda = f[5] == "1";
  const at::ScalarType dtype = f[6] == "bfloat16" ? at::kBFloat16 : at::kFloat;
  const bool golden_model = f[11] == c.model_dir;  // else a trimmed copy: HF's outputs do not apply
  auto dir = ModelDir::Open(f[11]);
  ASSERT_TRUE(dir.ok()) << dir.status();

  ProcessGroupOptions po;
  po.master_port = port;
  po.rank = rank;
  po.world_size = size;
  po.cuda = cuda;
  po.timeout = absl::Seconds(60);
  auto group = ProcessGroup::Create(po);
  ASSERT_TRUE(group.ok()) << group.status();
  ModelOptions opts;
  opts.dtype = dtype;
  opts.device = cuda ? at::Device(at::kCUDA, rank) : at::Device(at::kCPU);
  ASSERT_TRUE(SetBackend(f[8] == "1" ? "sgl" : "hf", &opts).ok());
  if (f[10] != "-1") opts.tp_overlap_min_tokens = rank == 0 ? std::stoll(f[10]) : 0;
  opts.tp = std::make_shared<TpGroup>(std::move(group).value(), ep);
  auto shard = LoadCausalLM(**dir, opts);
  ASSERT_TRUE(shard.ok()) << shard.status();
  if (rank != 0) {
    if (f[7] == "exit_after_load") std::_Exit(3);
    const absl::Status st = RunTpFollower(**shard);
    ASSERT_TRUE(st.ok()) << st;
    return;
  }

  nlohmann::json report;
  {
    // A short heartbeat, so that the pause below exercises it.
    TpLeader leader(std::move(shard).value(), absl::Milliseconds(50));
    const int64_t vocab = (*dir)->config().vocab_size;
    auto batch = MakePackedBatch(c.tensors.at("input_ids").to(at::kLong).remainder(vocab), c.cu_seqlens, vocab,
                                 opts.device);
    ASSERT_TRUE(batch.ok()) << batch.status();
    ForwardOptions fwd;
    fwd.aux_layer_ids = c.aux_layer_ids;
    fwd.return_logits = true;
    auto first = leader.Forward(*batch, fwd);
    if (!first.ok()) {
      report["forward_error"] = std::string(first.status().message());
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // idle: heartbeats flow
      auto again = leader.Forward(*batch, fwd);
      ASSERT_TRUE(again.ok()) << again.status();
      report["repeat_bitwise_equal"] = again->aux_hidden.equal(first->aux_hidden);
      // The argmax alone, as the server asks for it: each rank finds its
      // best column without logits (the FP8 candidate search where sgl runs
      // on an FP8 GPU) and the ranks combine their answers.
      ForwardOptions argmax_only = fwd;
      argmax_only.return_logits = false;
      const int64_t fp8_calls = Fp8HeadArgmaxCalls(), overlapped = OverlappedForwards();
      auto alone = leader.Forward(*batch, argmax_only);
      ASSERT_TRUE(alone.ok()) << alone.status();
      report["fp8_argmax_calls"] = Fp8HeadArgmaxCalls() - fp8_calls;
      report["overlapped_forwards"] = OverlappedForwards() - overlapped;
      const at::Tensor own = first->logits.argmax(-1).to(at::kInt);
      report["argmax_alone_agreement"] =
          1.0 - static_cast<double>(alone->target_argmax.ne(own).sum().item<int64_t>()) / own.numel();

      ModelOptions whole = opts;
      whole.tp = nullptr;
      auto ref_model = LoadCausalLM(**dir, whole);
      ASSERT_TRUE(ref_model.ok()) << ref_model.status();
      auto ref = (*ref_model)->Forward(*batch, fwd);
      ASSERT_TRUE(ref.ok()) << ref.status();
      report["aux_vs_tp1"] = RelInf(first->aux_hidden, ref->aux_hidden);
      report["last_vs_tp1"] = RelInf(first->last_hidden, ref->last_hidden);
      report["logits_vs_tp1"] = RelInf(first->logits, ref->logits);
      // Counted exactly: a float mean of a 0/1 tensor is not exactly 1.
      const int64_t differ = first->target_argmax.ne(ref->target_argmax).sum().item<int64_t>();
      report["argmax_agreement_tp1"] = 1.0 - static_cast<double>(differ) / first->target_argmax.numel();
      report["argmax_equals_own_logits"] = first->target_argmax.equal(own);
      if (golden_model) {
        report["aux_vs_hf"] = RelInf(first->aux_hidden.cpu(), c.tensors.at("aux_hidden"));
        report["last_vs_hf"] = RelInf(first->last_hidden.cpu(), c.tensors.at("last_hidden"));
      }
      report["vocab_size"] = first->logits.size(-1);
      report["shapes_match"] = first->aux_hidden.sizes() == ref->aux_hidden.sizes() &&
                               first->logits.sizes() == ref->logits.sizes();
    }
  }
  std::ofstream(f[9]) << report.dump() << "\n";
}

// Starts the ranks and returns rank 0's report (asserting on failures).
inline nlohmann::json RunTpProcesses(const TpRun& run, const std::string& child_filter, const std::string& dir) {
  const int port = FreePort();
  const std::string out = absl::StrCat(dir, "/report_", run.golden_case, "_tp", run.tp_size, "_ep", run.ep_size,
                                       run.sgl ? "_sgl" : "", ".json");
  const std::string golden_dir = LoadGoldenCase(run.golden_case).model_dir;
  const std::string model_dir = run.vocab_trim > 0 ? TrimmedVocabModel(golden_dir, run.vocab_trim, dir) : golden_dir;
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int r = 0; r < run.tp_size; ++r) {
    ::setenv("E3_TP_CHILD", EncodeRun(run, r, port, out, model_dir).c_str(), 1);
    ranks.push_back(std::make_unique<Subprocess>(
        std::vector<std::string>{"/proc/self/exe", "--gtest_filter=" + child_filter},
        absl::StrCat(dir, "/rank", r, "_", run.golden_case, ".log")));
  }
  ::unsetenv("E3_TP_CHILD");
  const bool fault = !run.follower_fault.empty();
  for (int r = 0; r < run.tp_size; ++r) {
    auto st = ranks[r]->Wait(std::chrono::seconds(240));
    if (fault) {
      // The leader either reports the failed forward or, when the failure
      // came after the batch reached the group, exits with status 3.
      if (r == 0 && !PathExists(out)) {
        EXPECT_TRUE(st.has_value() && WIFEXITED(*st)) << ranks[0]->Log();
        return nlohmann::json{{"leader_exit_status", st.has_value() && WIFEXITED(*st) ? WEXITSTATUS(*st) : -1},
                              {"leader_log", ranks[0]->Log()}};
      }
      continue;
    }
    EXPECT_TRUE(st.has_value() && WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
        << "rank " << r << " of " << run.golden_case << " failed:\n" << ranks[r]->Log();
  }
  if (!PathExists(out)) {
    ADD_FAILURE() << "rank 0 wrote no report:\n" << ranks[0]->Log();
    return nlohmann::json::object();
  }
  return nlohmann::json::parse(ReadFile(out));
}

}  // namespace e3::testing

#endif  // E3_TESTS_TEACHER_SERVER_TP_HARNESS_H_
