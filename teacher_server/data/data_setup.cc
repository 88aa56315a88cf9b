#include "teacher_server/data/data_setup.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/model/model_config.h"

namespace e3 {
namespace {

std::vector<int32_t> StopIds(const CausalLM& model) {
  std::vector<int32_t> out;
  for (int64_t id : model.config().eos_token_ids) out.push_back(static_cast<int32_t>(id));
  return out;
}

// The model directory's tokenizer and chat template (or the override), as
// training and --preview_data read them.
absl::Status LoadTextTools(const TeacherDataOptions& o, TeacherData* data) {
  E3_ASSIGN_OR_RETURN(data->tokenizer, Tokenizer::FromFile(o.model_dir + "/tokenizer.json"));
  E3_ASSIGN_OR_RETURN(data->chat_template, ChatTemplate::Load(o.model_dir, o.chat_template));
  return absl::OkStatus();
}

// How the training data at `path` is read: the cut, the drop rules and the
// bounds of its lines and ids (`vocab_size`: the model's).
DatasetOptions TrainingDatasetOptions(const TeacherDataOptions& o, const std::string& path,
                                      int64_t vocab_size) {
  DatasetOptions d;
  d.path = path;
  d.skip_malformed = o.skip_malformed;
  d.max_length = o.max_seq_len;
  d.train_on_all_tokens = o.train_on_all_tokens;
  d.max_samples = o.max_samples;
  d.max_line_bytes = o.max_line_bytes;
  d.vocab_size = vocab_size;
  return d;
}

// --regenerate: the path of the regenerated data, made now or reused from
// its cache.
absl::StatusOr<std::string> Regenerate(const TeacherDataOptions& o, CausalLM* model,
                                       const Tokenizer& tokenizer, const ChatTemplate& tmpl) {
  RegenerateOptions r = o.regen;
  r.generation.stop_ids = StopIds(*model);
  // 0: many sequences on a GPU, where a decode step costs about the same
  // for 32 or 256 of them; few on the CPU, where it grows with them.
  if (r.generation.max_sequences <= 0) r.generation.max_sequences = model->options().device.is_cuda() ? 256 : 32;
  r.skip_malformed = o.skip_malformed;
  r.max_lines = o.max_samples;
  E3_ASSIGN_OR_RETURN(const std::string config, ReadFileToString(o.model_dir + "/config.json"));
  E3_ASSIGN_OR_RETURN(
      const std::string fingerprint,
      RegenerationFingerprint(o.data, config, tmpl.fingerprint(), r.generation, r.max_lines));
  if (r.cache_path.empty()) r.cache_path = absl::StrCat("regenerated-", fingerprint, ".jsonl");
  E3_ASSIGN_OR_RETURN(const RegenerateReport report,
                      RegenerateData(*model, tokenizer, tmpl, o.data, fingerprint, r));
  if (report.reused) {
    std::printf("teacher: --regenerate: reusing %s (fingerprint %s)\n", r.cache_path.c_str(),
                fingerprint.c_str());
  } else {
    std::printf(
        "teacher: --regenerate: %ld assistant turns of %ld conversations in %.1f s, %ld tokens "
        "(%.0f tok/s); "
        "%ld turns kept (no room within the model's positions), %ld pre-tokenized lines copied, "
        "%ld "
        "malformed skipped; wrote %s\n",
        static_cast<long>(report.turns), static_cast<long>(report.conversations), report.seconds,
        static_cast<long>(report.tokens), report.tokens / std::max(report.seconds, 1e-9),
        static_cast<long>(report.kept_turns), static_cast<long>(report.pretokenized),
        static_cast<long>(report.malformed), r.cache_path.c_str());
  }
  std::fflush(stdout);
  return r.cache_path;
}

// Why a data file gave no sample, with what to change: the counts alone
// leave a user to work out that a long system prompt and tool schema left
// no answer inside --max_seq_len.
absl::Status NoSamples(const Dataset& dataset, const TeacherDataOptions& o) {
  const DatasetStats& s = dataset.stats();
  std::string hint;
  if (s.dropped_empty_mask > 0 && s.truncated > 0) {
    hint = absl::StrCat("; ", s.truncated, " were cut to --max_seq_len=", o.max_seq_len,
                        " (data.max_seq_len) before any trained token: raise it");
  } else if (s.dropped_empty_mask > 0) {
    hint = "; no line had an assistant turn to train on (--train_on_all_tokens trains every token)";
  } else if (s.malformed > 0) {
    hint = "; every line was malformed (the first reasons are above)";
  }
  return absl::InvalidArgumentError(
      absl::StrCat(dataset.source(), ": no sample to train on: ", dataset.Summary(), hint));
}

absl::StatusOr<std::unique_ptr<Dataset>> LoadTrainingData(const TeacherDataOptions& o,
                                                          const std::string& path,
                                                          const TeacherData& data,
                                                          int64_t vocab_size) {
  E3_ASSIGN_OR_RETURN(std::unique_ptr<Dataset> dataset,
                      Dataset::Load(TrainingDatasetOptions(o, path, vocab_size), *data.tokenizer,
                                    *data.chat_template));
  std::printf("teacher: data %s (template %s)\n", dataset->Summary().c_str(),
              data.chat_template->origin().c_str());
  for (const auto& e : dataset->stats().first_errors)
    std::printf("teacher:   skipped: %s\n", e.c_str());
  if (dataset->size() == 0) return NoSamples(*dataset, o);
  return dataset;
}

absl::StatusOr<VocabMap> DraftVocab(const TeacherDataOptions& o, const Dataset& dataset,
                                    int64_t vocab_size) {
  if (o.vocab_map.empty()) {
    return CalibrateVocabMap(dataset.samples(), vocab_size,
                             std::min(o.draft_vocab_size, vocab_size));
  }
  E3_ASSIGN_OR_RETURN(VocabMap vocab, LoadVocabMap(o.vocab_map));
  if (vocab.target_vocab_size != vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(o.vocab_map, ": target vocab ",
                                                   vocab.target_vocab_size, " but the model has ",
                                                   vocab_size));
  }
  return vocab;
}

}  // namespace

absl::Status ValidateTeacherDataOptions(const TeacherDataOptions& o, bool sharded) {
  if (o.model_dir.empty()) return absl::InvalidArgumentError("--model_dir is required");
  if (o.data.empty()) return absl::InvalidArgumentError("--data is required");
  if (o.num_data_shards < 1 || o.data_shard < 0 || o.data_shard >= o.num_data_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("--data_shard=", o.data_shard,
                     " is outside [0, --num_data_shards=", o.num_data_shards, ")"));
  }
  if (sharded && o.regenerate) {
    return absl::UnimplementedError(
        "--regenerate: generation with a KV cache runs in one process; use --tp_size=1");
  }
  if (sharded && !o.eval_prompts.empty()) {
    return absl::UnimplementedError(
        "--eval_prompts: generation with a KV cache runs in one process; start the eval teacher "
        "with --tp_size=1");
  }
  return absl::OkStatus();
}

std::vector<Sample> SamplesOfShard(const std::vector<Sample>& samples, int num_shards, int shard) {
  std::vector<Sample> mine;
  for (const Sample& s : samples) {
    if (s.id % num_shards == shard) mine.push_back(s);
  }
  return mine;
}

absl::StatusOr<TeacherData> SetUpTeacherData(const TeacherDataOptions& o, CausalLM* model) {
  const ModelConfig& cfg = model->config();
  TeacherData data;
  E3_RETURN_IF_ERROR(LoadTextTools(o, &data));
  std::string path = o.data;
  if (o.regenerate) {
    E3_ASSIGN_OR_RETURN(path, Regenerate(o, model, *data.tokenizer, *data.chat_template));
  }
  E3_ASSIGN_OR_RETURN(data.dataset, LoadTrainingData(o, path, data, cfg.vocab_size));
  E3_ASSIGN_OR_RETURN(data.vocab, DraftVocab(o, *data.dataset, cfg.vocab_size));
  auto coverage = ComputeCoverage(data.vocab, data.dataset->samples());
  if (o.num_data_shards > 1) {
    const std::string source =
        absl::StrCat(data.dataset->source(), " shard ", o.data_shard, "/", o.num_data_shards);
    data.dataset = Dataset::FromSamples(
        SamplesOfShard(data.dataset->samples(), o.num_data_shards, o.data_shard), source);
    std::printf("teacher: serving data shard %d of %d: %ld samples\n", o.data_shard,
                o.num_data_shards, static_cast<long>(data.dataset->size()));
  }
  std::printf("teacher: draft vocab %ld of %ld, covers %.1f%% of trained tokens\n",
              static_cast<long>(data.vocab.draft_vocab_size()), static_cast<long>(cfg.vocab_size),
              coverage.ok() ? 100.0 * coverage->fraction() : 0.0);
  if (!o.vocab_map_out.empty()) E3_RETURN_IF_ERROR(SaveVocabMap(data.vocab, o.vocab_map_out));
  return data;
}

absl::StatusOr<PreviewTotals> PreviewTeacherData(const TeacherDataOptions& o, int64_t lines,
                                                 const PreviewMarkers& markers, std::FILE* out) {
  // config.json for the model's vocab (the bound of pre-tokenized ids), as
  // training reads it; the weights stay unread.
  E3_ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(JoinPath(o.model_dir, "config.json")));
  TeacherData data;
  E3_RETURN_IF_ERROR(LoadTextTools(o, &data));
  const DatasetOptions d = TrainingDatasetOptions(o, o.data, config.vocab_size);
  E3_ASSIGN_OR_RETURN(const std::vector<LinePreview> previews,
                      PreviewLines(d, *data.tokenizer, *data.chat_template, lines));
  std::fprintf(out,
               "teacher: preview of the first %ld line(s) of %s as the teacher trains on them: template %s, "
               "max_seq_len %ld, train_reasoning %s, train_on_all_tokens %s; trained tokens (loss_mask 1) "
               "%s\n",
               static_cast<long>(lines), o.data.c_str(), data.chat_template->origin().c_str(),
               static_cast<long>(o.max_seq_len), o.chat_template.train_reasoning ? "true" : "false",
               o.train_on_all_tokens ? "true" : "false", markers.described.c_str());
  if (o.regenerate) {
    std::fprintf(out,
                 "teacher: note: data.regenerate is on: training replaces the assistant turns with the "
                 "teacher's own, which needs the model; these are the lines as written\n");
  }
  if (o.num_data_shards > 1) {
    std::fprintf(out,
                 "teacher: note: this teacher serves shard %d of %d (samples whose index mod %d is %d); "
                 "these are the file's first lines, whatever their shard\n",
                 o.data_shard, o.num_data_shards, o.num_data_shards, o.data_shard);
  }
  std::fprintf(out, "\n");
  for (const LinePreview& line : previews) {
    std::fputs(FormatLinePreview(line, o.data, *data.tokenizer, markers).c_str(), out);
  }
  const PreviewTotals totals = TotalsOf(previews);
  std::fprintf(out, "teacher: preview: %s\n", DescribeTotals(totals).c_str());
  std::fflush(out);
  return totals;
}

absl::StatusOr<std::unique_ptr<EvalSet>> StartEvalSet(const TeacherDataOptions& o, CausalLM* model,
                                                      const TeacherData& data,
                                                      const std::vector<int32_t>& aux_layer_ids,
                                                      int64_t tokens_per_batch) {
  if (o.eval_prompts.empty()) return nullptr;
  DatasetOptions d;
  d.path = o.eval_prompts;
  d.prompts_only = true;
  d.drop_empty_loss_mask = false;
  d.min_length = 1;
  d.skip_malformed = o.skip_malformed;
  d.max_samples = o.eval_samples;
  d.max_line_bytes = o.max_line_bytes;
  d.vocab_size = model->config().vocab_size;
  E3_ASSIGN_OR_RETURN(std::unique_ptr<Dataset> prompts,
                      Dataset::Load(d, *data.tokenizer, *data.chat_template));
  std::printf("teacher: eval prompts %s\n", prompts->Summary().c_str());
  EvalSetOptions e;
  e.max_new_tokens = o.eval_max_new_tokens;
  e.stop_ids = StopIds(*model);
  e.aux_layer_ids = aux_layer_ids;
  e.tokens_per_batch = tokens_per_batch;
  std::vector<std::vector<int32_t>> ids;
  for (const Sample& s : prompts->samples()) ids.push_back(s.input_ids);
  return EvalSet::Start(model, std::move(ids), e);
}

absl::StatusOr<TeacherDataOptions> TeacherDataOptions::From(const RunConfig& c) {
  TeacherDataOptions d;
  d.model_dir = c.model.dir;
  d.data = c.data.train;
  d.chat_template.file = c.chat_template.file;
  d.chat_template.name = c.chat_template.name;
  d.chat_template.train_reasoning = c.chat_template.train_reasoning;
  E3_ASSIGN_OR_RETURN(d.chat_template.kwargs, ParseTemplateKwargs(c.chat_template.kwargs));
  d.skip_malformed = c.data.skip_malformed;
  d.max_seq_len = c.data.max_seq_len;
  d.train_on_all_tokens = c.data.train_on_all_tokens;
  d.max_samples = c.data.max_samples;
  d.max_line_bytes = c.data.max_line_bytes;
  d.regenerate = c.data.regenerate;
  d.regen.generation.max_new_tokens = c.data.regen_max_new_tokens;
  d.regen.generation.max_sequences = c.data.regen_batch_sequences;
  d.regen.generation.kv_cache_bytes =
      static_cast<int64_t>(c.data.regen_kv_cache_gib * static_cast<double>(int64_t{1} << 30));
  d.regen.generation.temperature = c.data.regen_temperature;
  d.regen.generation.seed = c.data.seed;
  d.regen.cache_path = c.data.regen_cache;
  d.draft_vocab_size = c.draft.vocab_size;
  d.vocab_map = c.draft.vocab_map;
  const std::string init_from = c.draft.init_from;
  if (!init_from.empty()) {
    if (!d.vocab_map.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--init_from=", init_from, " and --vocab_map=", d.vocab_map,
          " both name the draft vocab; a warm start serves its draft's own, so give one"));
    }
    d.vocab_map = JoinPath(init_from, "model.safetensors");
  }
  d.vocab_map_out = c.draft.vocab_map_out;
  d.num_data_shards = static_cast<int>(c.teachers.num_data_shards);
  d.data_shard = static_cast<int>(c.teachers.data_shard);
  d.eval_prompts = c.data.eval_prompts;
  d.eval_max_new_tokens = c.data.eval_max_new_tokens;
  d.eval_samples = c.data.eval_samples;
  return d;
}

}  // namespace e3
