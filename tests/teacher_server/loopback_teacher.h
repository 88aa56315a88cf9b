// One live teacher as far as a student can tell, for the service tests:
// real engines (one per student group), a TeacherServiceImpl and a gRPC
// server on 127.0.0.1:0 with
// the server's message caps applied as serve.cc applies them, and a stub
// connected to it. The small real model they serve
// (tests/fixtures/golden/rand_default_mha, vocab 256, hidden 64) and a
// synthetic dataset are loaded once per test suite (LoopbackModel).
#ifndef E3_TESTS_TEACHER_SERVER_LOOPBACK_TEACHER_H_
#define E3_TESTS_TEACHER_SERVER_LOOPBACK_TEACHER_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/data/vocab_map.h"
#include "common/model/model_dir.h"
#include "teacher_server/engine/student_groups.h"
#include "teacher_server/runtime/serialized_model.h"
#include "teacher_server/service/teacher_service.h"
#include "tests/teacher_server/golden_fixture.h"
#include "tests/teacher_server/synthetic_dataset.h"

namespace e3::testing {

// The model, data and draft vocab a suite's teachers share.
struct LoopbackModel {
  std::unique_ptr<ModelDir> dir;
  std::unique_ptr<CausalLM> model;
  std::unique_ptr<Dataset> dataset;
  std::unique_ptr<VocabMap> vocab;
};

// Loads rand_default_mha and a synthetic dataset of `num_samples` samples
// (made from `data_seed`) with a draft vocab of `draft_vocab` ids.
inline std::unique_ptr<LoopbackModel> LoadLoopbackModel(int num_samples, uint32_t data_seed, int64_t draft_vocab) {
  auto m = std::make_unique<LoopbackModel>();
  m->dir = ModelDir::Open(SourcePath("tests/fixtures/golden/rand_default_mha")).value();
  m->model = LoadCausalLM(*m->dir, ModelOptions{}).value();
  m->dataset = MakeSyntheticDataset(num_samples, data_seed);
  m->vocab = std::make_unique<VocabMap>(CalibrateVocabMap(m->dataset->samples(), 256, draft_vocab).value());
  return m;
}

struct LoopbackTeacher {
  // The groups' engines share the model one forward at a time, as the
  // teacher's do.
  std::unique_ptr<SerializedCausalLM> serialized;
  std::unique_ptr<StudentGroups> groups;
  Engine* engine = nullptr;  // the default group's
  TeacherMetrics metrics;
  std::unique_ptr<TeacherServiceImpl> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::TeacherService::Stub> stub;

  ~LoopbackTeacher() {
    using namespace std::chrono_literals;
    stub.reset();
    channel.reset();
    if (server) {
      server->Shutdown(std::chrono::system_clock::now() + 2s);
      server->Wait();
    }
    server.reset();
    service.reset();
    engine = nullptr;
    groups.reset();
  }
};

// Starts a teacher serving `dataset` (the model's own when null) with the
// given options, to the default student group and those named in
// `groups`; `client_args` configures the stub's channel. Returns null,
// with the failure recorded in gtest, when any part does not start.
inline std::unique_ptr<LoopbackTeacher> StartLoopbackTeacher(const LoopbackModel& m, EngineOptions eopts,
                                                             ServiceOptions sopts = {},
                                                             const Dataset* dataset = nullptr,
                                                             grpc::ChannelArguments client_args = {},
                                                             const std::vector<std::string>& groups = {}) {
  if (dataset == nullptr) dataset = m.dataset.get();
  auto t = std::make_unique<LoopbackTeacher>();
  t->serialized = std::make_unique<SerializedCausalLM>(m.model.get());
  auto created = StudentGroups::Create(t->serialized.get(), dataset, std::move(eopts), groups);
  EXPECT_TRUE(created.ok()) << created.status();
  if (!created.ok()) return nullptr;
  t->groups = std::move(created).value();
  t->engine = &t->groups->default_group();
  auto service =
      TeacherServiceImpl::Create(t->groups.get(), m.model.get(), m.vocab.get(), dataset, &t->metrics, sopts);
  EXPECT_TRUE(service.ok()) << service.status();
  if (!service.ok()) return nullptr;
  t->service = std::move(service).value();
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &t->port);
  builder.RegisterService(t->service.get());
  ApplyMessageLimits(sopts.messages, &builder);
  t->server = builder.BuildAndStart();
  EXPECT_NE(t->server, nullptr);
  EXPECT_GT(t->port, 0);
  if (!t->server || t->port == 0) return nullptr;
  t->channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", t->port), grpc::InsecureChannelCredentials(),
                                         client_args);
  t->stub = v1::TeacherService::NewStub(t->channel);
  return t;
}

}  // namespace e3::testing

#endif  // E3_TESTS_TEACHER_SERVER_LOOPBACK_TEACHER_H_
