// A hostile training file (.jsonl or gzip, as the teacher's --data reads
// it) through the whole reader: line splitting and gzip, JSON, the turn
// formats, the model's chat template and the tokenizer
// (examples/tiny-code-llama). Every line lands in exactly one count, a
// kept sample is well formed, and with --skip_malformed=false the first
// bad line is an error naming file:line.
#include <cstdint>
#include <memory>

#include "common/data/dataset.h"
#include "common/text/chat_template.h"
#include "common/text/tokenizer.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

struct Model {
  std::unique_ptr<e3::Tokenizer> tokenizer;
  std::unique_ptr<e3::ChatTemplate> chat_template;
};

const Model& TinyModel() {
  static const Model* m = [] {
    auto* out = new Model;
    const std::string dir = e3::fuzz::SourcePath("examples/tiny-code-llama");
    out->tokenizer = e3::Tokenizer::FromFile(dir + "/tokenizer.json").value();
    out->chat_template =
        std::make_unique<e3::ChatTemplate>(e3::ChatTemplate::Load(dir, {}).value());
    return out;
  }();
  return *m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Model& model = TinyModel();
  e3::DatasetOptions o;
  o.path = e3::fuzz::AsFile(data, size, "train.jsonl");
  o.max_length = 64;
  o.num_threads = 1;
  o.vocab_size = model.tokenizer->vocab_size();
  auto ds = e3::Dataset::Load(o, *model.tokenizer, *model.chat_template);
  if (!ds.ok()) {
    // Skipping bad lines, only an unreadable file (a corrupt gzip stream)
    // or no sample at all fails the load.
    E3_FUZZ_CHECK(ds.status().message().find(o.path) != std::string::npos);
  } else {
    const e3::DatasetStats& s = (*ds)->stats();
    E3_FUZZ_CHECK(s.empty_lines + s.malformed + s.dropped_short + s.dropped_empty_mask + s.kept ==
                  s.lines_read);
    int64_t by_cause = 0;
    for (const auto& [cause, n] : s.malformed_by_cause) by_cause += n;
    E3_FUZZ_CHECK(by_cause == s.malformed);
    E3_FUZZ_CHECK((*ds)->size() == s.kept);
    for (const e3::Sample& smp : (*ds)->samples()) {
      E3_FUZZ_CHECK(smp.input_ids.size() == smp.loss_mask.size());
      E3_FUZZ_CHECK(smp.size() >= 2 && smp.size() <= 64);
      for (int32_t id : smp.input_ids) E3_FUZZ_CHECK(id >= 0 && id < o.vocab_size);
    }
  }
  o.skip_malformed = false;
  auto strict = e3::Dataset::Load(o, *model.tokenizer, *model.chat_template);
  if (!strict.ok()) E3_FUZZ_CHECK(strict.status().message().find(o.path) != std::string::npos);
  return 0;
}
