// The path a new user takes on the first day, with the launcher on the
// CPU: their own config over OpenAI `messages` data (system prompts, tools,
// tool calls, reasoning) rendered with a Qwen3 template; --plan; a run that
// is killed with all its processes and launched again, resuming exactly
// once; a local process without the run's token trying to join; the best
// draft kept by its real tau; the TensorBoard files read back; and a warm
// start from the draft on other data, which starts from the draft's tau.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/rpc/peer_auth.h"
#include "common/tensorboard/event_reader.h"
#include "nlohmann/json.hpp"
#include "proto/teacher.grpc.pb.h"
#include "tests/e2e/launcher_run.h"
#include "tests/e2e/ledger_scan.h"
#include "tests/e2e/subprocess.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::ReadFile;
using testing::Subprocess;

const std::string kSrc = E3_SOURCE_DIR;
constexpr int kEvalChain = 5;

std::string Basename(const std::string& path) { return path.substr(path.rfind('/') + 1); }

// A user's config: their data and template, a run to the end of the data
// with real-tau measurements along the way.
std::string WriteConfig(const std::string& dir, const std::string& data, const std::string& out,
                        const std::string& extra_draft_keys) {
  const std::string path = dir + "/" + Basename(out) + ".yaml";
  std::ofstream(path) << "model:\n  dir: " << kSrc << "/examples/tiny-code-llama\n"
                      << "template:\n  file: " << kSrc << "/tests/fixtures/chat_templates/qwen3.jinja\n"
                      << "data:\n  train: " << data << "\n  max_seq_len: 768\n"
                      << "  eval_prompts: " << kSrc << "/examples/data/eval_prompts.jsonl\n"
                      << "  eval_samples: 8\n  eval_max_new_tokens: 32\n"
                      << "draft:\n  vocab_size: 256\n  export_dtype: float32\n" << extra_draft_keys
                      << "schedule:\n  tokens_per_batch: 768\n  lr: 3e-3\n  warmup_steps: 2\n"
                      << "  log_every: 2\n  checkpoint_every: 4\n  eval_every: 6\n  eval_chain: " << kEvalChain
                      << "\n"
                      << "teachers:\n  devices: [cpu]\n  threads: 1\n"
                      << "students:\n  devices: [cpu]\n  threads: 1\n"
                      << "run:\n  out: " << out << "\n";
  return path;
}

int Finish(Subprocess& p, std::chrono::seconds bound) {
  auto st = p.Wait(bound);
  EXPECT_TRUE(st.has_value()) << "no end within " << bound.count() << " s\n" << p.Log();
  if (!st.has_value()) return -1;
  return WIFEXITED(*st) ? WEXITSTATUS(*st) : 128 + WTERMSIG(*st);
}

bool WaitWhileRunning(Subprocess& p, const std::function<bool()>& done, std::chrono::seconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    if (!p.running()) return false;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

// What a local process without the run's token can do to a launcher run:
// nothing. With the token it still cannot claim another world, nor ack
// without the generation of a subscription it holds.
void ExpectPeersAreChecked(const std::string& out) {
  const std::string port = testing::ReadPortFile(out + "/teacher-0.port");
  auto channel = grpc::CreateChannel("127.0.0.1:" + port, grpc::InsecureChannelCredentials());
  auto stub = v1::TeacherService::NewStub(channel);
  v1::SubscribeRequest sub;
  sub.set_version(v1::PROTOCOL_VERSION_CURRENT);
  sub.set_subscriber_id("intruder");
  sub.set_rank(0);
  sub.set_world_size(20);
  sub.add_accepted_transports(v1::TRANSPORT_INLINE);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    v1::BatchDescriptor d;
    auto reader = stub->Subscribe(&ctx, sub);
    EXPECT_FALSE(reader->Read(&d));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  PeerAuthOptions o;
  o.auth_token_file = out + "/auth_token";
  absl::StatusOr<PeerAuth> auth = PeerAuth::ForClient(o);
  ASSERT_TRUE(auth.ok()) << auth.status();
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    auth->Attach(&ctx);
    v1::BatchDescriptor d;
    auto reader = stub->Subscribe(&ctx, sub);
    EXPECT_FALSE(reader->Read(&d));
    const grpc::Status st = reader->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
    EXPECT_NE(st.error_message().find("--student_world_size"), std::string::npos) << st.error_message();
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    auth->Attach(&ctx);
    v1::AckRequest ack;
    ack.set_version(v1::PROTOCOL_VERSION_CURRENT);
    ack.set_subscriber_id("rank-0");
    ack.mutable_committed()->set_next_batch(22);
    v1::AckResponse resp;
    EXPECT_EQ(stub->Ack(&ctx, ack, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
}

// Real-tau measurements at chain kEvalChain in a step log: step -> tau.
std::map<int64_t, double> EvalTaus(const std::string& step_log) {
  std::map<int64_t, double> out;
  std::istringstream in(ReadFile(step_log));
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("eval")) {
      out[j["step"].get<int64_t>()] = j["eval"]["tau"][std::to_string(kEvalChain)].get<double>();
    }
  }
  return out;
}

TEST(NewcomerE2eTest, MessagesDataPlanKillRelaunchBestTensorBoardAndWarmStart) {
  const std::string dir = testing::ScratchDir("newcomer");
  const std::string out = dir + "/first";
  const std::string config = WriteConfig(dir, kSrc + "/tests/fixtures/newcomer/messages_a.jsonl", out, "");

  Subprocess plan({testing::Launcher(), "--config=" + config, "--plan"}, dir + "/plan.log");
  ASSERT_EQ(Finish(plan, 30s), 0) << plan.Log();
  EXPECT_NE(plan.Log().find("LlamaForCausalLM, L=8, H=256"), std::string::npos) << plan.Log();
  EXPECT_FALSE(PathExists(out)) << "--plan started something";

  const std::vector<std::string> argv = {testing::Launcher(), "--config=" + config, "--status_every_s=1",
                                         "--noplot"};
  testing::SubprocessLimits own_group;
  own_group.own_process_group = true;
  {
    Subprocess first(argv, dir + "/launch1.log", own_group);
    ASSERT_TRUE(WaitWhileRunning(first, [&] { return PathExists(out + "/checkpoints/step-00000008"); }, 240s))
        << first.Log();
    ASSERT_NO_FATAL_FAILURE(ExpectPeersAreChecked(out));
    ASSERT_EQ(::kill(-first.pid(), SIGKILL), 0);  // the launcher and every process it started
    ASSERT_TRUE(first.Wait(10s).has_value());
  }
  Subprocess relaunch(argv, dir + "/launch2.log");
  ASSERT_EQ(Finish(relaunch, 400s), 0) << relaunch.Log();
  const testing::LedgerScan ledger = testing::ScanLedger(out + "/ledger-0.jsonl");
  EXPECT_TRUE(ledger.ExactlyOnce()) << ledger.Describe();
  const nlohmann::json summary = nlohmann::json::parse(ReadFile(out + "/summary-0.json"));
  EXPECT_EQ(summary["resumed"], true);
  EXPECT_GT(summary["run_steps"].get<int64_t>(), 0);
  EXPECT_LT(summary["run_steps"].get<int64_t>(), summary["steps"].get<int64_t>());

  // The best export is the best tau the run measured, from either launch.
  const std::map<int64_t, double> taus = EvalTaus(out + "/steps.jsonl");
  ASSERT_GE(taus.size(), 2u) << ReadFile(out + "/steps.jsonl");
  auto best_at = std::max_element(taus.begin(), taus.end(), [](auto& a, auto& b) { return a.second < b.second; });
  const nlohmann::json best = nlohmann::json::parse(ReadFile(out + "/best/config.json"));
  EXPECT_DOUBLE_EQ(best["e3_best"]["tau"].get<double>(), best_at->second) << best.dump();
  EXPECT_EQ(best["e3_best"]["eval_chain"], kEvalChain);
  EXPECT_TRUE(IsRegularFile(out + "/best/model.safetensors"));
  EXPECT_DOUBLE_EQ(summary["best_tau"].get<double>(), best_at->second);

  // TensorBoard's files hold the step log's curves (both launches).
  absl::StatusOr<std::vector<std::string>> files = ListEventFiles(out + "/tb");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->size(), 2u);
  std::map<int64_t, double> tb_taus;
  std::set<int64_t> loss_steps;
  for (const std::string& f : *files) {
    absl::StatusOr<std::vector<ScalarEvent>> events = ReadScalarEvents(f);
    ASSERT_TRUE(events.ok()) << events.status();
    for (const ScalarEvent& e : *events) {
      if (e.tag == "train/loss") loss_steps.insert(e.step);
      if (e.tag == absl::StrCat("eval/tau_chain_", kEvalChain)) tb_taus[e.step] = e.value;
    }
  }
  // Every step of the relaunch, and the first launch's up to its last
  // flush before the kill.
  for (int64_t step = summary["resumed_from_step"].get<int64_t>() + 1; step <= summary["steps"].get<int64_t>();
       ++step) {
    EXPECT_EQ(loss_steps.count(step), 1u) << "no train/loss at step " << step;
  }
  EXPECT_GE(loss_steps.size(), static_cast<size_t>(summary["steps"].get<int64_t>() - 2));
  ASSERT_EQ(tb_taus.size(), taus.size());
  for (const auto& [step, tau] : taus) EXPECT_FLOAT_EQ(tb_taus[step], static_cast<float>(tau)) << step;

  // A warm start on other data: the draft's weights and vocab, a fresh
  // optimizer and stream. Measured before it trains, it is the draft it
  // started from (same weights, same eval set), not an untrained one.
  const std::string warm_out = dir + "/warm";
  const std::string warm_config = WriteConfig(dir, kSrc + "/tests/fixtures/newcomer/messages_b.jsonl", warm_out,
                                              "  init_from: " + out + "/draft\n");
  Subprocess warm({testing::Launcher(), "--config=" + warm_config, "--noplot", "schedule.max_steps=6"},
                  dir + "/warm.log");
  ASSERT_EQ(Finish(warm, 300s), 0) << warm.Log();
  const nlohmann::json warm_summary = nlohmann::json::parse(ReadFile(warm_out + "/summary-0.json"));
  EXPECT_EQ(warm_summary["warm_started_from"], out + "/draft");
  const double started_at = warm_summary["eval_untrained"]["tau"][std::to_string(kEvalChain)].get<double>();
  const double first_final = summary["eval"]["tau"][std::to_string(kEvalChain)].get<double>();
  std::printf("newcomer e2e: first run tau %.4f (untrained %.4f), warm start from tau %.4f\n", first_final,
              summary["eval_untrained"]["tau"][std::to_string(kEvalChain)].get<double>(), started_at);
  EXPECT_DOUBLE_EQ(started_at, first_final);
  EXPECT_GT(started_at, summary["eval_untrained"]["tau"][std::to_string(kEvalChain)].get<double>());
}

}  // namespace
}  // namespace e3
