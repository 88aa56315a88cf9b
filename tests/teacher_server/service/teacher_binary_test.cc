// The real teacher_server executable as a child process: it serves
// /metrics and gRPC, drains and exits 0 on SIGTERM with its ledger line,
// and refuses bad input with a clear message and a normal non-zero exit.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "httplib.h"
#include "proto/teacher.grpc.pb.h"
#include "tests/metric_value.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;

std::string SourcePath(const std::string& rel) { return std::string(E3_SOURCE_DIR) + "/" + rel; }

// build/tests/<this test> -> build/teacher_server/teacher_server
std::string TeacherBinary() { return Dirname(SelfExeDir()) + "/teacher_server/teacher_server"; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  return absl::StrCat("status ", status);
}

// A child process with stdout and stderr captured to files. Killed (and
// reaped) when the object goes, so a failing test leaves nothing behind.
class Child {
 public:
  Child(const std::vector<std::string>& args, const std::string& out_path, const std::string& err_path)
      : out_path_(out_path), err_path_(err_path) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      // Only async-signal-safe calls until exec.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(126);
      int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out < 0 || err < 0) ::_exit(126);
      ::dup2(out, 1);
      ::dup2(err, 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  ~Child() {
    if (pid_ > 0 && !status_) {
      ::kill(pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  // The wait status once the child has exited, polling for up to `limit`.
  std::optional<int> Wait(std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!status_) {
      int st = 0;
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        status_ = st;
        break;
      }
      if (r < 0 || std::chrono::steady_clock::now() >= end) break;
      std::this_thread::sleep_for(20ms);
    }
    return status_;
  }
  bool running() { return !Wait(0ms).has_value(); }
  std::string out() const { return ReadFile(out_path_); }
  std::string err() const { return ReadFile(err_path_); }

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
  std::string out_path_;
  std::string err_path_;
};

class TeacherBinaryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto dir = MakeTempDir("e3-teacher-binary-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    tmp_ = new std::string(*dir);
    // ~20 real conversations from the example data.
    std::ifstream in(SourcePath("examples/data/train_conversations.jsonl"));
    std::ofstream out(*tmp_ + "/train.jsonl");
    std::string line;
    for (int i = 0; i < 20 && std::getline(in, line); ++i) out << line << "\n";
    ASSERT_TRUE(out.good());
  }
  static void TearDownTestSuite() {
    if (tmp_ == nullptr) return;
    (void)RemoveAll(*tmp_);
    delete tmp_;
    tmp_ = nullptr;
  }

  void SetUp() override {
    ASSERT_TRUE(PathExists(TeacherBinary())) << TeacherBinary() << " is not built";
    name_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  std::string Tmp(const std::string& file) const { return *tmp_ + "/" + name_ + "." + file; }

  // Runs the teacher with the standard good flags, overridden by `extra`
  // (absl flags: a later --flag wins).
  std::unique_ptr<Child> Start(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {TeacherBinary(),
                                     "--model_dir=" + SourcePath("examples/tiny-code-llama"),
                                     "--data=" + *tmp_ + "/train.jsonl",
                                     "--listen=127.0.0.1:0",
                                     "--port_file=" + Tmp("port"),
                                     "--metrics_port=0",
                                     "--draft_vocab_size=512",
                                     "--threads=2"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto child = std::make_unique<Child>(args, Tmp("stdout"), Tmp("stderr"));
    EXPECT_TRUE(child->started());
    return child;
  }

  // Expects a prompt, normal, non-zero exit whose stderr holds every
  // string of `needles`.
  void ExpectCleanFailure(Child& child, const std::vector<std::string>& needles) {
    auto status = child.Wait(30s);
    ASSERT_TRUE(status.has_value()) << "still running after 30 s; stderr:\n" << child.err();
    EXPECT_TRUE(WIFEXITED(*status)) << DescribeStatus(*status) << "; stderr:\n" << child.err();
    if (WIFEXITED(*status)) {
      EXPECT_NE(WEXITSTATUS(*status), 0) << child.out();
    }
    const std::string err = child.err();
    EXPECT_NE(err.find("teacher_server: error: "), std::string::npos) << err;
    for (const auto& n : needles) EXPECT_NE(err.find(n), std::string::npos) << "\"" << n << "\" not in:\n" << err;
    EXPECT_EQ(child.out().find("serving on"), std::string::npos) << child.out();
  }

  static inline std::string* tmp_ = nullptr;
  std::string name_;
};

using testing::MetricValue;

TEST_F(TeacherBinaryTest, ServesMetricsAndInfoThenDrainsOnSigterm) {
  // This test's subscriber never commits: the drain waits for its final
  // commit only --drain_timeout_s.
  auto child = Start({"--tokens_per_batch=512", "--drain_timeout_s=2"});
  // The port file appears once the server is up.
  const auto end = std::chrono::steady_clock::now() + 90s;
  while (!PathExists(Tmp("port")) && child->running() && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(PathExists(Tmp("port"))) << "no port file; stdout:\n" << child->out() << "\nstderr:\n" << child->err();
  const int port = std::stoi(ReadFile(Tmp("port")));
  ASSERT_GT(port, 0);

  const std::string out = child->out();
  EXPECT_NE(out.find("teacher: backend hf on cpu"), std::string::npos) << "--backend=auto on the CPU: " << out;
  std::smatch m;
  const std::regex serving(R"(teacher: serving on ([0-9.]+):(\d+) \(metrics on :(\d+)\))");
  ASSERT_TRUE(std::regex_search(out, m, serving)) << out;
  EXPECT_EQ(m[1].str(), "127.0.0.1");
  EXPECT_EQ(std::stoi(m[2].str()), port);
  const int metrics_port = std::stoi(m[3].str());
  ASSERT_GT(metrics_port, 0);
  EXPECT_NE(out.find("teacher: model "), std::string::npos) << out;
  EXPECT_NE(out.find("teacher: draft vocab 512 of 8192"), std::string::npos) << out;

  // (a) /metrics over HTTP.
  httplib::Client http("127.0.0.1", metrics_port);
  http.set_connection_timeout(5);
  http.set_read_timeout(5);
  auto res = http.Get("/metrics");
  ASSERT_TRUE(res) << "no HTTP response";
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->body.find("# TYPE e3_teacher_tokens_total counter"), std::string::npos) << res->body;
  EXPECT_NE(res->body.find("# TYPE e3_teacher_queue_depth gauge"), std::string::npos) << res->body;
  EXPECT_EQ(MetricValue(res->body, "e3_teacher_tokens_total"), 0) << res->body;  // nobody subscribed yet
  EXPECT_EQ(MetricValue(res->body, "e3_teacher_queue_depth"), 0) << res->body;
  // CUDA graphs are exported everywhere; on the CPU none is ever captured.
  EXPECT_NE(res->body.find("# TYPE e3_teacher_graph_forwards_total counter"), std::string::npos) << res->body;
  EXPECT_EQ(MetricValue(res->body, "e3_teacher_cuda_graphs"), 0) << res->body;

  // (b) GetInfo over gRPC.
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  auto stub = v1::TeacherService::NewStub(channel);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    v1::GetInfoRequest req;
    req.set_version(v1::PROTOCOL_VERSION_CURRENT);
    v1::GetInfoResponse resp;
    grpc::Status st = stub->GetInfo(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(resp.model().vocab_size(), 8192);
    EXPECT_EQ(resp.model().hidden_size(), 256);
    EXPECT_EQ(resp.model().num_hidden_layers(), 8);
    EXPECT_EQ(resp.model().num_key_value_heads(), 2);
    EXPECT_EQ(resp.model().draft_vocab_size(), 512);
    EXPECT_EQ(std::vector<int32_t>(resp.model().aux_layer_ids().begin(), resp.model().aux_layer_ids().end()),
              (std::vector<int32_t>{1, 3, 4}));
    EXPECT_EQ(resp.model().compute_dtype(), v1::DTYPE_F32);  // the CPU default
    EXPECT_EQ(resp.dataset_samples(), 20);
    EXPECT_GT(resp.dataset_tokens(), 0);
    EXPECT_EQ(resp.backend(), "hf") << "--backend=auto resolves to hf on the CPU";
  }

  // One batch through a real subscription moves the counters.
  grpc::ClientContext sctx;
  sctx.set_deadline(std::chrono::system_clock::now() + 60s);
  v1::SubscribeRequest sreq;
  sreq.set_version(v1::PROTOCOL_VERSION_CURRENT);
  sreq.set_subscriber_id("binary-test");
  sreq.set_world_size(1);
  sreq.set_credit_window(2);
  sreq.set_host("not-this-host");
  sreq.add_accepted_transports(v1::TRANSPORT_INLINE);
  auto reader = stub->Subscribe(&sctx, sreq);
  v1::BatchDescriptor d;
  ASSERT_TRUE(reader->Read(&d)) << reader->Finish().error_message();
  EXPECT_EQ(d.transport(), v1::TRANSPORT_INLINE);
  EXPECT_GT(d.num_tokens(), 0);
  double tokens = 0, depth = 0;
  const auto mend = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < mend) {
    res = http.Get("/metrics");
    ASSERT_TRUE(res);
    tokens = MetricValue(res->body, "e3_teacher_tokens_total");
    depth = MetricValue(res->body, "e3_teacher_queue_depth");
    if (tokens >= d.num_tokens() && depth >= 1) break;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_GE(tokens, d.num_tokens()) << res->body;
  EXPECT_GE(depth, 1) << res->body;
  EXPECT_NE(res->body.find("e3_teacher_bytes_sent_total{transport=\"inline\"}"), std::string::npos) << res->body;

  // (c) SIGTERM drains and exits 0, printing the ledger.
  // The student keeps reading, as a live one would, while the teacher
  // drains; the stream's deadline bounds the thread.
  int drained = 0;
  grpc::Status stream_status;
  std::thread student([&] {
    v1::BatchDescriptor x;
    while (reader->Read(&x)) ++drained;
    stream_status = reader->Finish();
  });
  EXPECT_EQ(::kill(child->pid(), SIGTERM), 0);
  auto status = child->Wait(15s);
  if (!status) ::kill(child->pid(), SIGKILL);  // unblocks the reader
  student.join();
  // Batches already made may still arrive; then the stream ends, saying why.
  EXPECT_LE(drained, 2);
  EXPECT_EQ(stream_status.error_code(), grpc::StatusCode::UNAVAILABLE) << stream_status.error_message();
  EXPECT_NE(stream_status.error_message().find("draining"), std::string::npos) << stream_status.error_message();
  ASSERT_TRUE(status.has_value()) << "no exit within 15 s of SIGTERM; stdout:\n" << child->out();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << DescribeStatus(*status) << "\n" << child->err();
  const std::string final_out = child->out();
  EXPECT_NE(final_out.find("teacher: signal 15: draining"), std::string::npos) << final_out;
  EXPECT_NE(final_out.find("teacher: 1 rank(s) sent no final commit within 2 s"), std::string::npos) << final_out;
  std::smatch lm;
  ASSERT_TRUE(std::regex_search(final_out, lm, std::regex(R"(teacher: ledger (\{[^\n]*\}))"))) << final_out;
  EXPECT_NE(lm[1].str().find("\"dataset_samples\":20"), std::string::npos) << lm[1];
  EXPECT_EQ(lm[1].str().find("\"deliveries\":0,"), std::string::npos) << lm[1];  // one was delivered
}

TEST_F(TeacherBinaryTest, MissingModelDirNamesThePath) {
  const std::string missing = *tmp_ + "/no-such-model";
  auto child = Start({"--model_dir=" + missing});
  ExpectCleanFailure(*child, {missing});
}

TEST_F(TeacherBinaryTest, MalformedDataFailsNamingFileAndLine) {
  const std::string bad = Tmp("bad.jsonl");
  {
    std::ofstream out(bad);
    out << "{\"conversations\": [\n";       // line 1: truncated JSON
    out << "not json at all\n";              // line 2
    out << "{\"conversations\": 42}\n";      // line 3: wrong type
  }
  auto child = Start({"--data=" + bad, "--skip_malformed=false"});
  ExpectCleanFailure(*child, {bad + ":1:", "skip_malformed"});
}

TEST_F(TeacherBinaryTest, PortInUseIsAClearError) {
  // Hold a listening socket (no SO_REUSEPORT, so nobody can share it).
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  const std::string listen = absl::StrCat("127.0.0.1:", port);
  auto child = Start({"--listen=" + listen, "--metrics_port=-1"});
  ExpectCleanFailure(*child, {"cannot listen on " + listen});
  EXPECT_FALSE(PathExists(Tmp("port")));
  ::close(fd);
}

TEST_F(TeacherBinaryTest, UnknownBackendIsRefused) {
  auto child = Start({"--backend=warp9"});
  ExpectCleanFailure(*child, {"--backend: teachers.backend: expected auto, hf or sgl, got \"warp9\""});
}

}  // namespace
}  // namespace e3
