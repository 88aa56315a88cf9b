#!/usr/bin/env python3
"""Time SpecForge HEAD's own EAGLE-3 training step on random inputs.

What runs is SpecForge's default offline/streaming EAGLE-3 training step, built
from SpecForge's own objects exactly as specforge/training/trainer.py and
specforge/algorithms/model_providers.py assemble them:

  draft     specforge.modeling.draft.llama3_eagle.LlamaForCausalLMEagle3
            (built, .to(bf16), vocab mapping loaded, embedding frozen, moved to
            the GPU as build_eagle3_draft does)
  model     specforge.algorithms.eagle3.model.OnlineEagle3Model(length=7,
            attention_backend="flex_attention" | "sdpa"), .to(cuda, bf16)
  teacher   specforge.modeling.target.target_head.TargetHead (frozen bf16
            lm_head [128256, 4096], random weights) over the target's last
            hidden state ("hidden_state" target representation, the only one
            HEAD's EAGLE-3 feature contracts allow); compact_teacher=False is
            HEAD's default (--teacher compact switches it on)
  step      specforge.training.controller.TrainerCore.train_step over
            specforge.training.strategies.base.Eagle3TrainStrategy and
            specforge.training.backend.FSDPTrainingBackend (FSDP1 wrap, as the
            trainer does even on one GPU; --wrap none leaves it out)
  optimizer specforge.optimizer.BF16Optimizer (fp32 masters, torch AdamW,
            weight_decay 0, grad clip 0.5, lr 1e-4 peak with SpecForge's
            default cosine schedule and warmup_ratio 0.015), built with the
            arguments of specforge.training.assembly._ConfiguredOptimizerFactory

Per T it prints one JSON line per harness:
  harness "core":   TrainerCore.train_step (forward+loss, backward, optimizer
                    step incl. clip, and the trainer's metric reduction)
  harness "manual": Eagle3TrainStrategy.forward_loss -> backend.backward ->
                    backend.step (the same step without metric reduction)

SpecForge itself is never committed here. Fetch sgl-project/SpecForge and
extract its package into the ignored folder .baseline/specforge:
  mkdir -p .baseline/specforge && git --git-dir=<snapshot>.git archive a6b6b023 \
      specforge version.txt | tar -x -C .baseline/specforge
then run with PYTHONPATH=.baseline/specforge (bench/run_gpu_benches.sh BUILD
specforge does, carrying .baseline to the GPU machine).
"""

import argparse
import gc
import json
import logging
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback
import types
from datetime import timedelta


SPECFORGE_COMMIT = "a6b6b023"
SHIMS = []  # what was shimmed, reported in the "env" line

# Settings the GPU machines ask for (NVLink multicast off); harmless elsewhere.
for _k, _v in (
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
    ("HF_HUB_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
    ("TOKENIZERS_PARALLELISM", "false"),
):
    os.environ.setdefault(_k, _v)


def emit(obj):
    print(json.dumps(obj), flush=True)


def log(msg):
    print(f"[sf_step] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# transformers 5.x compatibility checks (SpecForge HEAD pins 5.8.1; the GPU
# machine has 5.17). Only names that SpecForge imports at module level are
# checked. Names on the measured path must exist (one exception below, with an
# equivalent); names off the measured path get inert placeholders if missing.
# ---------------------------------------------------------------------------
ON_PATH_NAMES = {
    "transformers": ["AutoConfig"],
    "transformers.cache_utils": ["Cache", "DynamicCache"],
    "transformers.modeling_utils": ["PreTrainedModel"],
    "transformers.activations": ["ACT2FN"],
    "transformers.models.llama.configuration_llama": ["LlamaConfig"],
    "transformers.utils": ["is_torchdynamo_compiling"],
}
OFF_PATH_NAMES = {
    # specforge/utils.py: tokenizer loading only
    "transformers": ["AutoTokenizer", "PreTrainedTokenizerFast", "DynamicCache"],
    "transformers.utils": ["cached_file"],
    # specforge/modeling/draft/dflash.py, dflash_kernels.py (DFlash drafts only)
    "transformers.modeling_outputs": ["CausalLMOutputWithPast"],
    "transformers.models.qwen3.modeling_qwen3": [
        "ALL_ATTENTION_FUNCTIONS",
        "FlashAttentionKwargs",
        "GradientCheckpointingLayer",
        "Qwen3Config",
        "Qwen3PreTrainedModel",
        "Qwen3RotaryEmbedding",
        "eager_attention_forward",
        "rotate_half",
        "Qwen3MLP",
        "Qwen3RMSNorm",
    ],
}


def _placeholder(modname, name):
    import torch

    if "Kwargs" in name:
        from typing_extensions import TypedDict

        return TypedDict(name, {}, total=False)
    if name.isupper():
        return {}
    if name[:1].isupper():
        return type(
            name,
            (torch.nn.Module,),
            {"__doc__": f"sf_step placeholder for missing {modname}.{name}"},
        )

    def _missing(*_a, **_k):
        raise RuntimeError(f"sf_step placeholder {modname}.{name} was called")

    _missing.__name__ = name
    return _missing


def apply_transformers_shims():
    import importlib

    import torch

    for modname, names in OFF_PATH_NAMES.items():
        try:
            mod = importlib.import_module(modname)
        except Exception as exc:  # whole module unavailable: stub it
            mod = types.ModuleType(modname)
            sys.modules[modname] = mod
            SHIMS.append(f"module {modname} (import failed: {exc!r}) -> stub")
        for name in names:
            try:
                getattr(mod, name)
            except Exception:
                setattr(mod, name, _placeholder(modname, name))
                SHIMS.append(f"{modname}.{name} missing -> off-path placeholder")

    missing = []
    for modname, names in ON_PATH_NAMES.items():
        mod = importlib.import_module(modname)
        for name in names:
            try:
                getattr(mod, name)
            except Exception:
                if modname == "transformers.utils" and name == "is_torchdynamo_compiling":
                    mod.is_torchdynamo_compiling = torch.compiler.is_compiling
                    SHIMS.append(
                        "transformers.utils.is_torchdynamo_compiling missing -> "
                        "torch.compiler.is_compiling (same meaning)"
                    )
                else:
                    missing.append(f"{modname}.{name}")
    if missing:
        raise ImportError(f"on-path transformers names missing: {missing}")


# Placeholders for the sibling draft modules that specforge/modeling/draft/
# __init__.py imports but the EAGLE-3 Llama draft never uses. Used only if the
# normal import of the package fails.
DRAFT_SIBLING_STUBS = {
    "specforge.modeling.draft.dflash_kernels": ["DFlashKernels", "DEFAULT_DFLASH_KERNELS"],
    "specforge.modeling.draft.dflash": [
        "DFlashDraftModel",
        "build_target_layer_ids",
        "extract_context_feature",
        "sample",
    ],
    "specforge.modeling.draft.domino": ["DominoDraftModel"],
    "specforge.modeling.draft.dspark": ["DSparkDraftModel"],
    "specforge.modeling.draft.peagle": ["PEagleDraftModel"],
}


def import_specforge():
    """Import the SpecForge modules on the measured path; return them in a namespace."""
    try:
        import specforge.modeling.draft  # noqa: F401
    except Exception:
        log("import specforge.modeling.draft failed; traceback follows, retrying "
            "with the off-path sibling draft modules (DFlash/Domino/DSpark/P-EAGLE) stubbed")
        traceback.print_exc()
        for key in [k for k in sys.modules if k == "specforge" or k.startswith("specforge.")]:
            del sys.modules[key]
        for modname, names in DRAFT_SIBLING_STUBS.items():
            mod = types.ModuleType(modname)
            for name in names:
                setattr(mod, name, _placeholder(modname, name))
            sys.modules[modname] = mod
            SHIMS.append(f"{modname} -> stub module (off path: not the EAGLE-3 Llama draft)")
        import specforge.modeling.draft  # noqa: F401

    from specforge.algorithms.eagle3.model import OnlineEagle3Model
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from specforge.modeling.target.target_head import TargetHead
    from specforge.optimizer import BF16Optimizer
    from specforge.runtime.contracts import TrainBatch
    from specforge.training.backend import FSDPTrainingBackend, ParallelConfig
    from specforge.training.controller import TrainerCore
    from specforge.training.strategies.base import Eagle3TrainStrategy

    return types.SimpleNamespace(
        OnlineEagle3Model=OnlineEagle3Model,
        LlamaForCausalLMEagle3=LlamaForCausalLMEagle3,
        TargetHead=TargetHead,
        BF16Optimizer=BF16Optimizer,
        TrainBatch=TrainBatch,
        FSDPTrainingBackend=FSDPTrainingBackend,
        ParallelConfig=ParallelConfig,
        TrainerCore=TrainerCore,
        Eagle3TrainStrategy=Eagle3TrainStrategy,
    )


# ---------------------------------------------------------------------------
# torch.distributed: SpecForge's trainer runs under torchrun with a process
# group (specforge.distributed.init_distributed). That function also imports
# yunchang for sequence-parallel groups, which the GPU machine lacks and which
# only the "usp" backend uses, so the default process group (world size 1) is
# initialised directly instead; SpecForge's SP/TP group getters stay None.
# ---------------------------------------------------------------------------
def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_dist(preferred):
    import torch
    import torch.distributed as dist

    if preferred == "none":
        return None
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    torch.cuda.set_device(0)
    order = [preferred] + [b for b in ("nccl", "gloo") if b != preferred]
    for backend in order:
        try:
            dist.init_process_group(
                backend=backend, rank=0, world_size=1, timeout=timedelta(minutes=10)
            )
            # one collective so a broken backend fails here, not inside a step
            t = torch.ones(1, device="cuda")
            dist.all_reduce(t)
            torch.cuda.synchronize()
            return backend
        except Exception as exc:
            log(f"init_process_group({backend}) failed: {exc!r}")
            try:
                if dist.is_initialized():
                    dist.destroy_process_group()
            except Exception:
                pass
            os.environ["MASTER_PORT"] = str(_free_port())
    return None


# ---------------------------------------------------------------------------
# Model assembly
# ---------------------------------------------------------------------------
HIDDEN = 4096
VOCAB = 128256
DRAFT_VOCAB = 32000


def draft_config(sf, max_pos):
    from transformers.models.llama.configuration_llama import LlamaConfig

    # The fields SpecForge's draft config for Llama-3.1-8B carries
    # (configs/llama3-8B-eagle3.json, and model_loading._generate_draft_config
    # for a target-derived one), with the 8B target's rope theta and a position
    # table long enough for the longest T plus the TTT offsets.
    payload = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 14336,
        "num_hidden_layers": 1,
        "vocab_size": VOCAB,
        "draft_vocab_size": DRAFT_VOCAB,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": max_pos,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "attention_bias": False,
        "pad_token_id": 0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "tie_word_embeddings": False,
        "use_cache": True,
    }
    try:
        # what SpecForge's loaders do (AutoDraftModelConfig.from_file,
        # model_loading._draft_config_from_dict)
        config = LlamaConfig.from_dict(payload)
    except Exception:
        log("LlamaConfig.from_dict(payload) failed; retrying without the "
            "non-Llama keys and setting them as attributes")
        traceback.print_exc()
        extra = {k: payload.pop(k) for k in ("draft_vocab_size", "architectures")}
        config = LlamaConfig(**payload)
        for k, v in extra.items():
            setattr(config, k, v)
        SHIMS.append("LlamaConfig rejected draft_vocab_size/architectures in from_dict -> set as attributes")
    # transformers 5 keeps rope settings in config.rope_parameters; make sure
    # theta is 500000 whichever form this version uses (it only sets the
    # values of the cos/sin table, not the work done).
    rp = getattr(config, "rope_parameters", None)
    if isinstance(rp, dict):
        rp["rope_theta"] = 500000.0
    else:
        config.rope_theta = 500000.0
    if not hasattr(config, "pretraining_tp"):
        # LlamaMLP.forward reads config.pretraining_tp; 1 is its default
        # (no tensor-parallel slicing).
        config.pretraining_tp = 1
        SHIMS.append("LlamaConfig.pretraining_tp missing -> 1 (its default)")
    if getattr(config, "draft_vocab_size", None) != DRAFT_VOCAB:
        config.draft_vocab_size = DRAFT_VOCAB
    return config


def build_draft(sf, config, attention_backend, device):
    import torch

    def construct():
        return sf.LlamaForCausalLMEagle3(config, attention_backend=attention_backend)

    try:
        with torch.device(device):  # fast random init on the GPU
            draft = construct()
    except Exception:
        log("constructing the draft under torch.device(cuda) failed; retrying on CPU")
        traceback.print_exc()
        try:
            draft = construct()
        except Exception:
            # transformers post_init incompatibility: the modules are already
            # built with torch's default random init; skip post_init.
            log("draft construction failed; retrying with PreTrainedModel.post_init as a no-op")
            traceback.print_exc()
            from transformers.modeling_utils import PreTrainedModel

            orig = PreTrainedModel.post_init
            PreTrainedModel.post_init = lambda self: None
            try:
                draft = construct()
            finally:
                PreTrainedModel.post_init = orig
            SHIMS.append("PreTrainedModel.post_init skipped for the draft (random init only)")
    # AutoDraftModel.from_config(..., torch_dtype=bf16)
    draft = draft.to(dtype=torch.bfloat16)
    # model_providers.build_eagle3_draft: vocab mapping, frozen embedding, device+dtype
    gen = torch.Generator().manual_seed(0)
    ids = torch.randperm(VOCAB, generator=gen)[:DRAFT_VOCAB].sort().values
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[ids] = True
    d2t = ids - torch.arange(DRAFT_VOCAB)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "vocab_mapping.pt")
        torch.save({"t2d": t2d, "d2t": d2t}, path)
        draft.load_vocab_mapping(path)
    draft.freeze_embedding()
    return draft.to(device=device, dtype=torch.bfloat16)


def build_target_head(sf, device):
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(
                {
                    "architectures": ["LlamaForCausalLM"],
                    "model_type": "llama",
                    "hidden_size": HIDDEN,
                    "intermediate_size": 14336,
                    "num_attention_heads": 32,
                    "num_key_value_heads": 8,
                    "num_hidden_layers": 32,
                    "vocab_size": VOCAB,
                    "rms_norm_eps": 1e-5,
                    "rope_theta": 500000.0,
                    "max_position_embeddings": 131072,
                    "tie_word_embeddings": False,
                },
                f,
            )
        with torch.device(device):
            head = sf.TargetHead(tmp)
    # TargetHead.from_pretrained minus the checkpoint read: freeze, eval, bf16
    head.freeze_weights()
    head = head.eval().to(device=device, dtype=torch.bfloat16)
    return head


def build_step(sf, args, attention_backend, wrap, device):
    """Assemble model, teacher, backend, optimizer, strategy and TrainerCore."""
    import torch

    config = draft_config(sf, args.max_pos)
    draft = build_draft(sf, config, attention_backend, device)
    # model_providers.build_eagle3_model
    model = sf.OnlineEagle3Model(
        draft_model=draft,
        length=args.ttt,
        attention_backend=attention_backend,
        lk_loss_type=None,
        kl_scale=1.0,
        kl_decay=1.0,
    ).to(device=device, dtype=torch.bfloat16)
    target_head = build_target_head(sf, device)
    target_head.requires_grad_(False)

    # assembly._ConfiguredOptimizerFactory with TrainingConfig defaults
    def optimizer_factory(module):
        return sf.BF16Optimizer(
            module,
            lr=args.lr,
            max_grad_norm=args.max_grad_norm,
            warmup_ratio=args.warmup_ratio,
            lr_scheduler=args.lr_scheduler,
            total_steps=args.total_steps,
            offload_master=False,
        )

    parallel = sf.ParallelConfig.from_distributed(
        tp_size=1, sp_ulysses_size=1, sp_ring_size=1
    )
    backend = sf.FSDPTrainingBackend(parallel, optimizer_factory=optimizer_factory)
    # trainer.py: backend.prepare_model(model, optimizer_target=model.draft_model)
    wrapped = backend.prepare_model(
        model, wrap=(wrap == "fsdp"), optimizer_target=model.draft_model
    )
    strategy = sf.Eagle3TrainStrategy(
        wrapped,
        target_head=target_head,
        compact_teacher=(args.teacher == "compact"),
        compact_teacher_chunk_size=None,
    )
    core = sf.TrainerCore(strategy, backend, accumulation_steps=1)
    rotary = model.draft_model.midlayer.self_attn.rotary_emb
    info = {
        "attn_class": type(model.draft_model.midlayer.self_attn).__name__,
        "rotary": type(rotary).__name__,
        "rope_base": float(getattr(rotary, "base", float("nan"))),
        "rope_table": int(getattr(rotary, "max_seq_len_cached", -1)),
        "trainable_params": sum(
            p.numel() for p in model.parameters() if p.requires_grad
        ),
        "frozen_params": sum(
            p.numel() for p in model.parameters() if not p.requires_grad
        ),
        "wrapper": getattr(backend, "_wrapper_kind", "?"),
        "param_dtype": str(next(model.draft_model.parameters()).dtype),
    }
    return types.SimpleNamespace(
        model=model,
        wrapped=wrapped,
        target_head=target_head,
        backend=backend,
        strategy=strategy,
        core=core,
        info=info,
    )


def make_batch(sf, T, device, seed):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    tensors = {
        "input_ids": torch.randint(0, VOCAB, (1, T), device=device, generator=g),
        "attention_mask": torch.ones(1, T, dtype=torch.long, device=device),
        "loss_mask": torch.ones(1, T, dtype=torch.long, device=device),
        # aux hidden states of three target layers, concatenated
        "hidden_state": torch.randn(
            1, T, 3 * HIDDEN, device=device, dtype=torch.bfloat16, generator=g
        ),
        # the target's last hidden state (TargetHead turns it into the teacher)
        "target": torch.randn(
            1, T, HIDDEN, device=device, dtype=torch.bfloat16, generator=g
        ),
    }
    return sf.TrainBatch(
        sample_ids=[f"bench-{T}"],
        strategy="eagle3",
        tensors=tensors,
        metadata={"target_repr": "hidden_state"},
    )


def is_oom(exc):
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return "out of memory" in str(exc).lower()


def time_steps(step_fn, warmup, steps):
    import torch

    times = []
    first_ms = None
    last = None
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        last = step_fn()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        if i == 0:
            first_ms = ms
        if i >= warmup:
            times.append(ms)
    return times, first_ms, last


def run_one(sf, st, args, T, harness, base):
    import torch

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    resident = torch.cuda.memory_allocated() / 1e9
    batch = make_batch(sf, T, "cuda", seed=T)

    if harness == "core":

        def step():
            return st.core.train_step(batch)

    else:

        def step():
            out = st.strategy.forward_loss(batch)
            st.backend.backward(out.loss, is_boundary=True)
            gn = st.backend.step()
            return types.SimpleNamespace(loss=out.loss.detach(), grad_norm=gn, metrics={})

    times, first_ms, last = time_steps(step, args.warmup, args.steps)
    peak = torch.cuda.max_memory_allocated() / 1e9
    reserved = torch.cuda.max_memory_reserved() / 1e9
    loss = last.loss
    loss = float(loss.item() if hasattr(loss, "item") else loss)
    gn = last.grad_norm
    gn = None if gn is None else float(gn.item() if hasattr(gn, "item") else gn)
    rec = dict(base)
    rec.update(
        {
            "tokens": T,
            "ms_per_step": round(statistics.median(times), 2),
            "peak_gb": round(peak, 2),
            "harness": harness,
            "ms_min": round(min(times), 2),
            "ms_mean": round(statistics.mean(times), 2),
            "ms_all": [round(t, 2) for t in times],
            "first_step_ms": round(first_ms, 1),
            "tok_per_s": round(T / (statistics.median(times) / 1e3), 1),
            "resident_gb_before": round(resident, 2),
            "peak_reserved_gb": round(reserved, 2),
            "loss": round(loss, 5),
            "grad_norm": None if gn is None else round(gn, 5),
        }
    )
    acc = getattr(last, "metrics", {}).get("acc") if hasattr(last, "metrics") else None
    if acc is not None:
        rec["acc"] = round(float(acc), 5)
    emit(rec)
    del batch, last


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="2048,8192,16384")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--attention", choices=["flex", "sdpa"], default="flex")
    ap.add_argument("--harness", default="core,manual",
                    help="comma list of core (TrainerCore.train_step) and manual")
    ap.add_argument("--wrap", choices=["fsdp", "none"], default="fsdp")
    ap.add_argument("--dist", choices=["nccl", "gloo", "none"], default="nccl")
    ap.add_argument("--teacher", choices=["head", "compact"], default="head")
    ap.add_argument("--ttt", type=int, default=7)
    ap.add_argument("--max-pos", type=int, default=32768)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--max-grad-norm", type=float, default=0.5)
    ap.add_argument("--warmup-ratio", type=float, default=0.015)
    ap.add_argument("--lr-scheduler", choices=["cosine", "constant"], default="cosine")
    ap.add_argument("--total-steps", type=int, default=100000)
    args = ap.parse_args()

    tokens = [int(x) for x in args.tokens.split(",") if x.strip()]
    harnesses = [h.strip() for h in args.harness.split(",") if h.strip()]
    attention_backend = {"flex": "flex_attention", "sdpa": "sdpa"}[args.attention]
    if max(tokens) + args.ttt + 64 > args.max_pos:
        args.max_pos = max(tokens) + args.ttt + 64
    logging.basicConfig(level=logging.WARNING)

    base = {
        "bench": "specforge_step",
        "attention": attention_backend,
        "optimizer": "specforge.optimizer.BF16Optimizer(AdamW fp32 masters, wd 0, clip "
        f"{args.max_grad_norm}, lr {args.lr} {args.lr_scheduler} warmup_ratio {args.warmup_ratio})",
        "specforge_commit": SPECFORGE_COMMIT,
        "teacher": "TargetHead(hidden_state)" if args.teacher == "head" else "compact_teacher",
        "ttt": args.ttt,
    }

    try:
        import torch
        import transformers

        apply_transformers_shims()
        sf = import_specforge()
    except Exception as exc:
        traceback.print_exc()
        emit(dict(base, error=f"import: {exc!r}", stage="import"))
        return 3

    import torch

    env = {
        "bench": "specforge_step_env",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "specforge_commit": SPECFORGE_COMMIT,
        "attention": attention_backend,
        "argv": sys.argv[1:],
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception as exc:
        env["triton"] = repr(exc)
    if not torch.cuda.is_available():
        emit(dict(base, error="CUDA not available", stage="env"))
        return 4

    dist_backend = init_dist(args.dist)
    wrap = args.wrap
    if dist_backend is None and wrap == "fsdp":
        log("no process group; FSDP needs one -> running unwrapped")
        wrap = "none"
    env["dist_backend"] = dist_backend

    st = None
    build_errors = []
    for attempt_wrap in ([wrap, "none"] if wrap == "fsdp" else [wrap]):
        try:
            st = build_step(sf, args, attention_backend, attempt_wrap, "cuda")
            wrap = attempt_wrap
            break
        except Exception as exc:
            traceback.print_exc()
            build_errors.append(f"wrap={attempt_wrap}: {exc!r}")
            st = None
            gc.collect()
            torch.cuda.empty_cache()
    env["shims"] = list(SHIMS)
    if st is None:
        env["build_errors"] = build_errors
        emit(env)
        emit(dict(base, error=f"build: {build_errors}", stage="build"))
        return 5
    env.update(st.info)
    env["wrap"] = wrap
    if build_errors:
        env["build_errors"] = build_errors
    emit(env)
    base["wrap"] = wrap
    base["dist"] = dist_backend

    rc = 0
    any_success = False
    i = 0
    while i < len(tokens):
        T = tokens[i]
        non_oom_failures = 0
        for harness in harnesses:
            try:
                run_one(sf, st, args, T, harness, base)
                any_success = True
            except Exception as exc:
                oom = is_oom(exc)
                if not oom:
                    traceback.print_exc()
                    non_oom_failures += 1
                    rc = 6
                msg = str(exc).splitlines()[0][:400] if str(exc) else repr(exc)
                emit(
                    dict(
                        base,
                        tokens=T,
                        harness=harness,
                        error=("OOM: " if oom else f"{type(exc).__name__}: ") + msg,
                        peak_gb=round(torch.cuda.max_memory_allocated() / 1e9, 2),
                    )
                )
                exc = None
            finally:
                # drop grads left by a failed step and cached blocks
                for p in st.model.parameters():
                    p.grad = None
                gc.collect()
                torch.cuda.empty_cache()
        if (
            wrap == "fsdp"
            and not any_success
            and non_oom_failures == len(harnesses)
        ):
            # Every step failed under the FSDP wrapper (not for memory):
            # rebuild without it once and retry this T.
            log("all steps failed under FSDP; rebuilding with --wrap none")
            st = None
            gc.collect()
            torch.cuda.empty_cache()
            try:
                st = build_step(sf, args, attention_backend, "none", "cuda")
            except Exception as exc:
                traceback.print_exc()
                emit(dict(base, error=f"rebuild without FSDP: {exc!r}", stage="build"))
                return 5
            wrap = "none"
            base["wrap"] = "none"
            base["note"] = "FSDP-wrapped step failed; this is the unwrapped step"
            emit(dict(env, wrap="none", shims=list(SHIMS), note=base["note"]))
            continue
        i += 1
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass
    return rc


if __name__ == "__main__":
    sys.exit(main())
