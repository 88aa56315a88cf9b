// Every setting of a run, declared once: its section, key, type, default,
// check, the processes that read it, its command-line flag and its help.
// Everything else derives from these rows (common/config/): the run
// config's structs below, YAML files and dotted overrides, the services'
// and the launcher's flags and --help, the resolved run.yaml, and the
// reference in docs/config.md.
//
// A row is X(Type, key, default, check, roles, flag, help):
//   check  what a value must be (common/config/checks.h): Any(), Range(a, b),
//          Choice("a|b"), Dtype(), Port(min), Words(), Commas(), ...;
//   roles  kTeacher, kStudent and kLauncher, or'd: who reads the key;
//   flag   the services' command-line name ("" for keys the launcher
//          alone reads), unique among the flags of each process.
//
// Adding a setting is adding a row here; the component that reads it takes
// it from its section (see docs/decisions/0044-settings-declared-once.md).
#ifndef E3_COMMON_CONFIG_SETTINGS_H_
#define E3_COMMON_CONFIG_SETTINGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/config/checks.h"

namespace e3 {

// model: the target.
#define E3_MODEL_SETTINGS(X)                                                                          \
  X(std::string, dir, "", Path(), kTeacher | kLauncher, "model_dir",                                 \
    "Hugging Face model directory (config.json, safetensors, tokenizer.json)")

// data: what the teacher serves, and how it is cut and ordered.
#define E3_DATA_SETTINGS(X)                                                                           \
  X(std::string, train, "", Path(), kTeacher | kLauncher, "data",                                    \
    "training data, jsonl (conversations, OpenAI messages or input_ids/loss_mask)")                   \
  X(std::string, eval_prompts, "", Path(), kTeacher | kLauncher, "eval_prompts",                     \
    "acceptance eval set, jsonl in a training data format: each line's conversation up to its last "   \
    "user turn is a prompt; the teacher generates its greedy continuation (KV cache, in the "          \
    "background) and serves prompt + continuation with aux states to students (eval_every)")           \
  X(int64_t, eval_samples, 0, Range(0, kMaxInt64), kTeacher, "eval_samples",                         \
    "use at most this many eval prompts (0: all)")                                                     \
  X(int64_t, eval_max_new_tokens, 256, Range(1, kMaxInt64), kTeacher, "eval_max_new_tokens",         \
    "tokens the teacher generates per eval prompt (stops at EOS)")                                     \
  X(int64_t, max_seq_len, 2048, Range(1, kMaxInt64), kTeacher | kLauncher, "max_seq_len",            \
    "samples are cut to this many tokens")                                                             \
  X(int64_t, max_samples, 0, Range(0, kMaxInt64), kTeacher, "max_samples",                           \
    "use at most this many samples (0: all)")                                                          \
  X(int64_t, max_line_bytes, int64_t{8} << 20, Range(0, kMaxInt64), kTeacher, "max_line_bytes",     \
    "data lines longer than this many bytes are counted malformed without being read (parsing and "    \
    "tokenizing a line costs tens of times its size); 0: no bound")                                    \
  X(int64_t, epochs, 1, Range(1, kMaxInt64), kTeacher | kLauncher, "epochs", "passes over the data") \
  X(uint64_t, seed, 42, Any(), kTeacher, "data_seed",                                                \
    "seed of the sample order (and of regenerate's sampled draws)")                                    \
  X(bool, train_on_all_tokens, false, Any(), kTeacher, "train_on_all_tokens",                        \
    "loss on every token, not only assistant turns")                                                   \
  X(bool, skip_malformed, true, Any(), kTeacher, "skip_malformed",                                   \
    "skip and count malformed data lines (false: fail on the first)")                                 \
  X(bool, regenerate, false, Any(), kTeacher, "regenerate",                                          \
    "replace each assistant turn of the data with the teacher's own continuation of the "             \
    "conversation so far (KV cache, batched) before training; the result is cached (regen_cache) "   \
    "and reused on restart")                                                                           \
  X(double, regen_temperature, 0.0, Range(0.0, kInf), kTeacher, "regen_temperature",                 \
    "regenerate: sampling temperature (0: greedy); draws are seeded by data.seed")                     \
  X(int64_t, regen_max_new_tokens, 1024, Range(1, kMaxInt64), kTeacher, "regen_max_new_tokens",      \
    "regenerate: most tokens per assistant turn (stops at EOS)")                                       \
  X(int64_t, regen_batch_sequences, 0, Range(0, kMaxInt64), kTeacher, "regen_batch_sequences",       \
    "regenerate: conversations decoded together, grouped by prompt length (see regen_kv_cache_gib); "  \
    "0: 256 on a GPU, where a decode step costs about the same for 32 or 256 sequences, 32 on the "   \
    "CPU, where it grows with them")                                                                   \
  X(double, regen_kv_cache_gib, 8.0, Range(0.0, kInf), kTeacher, "regen_kv_cache_gib",               \
    "regenerate: most GiB of KV cache a group of regen_batch_sequences may take (each sequence sized " \
    "for the group's longest prompt plus regen_max_new_tokens)")                                       \
  X(std::string, regen_cache, "", Any(), kTeacher, "regen_cache",                                    \
    "regenerate: the regenerated data (jsonl), with <path>.fingerprint beside it; default "           \
    "regenerated-<fingerprint>.jsonl in the working directory")

// template: how conversations are rendered, and which tokens are trained.
#define E3_TEMPLATE_SETTINGS(X)                                                                       \
  X(std::string, file, "", Path(), kTeacher | kLauncher, "chat_template",                            \
    "a .jinja file to render conversations with instead of the model directory's template "           \
    "(chat_template.jinja, else tokenizer_config.json's chat_template)")                              \
  X(std::string, name, "default", Any(), kTeacher, "chat_template_name",                             \
    "which of tokenizer_config.json's named chat templates to use, when it has a list")               \
  X(std::string, kwargs, "", Any(), kTeacher, "chat_template_kwargs",                                \
    "template variables, as a JSON object or key=value,... (e.g. enable_thinking=false)")             \
  X(bool, train_reasoning, true, Any(), kTeacher, "train_reasoning",                                 \
    "train on assistant turns' reasoning (thinking) as well as their answers")

// draft: the draft model, its vocabulary, its training-time test.
#define E3_DRAFT_SETTINGS(X)                                                                          \
  X(std::string, algorithm, "eagle3", Choice("eagle3|eagle3.1|dflash"), kTeacher | kStudent | kLauncher, \
    "draft_algorithm",                                                                                 \
    "the draft algorithm the student trains: eagle3 (EAGLE-3, training-time test over ttt_length "    \
    "steps), eagle3.1 (EAGLE-3 with an RMSNorm per aux state before fc and the normalised output "    \
    "fed to the next step) or dflash (DFlash: a block of dflash_block_size tokens drafted in one "    \
    "pass from the target's captured layers)")                                                         \
  X(int64_t, dflash_layers, 5, Range(1, 64), kTeacher | kStudent, "dflash_layers",                   \
    "dflash: draft decoder layers; with aux_layer_ids empty the draft reads as many target layers, "  \
    "spread over 1..L-3")                                                                              \
  X(int64_t, dflash_block_size, 16, Range(2, 64), kStudent, "dflash_block_size",                     \
    "dflash: B, the anchor and the B - 1 tokens a block drafts")                                      \
  X(int64_t, dflash_num_anchors, 512, Range(1, kMaxInt64), kStudent, "dflash_num_anchors",           \
    "dflash: blocks per batch, anchored at supervised rows drawn at random")                          \
  X(double, dflash_loss_gamma, 7.0, Range(0.001, kInf), kStudent, "dflash_loss_gamma",               \
    "dflash: drafted row k of a block weighs exp(-(k - 1) / gamma) in the loss")                      \
  X(int64_t, dflash_mask_token_id, -1, Range(-1, kMaxInt64), kStudent, "dflash_mask_token_id",       \
    "dflash: the token id of a block's masked rows; -1: the embedding's last row; must lie inside "   \
    "the target's embedding")                                                                          \
  X(std::string, dflash_labels, "target_argmax", Choice("target_argmax|input_ids|target_distribution"), \
    kStudent, "dflash_labels",                                                                         \
    "dflash: what a drafted row learns: target_argmax (the target's greedy token, as the teacher "     \
    "sends it), input_ids (the data's token, for regenerated data) or target_distribution (the "      \
    "target's softmax from its last hidden state and full head: distillation)")                       \
  X(std::string, dflash_loss, "decay", Choice("decay|dpace"), kStudent, "dflash_loss",               \
    "dflash: how a block's rows weigh in the loss: decay (exp(-(k - 1) / dflash_loss_gamma), "        \
    "normalised) or dpace (D-PACE: each row's detached share in the expected accepted length)")       \
  X(double, dflash_dpace_alpha, 0.5, Range(0.0, 1.0), kStudent, "dflash_dpace_alpha",                \
    "dflash: D-PACE's smoothing, a row's acceptance taken as (1 - alpha) q + alpha")                  \
  X(int64_t, vocab_size, 32000, Range(1, kMaxInt64), kTeacher | kLauncher, "draft_vocab_size",       \
    "draft vocabulary size (capped at the model's vocab)")                                            \
  X(std::string, vocab_map, "", Path(), kTeacher | kLauncher, "vocab_map",                           \
    "load d2t/t2d from this file instead of calibrating on the data")                                 \
  X(std::string, vocab_map_out, "", Any(), kTeacher, "vocab_map_out", "save the calibrated d2t/t2d here") \
  X(std::string, init_from, "", Path(), kTeacher | kStudent | kLauncher, "init_from",                \
    "warm start: a draft export (config.json + model.safetensors) whose weights start the run when "  \
    "no checkpoint resumes it (fresh optimizer state and data stream); the teacher serves its draft " \
    "vocab and, unless aux_layer_ids is given, the draft reads (and the teacher captures) its aux "   \
    "layers")                                                                                          \
  X(std::vector<int64_t>, aux_layer_ids, {}, Commas(0), kTeacher | kStudent, "aux_layer_ids",        \
    "decoder layers whose outputs the draft reads, in its order (ids in [0, L-2]): the student asks "  \
    "its teachers for them, the teacher captures them; empty: a warm start's, else the algorithm's "   \
    "default ([1, L/2-1, L-4]; dflash: dflash_layers spread over 1..L-3)")                            \
  X(int64_t, ttt_length, 7, Range(1, 64), kStudent | kLauncher, "ttt_length",                         \
    "training-time-test steps")                                                                        \
  X(std::string, ttt_positions, "advancing", Choice("advancing|fixed"), kStudent, "ttt_positions",   \
    "rope positions of TTT step j: advancing (t + j, as a serving engine advances each draft step) "  \
    "or fixed (t at every step, SpecForge v0.2)")                                                      \
  X(std::string, ttt_loss, "soft_ce", Choice("soft_ce|lk_alpha|lk_lambda"), kStudent, "ttt_loss",    \
    "each TTT step's loss: soft_ce (soft cross-entropy against the target distribution), lk_alpha "   \
    "(-log of the expected acceptance rate) or lk_lambda (soft CE blended into 1 - acceptance rate "  \
    "as it grows; SpecForge's LK losses); the LK losses also fetch the target head's other rows")     \
  X(double, kl_scale, 1.0, Range(0.0, kInf), kStudent, "kl_scale",                                   \
    "ttt_loss lk_lambda: the soft CE's weight is kl_scale * exp(-kl_decay * acceptance rate)")        \
  X(double, kl_decay, 1.0, Range(0.0, kInf), kStudent, "kl_decay", "ttt_loss lk_lambda: see kl_scale") \
  X(int64_t, intermediate_size, 0, Range(0, kMaxInt64), kStudent | kLauncher, "intermediate_size",   \
    "draft MLP width (0: the target's)")                                                               \
  X(uint64_t, init_seed, 0, Any(), kStudent, "init_seed", "seed of the draft's initial weights")     \
  X(std::string, kernels, "fast", Choice("fast|reference"), kStudent, "student_kernels",             \
    "fast: fused kernels, flash attention and a fused AdamW (ATen statements of the same math on the " \
    "CPU); reference: the plain LibTorch op sequence and torch::optim::AdamW")                        \
  X(std::string, dtype, "", Dtype(), kStudent | kLauncher, "dtype",                                  \
    "draft compute dtype: float32, bfloat16 or float16; empty: bfloat16 on a GPU (fp32 master "       \
    "weights), float32 on the CPU")                                                                    \
  X(std::string, export_dtype, "bfloat16", Dtype(), kStudent, "export_dtype",                        \
    "dtype of the exported weights")

// schedule: the student's optimization, checkpoints and measurements.
#define E3_SCHEDULE_SETTINGS(X)                                                                       \
  X(int64_t, tokens_per_batch, 4096, Range(1, kMaxInt64), kTeacher | kLauncher, "tokens_per_batch",  \
    "token budget of one student rank's batch (a global batch holds world x this)")                   \
  X(double, lr, 1e-4, Range(0.0, kInf), kStudent | kLauncher, "lr", "peak learning rate (AdamW)")   \
  X(double, min_lr_ratio, 0.5, Range(0.0, 1.0), kStudent, "min_lr_ratio",                            \
    "cosine floor as a fraction of the peak")                                                          \
  X(double, warmup_ratio, 0.02, Range(0.0, 1.0), kStudent, "warmup_ratio",                           \
    "warmup steps as a fraction of the planned steps")                                                 \
  X(int64_t, warmup_steps, -1, Range(-1, kMaxInt64), kStudent, "warmup_steps",                       \
    "warmup steps (-1: from warmup_ratio)")                                                            \
  X(double, weight_decay, 0.0, Range(0.0, kInf), kStudent, "weight_decay", "AdamW weight decay")      \
  X(double, adam_beta1, 0.9, Range(0.0, kBelowOne), kStudent, "adam_beta1", "AdamW beta1")           \
  X(double, adam_beta2, 0.999, Range(0.0, kBelowOne), kStudent, "adam_beta2", "AdamW beta2")         \
  X(double, grad_clip, 0.5, Range(0.0, kInf), kStudent, "grad_clip", "max global gradient norm (0: off)") \
  X(int64_t, max_steps, 0, Range(0, kMaxInt64), kStudent | kLauncher, "max_steps",                   \
    "stop after this many steps (0: when the teachers' data ends)")                                   \
  X(int64_t, checkpoint_every, 100, Range(0, kMaxInt64), kStudent | kLauncher, "checkpoint_every",   \
    "steps between checkpoints")                                                                       \
  X(int64_t, keep_checkpoints, 2, Range(2, kMaxInt32), kStudent, "keep_checkpoints",                  \
    "checkpoints kept (at least 2: the newest, and the one a resume falls back to when the newest is " \
    "damaged)")                                                                                        \
  X(std::string, on_checkpoint_save_error, "stop", Choice("stop|continue"), kStudent,                \
    "on_checkpoint_save_error",                                                                        \
    "a checkpoint that cannot be written (disk full): stop the run, or continue training (reported; "  \
    "the previous checkpoint stays the newest)")                                                       \
  X(std::string, on_checkpoint_load_error, "stop", Choice("stop|start_fresh"), kStudent,             \
    "on_checkpoint_load_error",                                                                        \
    "no checkpoint loads (a damaged newest one is always skipped for an older one): stop, or "        \
    "start_fresh from the initial draft")                                                              \
  X(int64_t, log_every, 10, Range(0, kMaxInt32), kStudent, "log_every", "steps between log lines")    \
  X(int64_t, eval_every, 0, Range(0, kMaxInt64), kStudent | kLauncher, "eval_every",                 \
    "measure the real acceptance length on the teacher's eval set (data.eval_prompts) every this "    \
    "many steps; 0: only at the end. Without an eval set at the teacher nothing is measured")         \
  X(int64_t, eval_chain, 7, Range(1, 64), kStudent, "eval_chain",                                    \
    "draft tokens per verify round (chain length K); 3 and 5 are reported too")                       \
  X(double, eval_wait_s, 600, Range(0.0, kInf), kStudent, "eval_wait_s",                             \
    "at the end, wait this long for the teacher to finish generating its eval set")                   \
  X(bool, eval_untrained, true, Any(), kStudent, "eval_untrained",                                   \
    "at the end, also measure the draft as it started (initialised, or the warm start's)")            \
  X(int64_t, early_stop_patience, 0, Range(0, kMaxInt64), kStudent, "early_stop_patience",           \
    "stop once this many real-acceptance measurements in a row brought no better tau (0: never)")    \
  X(int64_t, credit_window, 4, Range(1, 1024), kStudent | kLauncher, "credit_window",                \
    "a student's batches in flight / prefetched (a teacher caps it at its teachers.credit_window)")

// teachers: how the launcher lays teachers out, and each teacher process.
#define E3_TEACHERS_SETTINGS(X)                                                                       \
  X(std::vector<std::string>, devices, {}, Commas(), kLauncher, "",                                  \
    "the launcher's teacher devices: GPU indices, cuda:N or cpu; cut into TP groups of tp")           \
  X(int64_t, tp, 1, Range(1, 1024), kTeacher | kLauncher, "tp_size",                                 \
    "tensor-parallel ranks of a teacher (one process each; rank 0 serves gRPC)")                      \
  X(int64_t, ep, 1, Range(1, 1024), kTeacher | kLauncher, "ep_size",                                 \
    "expert-parallel groups of a MoE model's experts; divides tp")                                    \
  X(int64_t, tp_rank, -1, Range(-1, 1023), kTeacher, "tp_rank",                                      \
    "this process's tensor-parallel rank (-1: $RANK, else 0)")                                        \
  X(std::string, device, "cpu", Any(), kTeacher, "device", "this teacher's device: cpu or cuda:N")   \
  X(std::string, backend, "auto", Choice("auto|hf|sgl"), kTeacher | kLauncher, "backend",            \
    "forward backend: auto (sgl on a GPU, hf on the CPU), hf (the reference: transformers' op "       \
    "order) or sgl (SGLang-style: fused QKV and gate-up weights, fused add+RMSNorm/SiLU-mul/rope/"    \
    "argmax CUDA kernels, varlen flash attention, cuBLASLt GEMMs with the residual add in their "     \
    "epilogue, the target argmax through an FP8 candidate search, the forward as a CUDA graph per "   \
    "token budget; same outputs within bf16 rounding)")                                               \
  X(std::string, dtype, "", Dtype(), kTeacher | kLauncher, "dtype",                                  \
    "compute dtype: float32, bfloat16 or float16; empty: bfloat16 on a GPU, float32 on the CPU")      \
  X(int64_t, threads, 0, Range(0, 4096), kTeacher, "threads", "LibTorch intra-op threads (0: default)") \
  X(std::vector<std::string>, args, {}, Words(), kLauncher, "",                                      \
    "further teacher_server flags the launcher passes to every teacher")                              \
  X(int64_t, metrics_port, 0, Port(-1), kTeacher | kLauncher, "metrics_port",                        \
    "port of /metrics (0: a free one, -1: none); under the launcher teacher group i's rank 0 serves " \
    "on this + i (deploy/prometheus/prometheus.yml scrapes 9400)")                                    \
  X(std::string, metrics_host, "127.0.0.1", Any(), kTeacher, "metrics_host", "address /metrics binds") \
  X(std::string, listen, "127.0.0.1:50051", ListenAddress(), kTeacher, "listen",                      \
    "gRPC listen address (port 0 picks one)")                                                          \
  X(std::string, port_file, "", Any(), kTeacher, "port_file", "write the bound gRPC port here once serving") \
  X(std::string, ledger, "", Any(), kTeacher, "ledger",                                               \
    "append the delivery/commit ledger (JSON lines) here; the file is locked while this teacher runs") \
  X(int64_t, student_world_size, 0, Range(0, 10000), kTeacher, "student_world_size",                 \
    "the students' data-parallel world size: subscriptions claiming another are refused (0: the "     \
    "first subscription fixes it; the launcher passes its student count)")                            \
  X(int64_t, num_data_shards, 1, Range(1, kMaxInt32), kTeacher, "num_data_shards",                   \
    "split the data over this many teachers; each serves the samples whose index mod N is its shard") \
  X(int64_t, data_shard, 0, Range(0, kMaxInt32), kTeacher, "data_shard",                             \
    "this teacher's shard in [0, num_data_shards)")                                                    \
  X(int64_t, credit_window, 16, Range(1, 1024), kTeacher, "credit_window",                           \
    "most batches in flight per subscriber (a student asking for more gets this many)")               \
  X(std::string, transports, "", Any(), kTeacher, "transports",                                      \
    "transports offered (default: nccl,cuda_ipc,shm,inline on a GPU, shm,inline on the CPU)")         \
  X(double, subscriber_timeout_s, 60, Range(0.0, kInf), kTeacher, "subscriber_timeout_s",            \
    "buffers of a vanished subscriber are reclaimed after this")                                       \
  X(std::vector<std::string>, serve_algorithms, {}, Commas(), kTeacher, "serve_algorithms",         \
    "further draft algorithms (eagle3, eagle3.1, dflash) whose students this teacher serves besides " \
    "draft.algorithm's: it also captures the layers each reads by default")                          \
  X(std::vector<int64_t>, extra_aux_layer_ids, {}, Commas(0), kTeacher, "extra_aux_layer_ids",       \
    "further decoder layers to capture, for students that read layers of their own "                 \
    "(their aux_layer_ids)")                                                                           \
  X(std::vector<std::string>, student_groups, {}, Commas(), kTeacher, "student_groups",              \
    "named student groups served besides the default one, each a data stream of its own (its "       \
    "cursors, commits, world and ledger <ledger>.<group>.jsonl); a student joins one with "          \
    "students.group")                                                                                  \
  X(bool, exit_when_done, false, Any(), kTeacher, "exit_when_done",                                  \
    "exit once every rank of every student group has committed every epoch")                          \
  X(double, exit_grace_s, 60, Range(0.0, kInf), kTeacher, "exit_grace_s",                            \
    "with exit_when_done: once every epoch is committed, how long to wait for ranks not yet handed "  \
    "the end of their data (the students of a teacher restarted after their last commit) before "     \
    "exiting")                                                                                         \
  X(double, drain_timeout_s, 20, Range(0.0, kInf), kTeacher, "drain_timeout_s",                      \
    "on SIGTERM, how long to keep taking the final commits of students stopped by the same signal "   \
    "(keep it below the scheduler's grace before SIGKILL: Slurm's KillWait)")                         \
  X(std::string, master_addr, "", Any(), kTeacher, "master_addr",                                    \
    "tensor parallelism: rank 0's address for the c10d rendezvous (empty: $MASTER_ADDR, else "       \
    "127.0.0.1)")                                                                                      \
  X(int64_t, master_port, -1, Port(-1), kTeacher, "master_port",                                     \
    "tensor parallelism: rank 0's c10d store port (-1: $MASTER_PORT, else 29600)")                    \
  X(std::string, rendezvous_file, "", Any(), kTeacher, "rendezvous_file",                            \
    "tensor parallelism: meet through a c10d FileStore at this path (a new file per launch; every "   \
    "rank on this machine or a filesystem they share) instead of a TCPStore at master_addr:"          \
    "master_port; nothing listens")                                                                    \
  X(int64_t, max_cuda_graphs, 8, Range(0, 1024), kTeacher, "max_cuda_graphs",                         \
    "sgl on a GPU: most token budgets whose whole forward is kept as a CUDA graph (captured the "     \
    "third time a budget is seen, where its timed second forward spent graph_min_host_share of its "  \
    "time issuing kernels); 0 runs every forward eagerly")                                            \
  X(double, graph_min_host_share, 0.2, Range(0.0, 1.0), kTeacher, "graph_min_host_share",           \
    "sgl with CUDA graphs: capture a budget only if the host's issuing took at least this share of "  \
    "its timed eager forward (0: capture every budget)")                                              \
  X(int64_t, graph_token_step, 128, Range(1, kMaxInt64), kTeacher, "graph_token_step",               \
    "sgl with CUDA graphs: ragged batches are padded to a multiple of this")                          \
  X(int64_t, tp_overlap_min_tokens, 4096, Range(0, kMaxInt64), kTeacher, "tp_overlap_min_tokens",    \
    "sgl under tp > 1: split a batch at a sample boundary into two micro-batches whose all-reduces "   \
    "run while the other computes, where each half holds at least this many tokens (0: never split)") \
  X(bool, gemm_tuning, true, Any(), kTeacher, "gemm_tuning",                                         \
    "sgl on a GPU: pick the projections' cuBLASLt algorithms at startup by timing the forward's "     \
    "whole GEMM sequence at tokens_per_batch rows (about a minute for an 8B model, then cached; "     \
    "outputs unchanged)")                                                                              \
  X(std::string, gemm_tuning_cache, "default", Any(), kTeacher, "gemm_tuning_cache",                 \
    "JSON file of earlier GEMM tunings, reused when device, cuBLASLt, rows and shapes match; "        \
    "'default': $XDG_CACHE_HOME/e3/gemm_tuning.json (else ~/.cache/e3/...); empty: tune at every "   \
    "start")                                                                                           \
  X(std::string, tls_cert, "", Path(), kTeacher, "tls_cert",                                          \
    "PEM certificate chain: serve gRPC over TLS (with tls_key)")                                      \
  X(std::string, tls_key, "", Path(), kTeacher, "tls_key", "PEM private key of tls_cert")             \
  X(std::string, tls_ca, "", Path(), kTeacher, "tls_ca",                                              \
    "PEM CA: mutual TLS, students must present a certificate this CA signed (needs tls_cert)")        \
  X(std::string, auth_token_file, "", Path(), kTeacher, "auth_token_file",                           \
    "a file whose first line is a shared token every call must carry (students: the same flag); "    \
    "calls without it are refused UNAUTHENTICATED")                                                    \
  X(int64_t, max_receive_message_bytes, int64_t{4} << 20, Range(1, kMaxInt32), kTeacher,             \
    "max_receive_message_bytes", "largest request the server accepts (students send ids and cursors)") \
  X(int64_t, max_send_message_bytes, int64_t{512} << 20, Range(1, kMaxInt32), kTeacher,              \
    "max_send_message_bytes", "largest message the server sends (an inline batch carries its hidden " \
    "states)")                                                                                         \
  X(int64_t, max_generate_new_tokens, 512, Range(1, kMaxInt64), kTeacher, "max_generate_new_tokens", \
    "most tokens one Generate call may ask for")                                                      \
  X(int64_t, max_generate_prompt_tokens, 4096, Range(1, kMaxInt64), kTeacher,                        \
    "max_generate_prompt_tokens", "longest prompt one Generate call may send")

// students: how the launcher lays students out, and each student process.
#define E3_STUDENTS_SETTINGS(X)                                                                       \
  X(std::vector<std::string>, devices, {}, Commas(), kLauncher, "",                                  \
    "the launcher's student devices, one data-parallel rank each: GPU indices, cuda:N or cpu")        \
  X(std::string, teacher, "127.0.0.1:50051", Any(), kStudent, "teacher",                             \
    "teacher gRPC address, or several comma-separated (teachers serving data shards; round-robin)")  \
  X(int64_t, rank, -1, Range(-1, 9999), kStudent, "rank", "data-parallel rank (-1: $RANK, else 0)")  \
  X(int64_t, world_size, -1, Range(-1, 10000), kStudent, "world_size",                               \
    "data-parallel world size (-1: $WORLD_SIZE, else 1)")                                             \
  X(std::string, group, "", Any(), kStudent, "student_group",                                        \
    "the student group this student trains in at its teachers (their teachers.student_groups); "     \
    "empty: the default group")                                                                        \
  X(std::string, subscriber_id, "", Any(), kStudent, "subscriber_id",                                \
    "stable id of this student (default: rank-<rank>)")                                               \
  X(std::string, device, "", Any(), kStudent, "device",                                              \
    "cpu or cuda:N (default: cuda:$LOCAL_RANK when LOCAL_RANK is set and CUDA is available, else "    \
    "cpu)")                                                                                            \
  X(int64_t, threads, 0, Range(0, 4096), kStudent | kLauncher, "threads",                            \
    "LibTorch intra-op threads (0: default)")                                                          \
  X(std::vector<std::string>, args, {}, Words(), kLauncher, "",                                      \
    "further student_trainer flags the launcher passes to every student")                             \
  X(int64_t, metrics_port, 0, Port(-1), kStudent | kLauncher, "metrics_port",                        \
    "port of /metrics (0: a free one, -1: none); under the launcher rank r serves on this + r "       \
    "(deploy/prometheus/prometheus.yml scrapes 9500 + r)")                                            \
  X(std::string, metrics_host, "127.0.0.1", Any(), kStudent, "metrics_host", "address /metrics binds") \
  X(int64_t, metrics_linger_s, 0, Range(0, kMaxInt32), kStudent, "metrics_linger_s",                 \
    "after the run, keep serving /metrics this many seconds (or until SIGTERM), so that Prometheus "  \
    "scrapes the final step and acceptance length")                                                   \
  X(std::string, checkpoint_dir, "", Any(), kStudent, "checkpoint_dir", "checkpoints (and resume) here") \
  X(std::string, output_dir, "", Any(), kStudent, "output_dir",                                      \
    "export the final draft here (config.json + model.safetensors)")                                  \
  X(std::string, best_dir, "", Any(), kStudent, "best_dir",                                          \
    "export the draft with the best real acceptance length here whenever a measurement beats the "    \
    "best (eval_every), with its step and tau in config.json (\"e3_best\")")                          \
  X(std::string, summary_json, "", Any(), kStudent, "summary_json", "write the run summary (JSON) here") \
  X(std::string, step_log, "", Any(), kStudent, "step_log",                                          \
    "append one JSON line per training step here (step, loss, simulated_tau, acc per TTT step, lr, "  \
    "tokens) and one per acceptance measurement (step, eval); with several ranks, to <path>.rank<r>") \
  X(std::string, tensorboard_dir, "", Any(), kStudent, "tensorboard_dir",                            \
    "rank 0 writes the step log's scalars (loss, acc_j, simulated and real tau, lr, throughput, data " \
    "wait) here as TensorBoard event files")                                                          \
  X(std::string, eval_dump, "", Any(), kStudent, "eval_dump",                                        \
    "write the eval set and the final acceptance here (safetensors), for "                            \
    "tools/acceptance_crosscheck.py")                                                                  \
  X(std::string, transports, "", Any(), kStudent, "transports",                                      \
    "transports accepted (default: nccl,cuda_ipc,shm,inline on a GPU, shm,inline on the CPU)")        \
  X(int64_t, connect_attempts, 6, Range(1, kMaxInt32), kStudent, "connect_attempts",                 \
    "attempts at the first connection (with exponential backoff) before giving up on a teacher")      \
  X(double, initial_backoff_s, 0.5, Range(0.0, kInf), kStudent, "initial_backoff_s",                 \
    "first retry delay; doubles each attempt")                                                        \
  X(double, teacher_wait_s, 1800, Range(0.0, kInf), kStudent, "teacher_wait_s",                      \
    "once training: how long a teacher may stay away (killed and restarted, drained, unreachable) "   \
    "before the run fails; the student resubscribes at its cursor when it is back, with a progress "  \
    "line every 10 s")                                                                                 \
  X(double, keepalive_ping_s, 10, Range(1.0, kInf), kStudent, "keepalive_ping_s",                    \
    "ping a teacher connection that has been quiet this long (HTTP/2 keepalive; at least 1)")         \
  X(double, keepalive_timeout_s, 5, Range(kTiny, kInf), kStudent, "keepalive_timeout_s",             \
    "a ping unanswered this long closes the connection: the teacher counts as unreachable")          \
  X(std::string, master_addr, "", Any(), kStudent, "master_addr",                                    \
    "data parallelism: rank 0's address (empty: $MASTER_ADDR, else 127.0.0.1)")                       \
  X(int64_t, master_port, -1, Port(-1), kStudent, "master_port",                                     \
    "data parallelism: rank 0's c10d store port (-1: $MASTER_PORT, else 29500)")                      \
  X(std::string, rendezvous_file, "", Any(), kStudent, "rendezvous_file",                            \
    "data parallelism: meet through a c10d FileStore at this path (a new file per launch; every rank " \
    "on this machine or a filesystem they share) instead of a TCPStore at master_addr:master_port; " \
    "nothing listens")                                                                                 \
  X(std::string, tls_ca, "", Path(), kStudent, "tls_ca",                                              \
    "PEM CA that signed the teachers' certificates: talk TLS to them (the system's roots verify when " \
    "only tls_cert is given)")                                                                         \
  X(std::string, tls_cert, "", Path(), kStudent, "tls_cert",                                          \
    "PEM certificate chain this student presents (mutual TLS; with tls_key)")                         \
  X(std::string, tls_key, "", Path(), kStudent, "tls_key", "PEM private key of tls_cert")             \
  X(std::string, tls_server_name, "", Any(), kStudent, "tls_server_name",                            \
    "the name the teachers' certificates carry, when teacher dials another (an IP, a service alias)") \
  X(std::string, auth_token_file, "", Path(), kStudent, "auth_token_file",                           \
    "a file whose first line is the teachers' shared token (teacher_server --auth_token_file), sent " \
    "on every call")                                                                                   \
  X(int64_t, max_receive_message_bytes, int64_t{512} << 20, Range(1, kMaxInt32), kStudent,           \
    "max_receive_message_bytes", "largest message this student takes from a teacher (an inline "      \
    "batch)")                                                                                          \
  X(uint64_t, max_weights_bytes, uint64_t{64} << 30, Any(), kStudent, "max_weights_bytes",           \
    "most bytes the frozen weights from GetWeights may take, all tensors together")

// run: where a launched run keeps its files.
#define E3_RUN_SETTINGS(X)                                                                            \
  X(std::string, out, "run", NonEmpty(), kLauncher, "",                                              \
    "the run's directory: resolved config, logs, checkpoints, the drafts, ledgers, curves")           \
  X(int64_t, master_port, 29500, Port(1), kLauncher, "",                                             \
    "unused: the launcher's c10d groups meet through files under out (nothing listens); still read " \
    "so that older configs load")

// launcher: e3_launch's own settings.
#define E3_LAUNCHER_SETTINGS(X)                                                                       \
  X(bool, plan, false, Any(), kLauncher, "plan",                                                     \
    "print the resolved layout (processes, devices, ports, batch and memory estimate per device) and " \
    "exit")                                                                                            \
  X(std::string, build_dir, "", Any(), kLauncher, "build_dir",                                       \
    "the build tree holding teacher_server/ and student_trainer/ (default: the one e3_launch is in)") \
  X(double, status_every_s, 10, Range(0.0, kInf), kLauncher, "status_every_s",                       \
    "when the output is not a terminal: status lines that changed, this often")                       \
  X(double, teacher_exit_wait_s, 10, Range(0.0, kInf), kLauncher, "teacher_exit_wait_s",             \
    "once the students are done, how long teachers may take to see every rank committed and exit")   \
  X(double, earlier_exit_wait_s, 60, Range(0.0, kInf), kLauncher, "earlier_exit_wait_s",             \
    "on a run.out whose earlier launcher died, how long its processes (draining on SIGTERM) may take " \
    "to exit before this launch gives up")                                                             \
  X(int64_t, log_tail_lines, 20, Range(0, kMaxInt32), kLauncher, "log_tail_lines",                   \
    "lines of a failed process's log to show")                                                        \
  X(bool, plot, true, Any(), kLauncher, "plot",                                                      \
    "draw the run's curves into <run.out>/run.png at the end (tools/plot_run.py)")

// The sections, in the order the reference lists them: S(Struct, member,
// "yaml name", rows).
#define E3_RUN_CONFIG_SECTIONS(S)                                                                     \
  S(ModelSettings, model, "model", E3_MODEL_SETTINGS)                                                \
  S(DataSettings, data, "data", E3_DATA_SETTINGS)                                                    \
  S(TemplateSettings, chat_template, "template", E3_TEMPLATE_SETTINGS)                               \
  S(DraftSettings, draft, "draft", E3_DRAFT_SETTINGS)                                                \
  S(ScheduleSettings, schedule, "schedule", E3_SCHEDULE_SETTINGS)                                    \
  S(TeachersSettings, teachers, "teachers", E3_TEACHERS_SETTINGS)                                    \
  S(StudentsSettings, students, "students", E3_STUDENTS_SETTINGS)                                    \
  S(RunSettings, run, "run", E3_RUN_SETTINGS)                                                        \
  S(LauncherSettings, launcher, "launcher", E3_LAUNCHER_SETTINGS)

}  // namespace e3

#endif  // E3_COMMON_CONFIG_SETTINGS_H_
