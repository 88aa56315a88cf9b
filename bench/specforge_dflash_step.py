#!/usr/bin/env python3
"""Time SpecForge HEAD's own DFlash training step on random inputs, one GPU.

What runs is the training step of SpecForge's DFlash recipe
(configs/qwen3-8b-dflash.json, examples/configs/qwen3-8b-dflash-online.yaml),
built from SpecForge's own objects through the same provider calls that
specforge/training/assembly.py and specforge/training/trainer.py make for
training.strategy=dflash; only the target checkpoint read is replaced by
random weights:

  config    the Qwen3-8B DFlash draft config (hidden 4096, 5 layers, 32 heads,
            8 kv heads, head_dim 128, intermediate 12288, vocab 151936,
            block_size 16, target_layer_ids [1, 9, 17, 25, 33], mask token
            151669), written to a temporary JSON file and read by
            specforge.training.model_loading.resolve_draft_config with the
            DFlash DraftConfigProvider (its architecture check and
            apply_dflash_overrides included)
  draft     specforge.modeling.draft.dflash.DFlashDraftModel, built by the
            DFlash registration's ModelProvider.build_draft
            (model_providers.build_dflash_draft: config._attn_implementation =
            the attention backend, AutoDraftModel.from_config(torch_dtype=bf16),
            default Qwen3 RMSNorm/MLP kernels, .to(cuda, bf16)); random init
  model     specforge.algorithms.common.dflash_family_model.OnlineDFlashModel,
            built by ModelProvider.build_training_model
            (model_providers.build_dflash_model: mask token resolved by
            resolve_mask_token_id, attention_backend "flex_attention" | "sdpa",
            num_anchors 512, loss_decay_gamma 7, objective_chunk_blocks 128,
            loss_type "dflash"), .to(cuda, bf16)
  target    specforge.modeling.target.target_utils.TargetEmbeddingsAndHead:
            the frozen bf16 target embedding and lm_head [151936, 4096] the
            online model receives. TargetEmbeddingsAndHead.from_pretrained is
            replaced for the build by one that constructs the same module with
            random weights (std 0.02) and then does what from_pretrained does
            after its checkpoint read (.to(cuda, bf16), eval, requires_grad off)
  backend   specforge.training.backend.FSDPTrainingBackend over
            ParallelConfig.from_distributed (a world-size-1 process group);
            prepare_model(model, optimizer_target=model.draft_model) as the
            trainer calls it: FSDP1 SHARD_GRAD_OP, one unit per DFlash decoder
            layer, the frozen target tables left out of FSDP (the trainer's
            default, --wrap fsdp); --wrap ddp sets FSDP_SHARDING=NO_SHARD as
            `specforge train` does for fsdp_sharding NO_SHARD (DDP);
            --wrap none leaves the wrapper out
  optimizer specforge.optimizer.BF16Optimizer (fp32 masters, torch AdamW,
            weight_decay 0), with the arguments of
            specforge.training.assembly._ConfiguredOptimizerFactory for the
            recipe: lr 6e-4, max_grad_norm 1.0, warmup_ratio 0.04, cosine,
            total_steps = max_steps 10000 (the factory itself when pydantic is
            importable, else the same call made here)
  step      specforge.training.strategies.base.DFlashTrainStrategy (from the
            registration's StepProvider.build) inside
            specforge.training.controller.TrainerCore(accumulation_steps=1)

One step (harness "core", TrainerCore.train_step) is everything SpecForge does
per batch: anchor sampling (rand + argsort, one host sync), the noise
embedding through the target embedding, the DFlash mask (flex: a BlockMask
from create_block_mask, rebuilt every step since the anchors are random;
sdpa: a dense boolean mask), the draft forward (fc + hidden_norm over the
captured target states, 5 decoder layers over the draft blocks attending to the
context before each anchor and to their own block), the chunked loss (128
blocks per chunk through the target lm_head under activation checkpointing,
decay gamma 7), backward of the loss numerator, the gradients divided by the
loss denominator (TrainerCore._normalize_gradients), BF16Optimizer.step (grad
norm, clip to 1.0, AdamW on the fp32 masters, copy back to bf16) and the
trainer's metric reduction. Harness "manual" is
DFlashTrainStrategy.forward_loss -> backend.backward(loss) -> backend.step():
the same math (loss = numerator / denominator) without the metric reduction.

Anchors: num_anchors is per sample. OnlineDFlashModel._sample_anchor_positions
works per row of the [B, S] batch: the candidates of a row are the positions
i < S-1 with loss_mask[i] and loss_mask[i+1] set, and every row gets
width = min(num_anchors, the largest candidate count of any row) anchor slots
(rows with fewer candidates keep masked-out blocks). SpecForge's DFlash
collator (pad_and_concatenate_features) puts one sample in each row, padded to
the longest, and never packs several samples into one row (its DFlash mask
lets a block see every earlier position of its row). So "512 anchors,
4096-token samples" is B rows of S=4096 with 512 anchors each: 512 blocks of
16 = 8192 draft positions per sample. Here --tokens T --samples N gives N rows
of T/N tokens (N equal samples; no padding), N * min(num_anchors, T/N - 1)
blocks in all. With every position supervised a 4096-token sample has 4095
candidates, so all 512 anchors are used. Each result line reports the width
SpecForge's own _sample_anchor_positions draws for the batch (called once
after the timed steps) as anchors_per_sample_used. (The recipe itself trains
batch_size 4 of up to max_length 3072 tokens per GPU.)

Input: random input ids, random bf16 target hidden states of the 5 captured
layers concatenated ([N, T/N, 5 * 4096], the "hidden_states" feature of
DFlash's streaming contract), loss mask ones (--prompt-frac F leaves the first
F of each sample unsupervised), as a specforge.runtime.contracts.TrainBatch.

Output: JSON lines on stdout. First one {"bench": "specforge_dflash_step_env"}
(versions, GPU, shims used, the assembled objects); then per T and harness one
{"bench": "specforge_dflash_step", ...} with tokens, samples, anchors,
anchors_per_sample_used, blocks, block_size, attention, ms_per_step (median of --steps timed steps after
--warmup, torch.cuda.synchronize around each), tok_per_s (T / median),
peak_gb (torch.cuda.max_memory_allocated over the warmup and timed steps,
counted from a reset just before the batch is made: resident state included,
as bench/specforge_step.py measures it), resident_gb (memory allocated after
the steps once the batch is freed: weights, target tables, fp32 masters, AdamW
state), step_gb (peak_gb - resident_gb, what the step adds),
specforge_commit; a failed run prints the same line with "error". Everything
else SpecForge prints goes to stderr. The first step compiles flex attention
(tens of seconds); --warmup covers it.

SpecForge itself is never committed here. Extract its package into the
ignored folder .baseline/specforge (see bench/specforge_step.py), then from
the repository root:

  PYTHONPATH=.baseline/specforge python3 bench/specforge_dflash_step.py --tokens=4096
  PYTHONPATH=.baseline/specforge python3 bench/specforge_dflash_step.py --tokens=16384
  PYTHONPATH=.baseline/specforge python3 bench/specforge_dflash_step.py --tokens=16384 --samples=4

--shape=tiny --device=cpu builds the same objects at toy size, to check the
assembly without a GPU (torch 2 and transformers still needed; not a
measurement). Exit status: 0 all runs timed, 3 import failed, 4 no CUDA or no
flex attention, 5 build failed, 6 a step failed other than for memory.
"""

import argparse
import contextlib
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
_STDOUT = sys.stdout  # JSON lines only; SpecForge's prints go to stderr
_FSDP_SHARDING_AT_START = os.environ.get("FSDP_SHARDING")

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


def add_shim(what):
    if what not in SHIMS:
        SHIMS.append(what)


def emit(obj):
    _STDOUT.write(json.dumps(obj) + "\n")
    _STDOUT.flush()


def log(msg):
    print(f"[sf_dflash_step] {msg}", file=sys.stderr, flush=True)


def first_line(exc):
    text = str(exc)
    return text.splitlines()[0][:400] if text else repr(exc)


# ---------------------------------------------------------------------------
# Shapes. "qwen3-8b" is configs/qwen3-8b-dflash.json at a6b6b023, field for
# field; "tiny" only checks the assembly (e.g. on a CPU).
# ---------------------------------------------------------------------------
QWEN3_8B_DFLASH = {
    "architectures": ["DFlashDraftModel"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
    "block_size": 16,
    "bos_token_id": 151643,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
    "dtype": "bfloat16",
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 12288,
    "layer_types": ["full_attention"] * 5,
    "max_position_embeddings": 40960,
    "max_window_layers": 5,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 5,
    "num_key_value_heads": 8,
    "num_target_layers": 36,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def shape_config(name):
    cfg = json.loads(json.dumps(QWEN3_8B_DFLASH))
    if name == "tiny":
        cfg.update(
            {
                "block_size": 4,
                "dflash_config": {"mask_token_id": 500, "target_layer_ids": [1, 3]},
                "head_dim": 16,
                "hidden_size": 64,
                "intermediate_size": 128,
                "layer_types": ["full_attention"] * 2,
                "max_position_embeddings": 4096,
                "max_window_layers": 2,
                "num_attention_heads": 4,
                "num_hidden_layers": 2,
                "num_key_value_heads": 2,
                "num_target_layers": 8,
                "vocab_size": 512,
                "bos_token_id": 1,
                "eos_token_id": 2,
            }
        )
    return cfg


# ---------------------------------------------------------------------------
# transformers 5.x compatibility (SpecForge HEAD pins 5.8.1; the GPU machine
# has 5.17). Names on the DFlash path must be the real objects: a missing one
# is taken from the module that defines it in transformers, or the run stops
# naming it. Names used only as annotations, or only by modules off the DFlash
# path (tokenizer helpers, the EAGLE-3 drafts), get inert placeholders.
# ---------------------------------------------------------------------------
QWEN3 = "transformers.models.qwen3.modeling_qwen3"
# name in modeling_qwen3 -> where else transformers defines it
QWEN3_ON_PATH = {
    "ALL_ATTENTION_FUNCTIONS": [("transformers.modeling_utils", "ALL_ATTENTION_FUNCTIONS")],
    "GradientCheckpointingLayer": [("transformers.modeling_layers", "GradientCheckpointingLayer")],
    "Qwen3Config": [
        ("transformers.models.qwen3.configuration_qwen3", "Qwen3Config"),
        ("transformers", "Qwen3Config"),
    ],
    "Qwen3PreTrainedModel": [("transformers", "Qwen3PreTrainedModel")],
    "Qwen3RotaryEmbedding": [],
    "Qwen3MLP": [],
    "Qwen3RMSNorm": [],
    "eager_attention_forward": [("transformers.models.llama.modeling_llama", "eager_attention_forward")],
    "rotate_half": [("transformers.models.llama.modeling_llama", "rotate_half")],
}
# annotation only on the DFlash path
QWEN3_ANNOTATION = {
    "FlashAttentionKwargs": [("transformers.modeling_flash_attention_utils", "FlashAttentionKwargs")],
}
ON_PATH_NAMES = {
    "transformers": ["AutoConfig", "AutoModelForCausalLM", "DynamicCache"],
    "transformers.cache_utils": ["Cache"],
    "transformers.modeling_utils": ["PreTrainedModel"],
}
OFF_PATH_NAMES = {
    # specforge/utils.py: tokenizer loading only
    "transformers": ["AutoTokenizer", "PreTrainedTokenizerFast"],
    "transformers.utils": ["cached_file"],
    # dflash.py: return annotation of forward
    "transformers.modeling_outputs": ["CausalLMOutputWithPast"],
    # EAGLE-3 / P-EAGLE drafts (llama3_eagle.py, peagle.py), imported by
    # specforge/modeling/draft/__init__.py but never built here
    "transformers.activations": ["ACT2FN"],
    "transformers.models.llama.configuration_llama": ["LlamaConfig"],
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
            {"__doc__": f"sf_dflash_step placeholder for missing {modname}.{name}"},
        )

    def _missing(*_a, **_k):
        raise RuntimeError(f"sf_dflash_step placeholder {modname}.{name} was called")

    _missing.__name__ = name
    return _missing


def _lookup(candidates):
    import importlib

    for modname, attr in candidates:
        try:
            return getattr(importlib.import_module(modname), attr), f"{modname}.{attr}"
        except Exception:
            continue
    return None, None


def apply_transformers_shims():
    import importlib

    import torch
    import transformers

    missing = []
    # dflash.py: `from typing_extensions import Tuple, Unpack` (typing_extensions
    # re-exports typing's names from 4.7 on)
    import typing

    import typing_extensions

    for name in ("Tuple", "Unpack"):
        if not hasattr(typing_extensions, name):
            if hasattr(typing, name):
                setattr(typing_extensions, name, getattr(typing, name))
                add_shim(f"typing_extensions.{name} missing -> typing.{name}")
            else:
                missing.append(f"typing_extensions.{name}")
    # PretrainedConfig (specforge/modeling/auto.py) was renamed PreTrainedConfig
    # in transformers 5; keep the old name if only the new one exists.
    try:
        transformers.PretrainedConfig
    except Exception:
        try:
            transformers.PretrainedConfig = transformers.PreTrainedConfig
            add_shim("transformers.PretrainedConfig missing -> transformers.PreTrainedConfig")
        except Exception:
            missing.append("transformers.PretrainedConfig")

    try:
        qwen3 = importlib.import_module(QWEN3)
    except Exception as exc:
        raise ImportError(f"{QWEN3} does not import: {exc!r}") from exc
    for table, annotation in ((QWEN3_ON_PATH, False), (QWEN3_ANNOTATION, True)):
        for name, alternatives in table.items():
            if hasattr(qwen3, name):
                continue
            obj, where = _lookup(alternatives)
            if obj is not None:
                setattr(qwen3, name, obj)
                add_shim(f"{QWEN3}.{name} missing -> {where} (the same object)")
            elif annotation:
                setattr(qwen3, name, _placeholder(QWEN3, name))
                add_shim(f"{QWEN3}.{name} missing -> placeholder (annotation only)")
            else:
                missing.append(f"{QWEN3}.{name}")

    for modname, names in OFF_PATH_NAMES.items():
        try:
            mod = importlib.import_module(modname)
        except Exception as exc:  # whole module unavailable: stub it
            mod = types.ModuleType(modname)
            sys.modules[modname] = mod
            add_shim(f"module {modname} (import failed: {exc!r}) -> stub")
        for name in names:
            try:
                getattr(mod, name)
            except Exception:
                setattr(mod, name, _placeholder(modname, name))
                add_shim(f"{modname}.{name} missing -> off-path placeholder")

    # specforge/modeling/draft/flex_attention.py (EAGLE-3 drafts) imports it
    tu = importlib.import_module("transformers.utils")
    if not hasattr(tu, "is_torchdynamo_compiling"):
        tu.is_torchdynamo_compiling = torch.compiler.is_compiling
        add_shim(
            "transformers.utils.is_torchdynamo_compiling missing -> "
            "torch.compiler.is_compiling (same meaning)"
        )

    for modname, names in ON_PATH_NAMES.items():
        mod = importlib.import_module(modname)
        for name in names:
            try:
                getattr(mod, name)
            except Exception:
                missing.append(f"{modname}.{name}")
    if missing:
        raise ImportError(f"transformers names on the DFlash path missing: {missing}")


# Sibling draft modules that specforge/modeling/draft/__init__.py imports but
# the DFlash path never uses. Stubbed only if the normal import fails.
DRAFT_SIBLING_STUBS = {
    "specforge.modeling.draft.base": ["Eagle3DraftModel"],
    "specforge.modeling.draft.flex_attention": [],
    "specforge.modeling.draft.llama3_eagle": ["LlamaForCausalLMEagle3"],
    "specforge.modeling.draft.peagle": ["PEagleDraftModel"],
    "specforge.modeling.draft.domino": ["DominoDraftModel"],
    "specforge.modeling.draft.dspark": ["DSparkDraftModel"],
}


def _purge_specforge():
    for key in [k for k in sys.modules if k == "specforge" or k.startswith("specforge.")]:
        del sys.modules[key]


def import_specforge():
    """Import the SpecForge modules on the DFlash path; return them in a namespace."""
    try:
        import specforge.modeling.draft  # noqa: F401
    except Exception:
        log("import specforge.modeling.draft failed; traceback follows, retrying "
            "with the off-path sibling drafts (EAGLE-3, P-EAGLE, Domino, DSpark) stubbed")
        traceback.print_exc()
        _purge_specforge()
        for modname, names in DRAFT_SIBLING_STUBS.items():
            mod = types.ModuleType(modname)
            for name in names:
                setattr(mod, name, _placeholder(modname, name))
            sys.modules[modname] = mod
            add_shim(f"{modname} -> stub module (off the DFlash path)")
        import specforge.modeling.draft  # noqa: F401

    from specforge.algorithms import model_providers
    from specforge.algorithms.common import dflash_family_model
    from specforge.algorithms.dflash import providers as dflash_providers
    from specforge.modeling.draft.dflash import DFlashDraftModel
    from specforge.modeling.target.target_utils import TargetEmbeddingsAndHead
    from specforge.optimizer import BF16Optimizer
    from specforge.runtime.contracts import TrainBatch
    from specforge.training import model_loading
    from specforge.training.backend import FSDPTrainingBackend, ParallelConfig
    from specforge.training.controller import TrainerCore
    from specforge.training.strategies.base import DFlashTrainStrategy

    return types.SimpleNamespace(
        model_providers=model_providers,
        dflash_family_model=dflash_family_model,
        dflash_providers=dflash_providers,
        DFlashDraftModel=DFlashDraftModel,
        TargetEmbeddingsAndHead=TargetEmbeddingsAndHead,
        BF16Optimizer=BF16Optimizer,
        TrainBatch=TrainBatch,
        model_loading=model_loading,
        FSDPTrainingBackend=FSDPTrainingBackend,
        ParallelConfig=ParallelConfig,
        TrainerCore=TrainerCore,
        DFlashTrainStrategy=DFlashTrainStrategy,
    )


# ---------------------------------------------------------------------------
# torch.distributed: SpecForge's trainer runs under torchrun with a process
# group (specforge.distributed.init_distributed, which also wants yunchang for
# sequence-parallel groups that only the "usp" backend uses). The default
# process group (world size 1) is initialised directly instead; SpecForge's
# SP/TP group getters stay None.
# ---------------------------------------------------------------------------
def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_dist(preferred, device):
    import torch
    import torch.distributed as dist

    if preferred == "none":
        return None
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    if device == "cuda":
        torch.cuda.set_device(0)
    order = [preferred] + [b for b in ("nccl", "gloo") if b != preferred]
    if device != "cuda":
        order = ["gloo"]
    for backend in order:
        try:
            dist.init_process_group(
                backend=backend, rank=0, world_size=1, timeout=timedelta(minutes=10)
            )
            # one collective so a broken backend fails here, not inside a step
            t = torch.ones(1, device=device)
            dist.all_reduce(t)
            if device == "cuda":
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
# The run config: examples/configs/qwen3-8b-dflash-online.yaml's model and
# training sections over SpecForge's schema defaults, as the provider calls
# read them. Built as SpecForge's own pydantic ModelConfig/TrainingConfig when
# pydantic is importable (validating every field name), else as a namespace
# with the same values.
# ---------------------------------------------------------------------------
def run_config(args, draft_config_path):
    model = {
        "target_model_path": "random-qwen3-8b-shaped-target",  # never read
        "draft_model_config": draft_config_path,
        "embedding_key": "model.embed_tokens.weight",
        "torch_dtype": "bfloat16",
    }
    training = {
        "strategy": "dflash",
        "max_steps": args.max_steps,
        "batch_size": args.samples,
        "learning_rate": args.lr,
        "warmup_ratio": args.warmup_ratio,
        "max_grad_norm": args.max_grad_norm,
        "lr_scheduler": args.lr_scheduler,
        "attention_backend": args.attention_backend,
        "num_anchors": args.anchors,
        "loss_decay_gamma": args.loss_decay_gamma,
        "objective_chunk_blocks": args.objective_chunk_blocks,
        "loss_type": args.loss_type,
        "seed": args.seed,
    }
    try:
        from specforge.config.schema import ModelConfig, TrainingConfig

        cfg = types.SimpleNamespace(
            mode="online",
            model=ModelConfig(**model),
            training=TrainingConfig(**training),
            source="specforge.config.schema (pydantic)",
        )
        return cfg
    except ImportError as exc:
        source = f"namespace with the schema's defaults (specforge.config: {exc!r})"
    # The schema defaults of the fields the DFlash provider path reads.
    model_defaults = {
        "draft_checkpoint_path": None,
        "draft_num_hidden_layers": None,
        "draft_block_size": None,
        "trust_remote_code": False,
        "use_liger_kernel": False,
        "lm_head_key": "lm_head.weight",
        "vocab_mapping_path": "",
        "load_target_embedding": True,
        "cache_dir": None,
        "mask_token_id": None,
        "input_modality": "text",
    }
    training_defaults = {
        "total_steps": None,
        "accumulation_steps": 1,
        "fsdp_sharding": "SHARD_GRAD_OP",
        "optimizer_cpu_offload": False,
        "dpace_alpha": 0.5,
        "tp_size": 1,
        "sp_ulysses_size": 1,
        "sp_ring_size": 1,
    }
    return types.SimpleNamespace(
        mode="online",
        model=types.SimpleNamespace(**{**model_defaults, **model}),
        training=types.SimpleNamespace(**{**training_defaults, **training}),
        source=source,
    )


def optimizer_factory_for(sf, cfg):
    """assembly._ConfiguredOptimizerFactory(cfg), or the same BF16Optimizer call."""
    try:
        from specforge.training.assembly import _ConfiguredOptimizerFactory

        return _ConfiguredOptimizerFactory(cfg), "specforge.training.assembly._ConfiguredOptimizerFactory"
    except ImportError as exc:
        reason = repr(exc)
    t = cfg.training
    total_steps = t.total_steps or t.max_steps

    def factory(draft_module):
        return sf.BF16Optimizer(
            draft_module,
            lr=t.learning_rate,
            max_grad_norm=t.max_grad_norm,
            warmup_ratio=t.warmup_ratio,
            lr_scheduler=t.lr_scheduler,
            total_steps=total_steps,
            offload_master=t.optimizer_cpu_offload,
        )

    return factory, f"BF16Optimizer with _ConfiguredOptimizerFactory's arguments (assembly: {reason})"


@contextlib.contextmanager
def random_target_tables(sf, shape):
    """TargetEmbeddingsAndHead.from_pretrained without the checkpoint read."""
    import torch

    cls = sf.TargetEmbeddingsAndHead
    original = cls.__dict__["from_pretrained"]

    def from_random(
        klass,
        model_path,
        embed_key=None,
        lm_head_key=None,
        cache_dir=None,
        device="cuda",
        dtype=torch.bfloat16,
        trust_remote_code=False,
    ):
        config = types.SimpleNamespace(
            hidden_size=shape["hidden_size"],
            vocab_size=shape["vocab_size"],
            pad_token_id=None,
            tie_word_embeddings=False,
        )
        try:
            with torch.device(device):  # fast random init on the GPU
                instance = klass(config)
        except Exception:
            instance = klass(config)
        with torch.no_grad():
            instance.embed_tokens.weight.normal_(0.0, 0.02)
            instance.lm_head.weight.normal_(0.0, 0.02)
        # what from_pretrained does after reading the checkpoint
        instance.to(device=device, dtype=dtype)
        instance.eval()
        instance.requires_grad_(False)
        return instance

    cls.from_pretrained = classmethod(from_random)
    try:
        yield
    finally:
        cls.from_pretrained = original


def build_step(sf, args, shape, wrap, device):
    """Assemble draft, online model, backend, optimizer, strategy and TrainerCore."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "dflash-draft-config.json")
        with open(path, "w") as f:
            json.dump(shape, f)
        cfg = run_config(args, path)
        # the DFlash registration's executable providers
        providers = sf.dflash_providers.algorithm_providers()
        # model_loading.resolve_draft_config, as assembly resolves it
        draft_config = sf.model_loading.resolve_draft_config(
            cfg, provider=providers.model.draft_config
        )

    # ModelProvider.build_draft -> model_providers.build_dflash_draft
    try:
        with torch.device(device):  # fast random init on the GPU
            draft = providers.model.build_draft(cfg, draft_config)
    except Exception:
        log("building the draft under torch.device(...) failed; retrying on the CPU")
        traceback.print_exc()
        draft = providers.model.build_draft(cfg, draft_config)

    # ModelProvider.build_training_model -> model_providers.build_dflash_model
    with random_target_tables(sf, shape):
        parts = providers.model.build_training_model(
            cfg, draft, draft_config, None, None
        )
    add_shim(
        "TargetEmbeddingsAndHead.from_pretrained -> random weights (std 0.02), "
        "same module, then .to(device, bf16), eval, requires_grad_(False)"
    )
    model = parts.model
    if not isinstance(model, sf.dflash_family_model.OnlineDFlashModel):
        raise TypeError(f"build_training_model gave {type(model).__name__}, not OnlineDFlashModel")

    # specforge/cli.py exports training.fsdp_sharding as FSDP_SHARDING, which
    # ParallelConfig.from_distributed reads
    if wrap == "ddp":
        os.environ["FSDP_SHARDING"] = "NO_SHARD"
    elif wrap == "fsdp":
        os.environ["FSDP_SHARDING"] = cfg.training.fsdp_sharding
    elif _FSDP_SHARDING_AT_START is None:
        os.environ.pop("FSDP_SHARDING", None)
    else:
        os.environ["FSDP_SHARDING"] = _FSDP_SHARDING_AT_START
    parallel = sf.ParallelConfig.from_distributed(
        tp_size=cfg.training.tp_size,
        sp_ulysses_size=cfg.training.sp_ulysses_size,
        sp_ring_size=cfg.training.sp_ring_size,
    )
    optimizer_factory, optimizer_source = optimizer_factory_for(sf, cfg)
    backend = sf.FSDPTrainingBackend(parallel, optimizer_factory=optimizer_factory)
    # trainer.py: backend.prepare_model(model, optimizer_target=model.draft_model)
    wrapped = backend.prepare_model(
        model, wrap=(wrap != "none"), optimizer_target=model.draft_model
    )
    # StepProvider.build(wrapped, target_head=None) -> DFlashTrainStrategy
    strategy = providers.step.build(wrapped, target_head=None)
    core = sf.TrainerCore(strategy, backend, accumulation_steps=cfg.training.accumulation_steps)
    # TrainerController._fit: strategy.trainable_module().train()
    strategy.trainable_module().train()

    d = model.draft_model
    rope = getattr(d.config, "rope_parameters", None)
    if not isinstance(rope, dict):
        rope = {}
    info = {
        "config_source": cfg.source,
        "optimizer_source": optimizer_source,
        "draft_class": type(d).__name__,
        "model_class": type(model).__name__,
        "strategy_class": type(strategy).__name__,
        "attn_implementation": getattr(d.config, "_attn_implementation", None),
        "attention_backend": model.attention_backend,
        "num_anchors": model.num_anchors,
        "block_size": model.block_size,
        "mask_token_id": model.mask_token_id,
        "loss_decay_gamma": model.loss_decay_gamma,
        "objective_chunk_blocks": model.objective_chunk_blocks,
        "loss_type": model.loss_type,
        "target_layer_ids": list(d.target_layer_ids),
        "num_hidden_layers": int(d.config.num_hidden_layers),
        "rope_theta": rope.get("rope_theta", getattr(d.config, "rope_theta", None)),
        "rope_type": rope.get("rope_type"),
        "mlp_class": type(d.layers[0].mlp).__name__,
        "norm_class": type(d.norm).__name__,
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "frozen_params": sum(p.numel() for p in model.parameters() if not p.requires_grad),
        "wrapper": getattr(backend, "_wrapper_kind", "?"),
        "sharding_strategy": parallel.sharding_strategy,
        "fsdp_units": sorted(c.__name__ for c in getattr(backend, "auto_wrap_block_classes", ())),
        "fsdp_ignored": len(getattr(backend, "ignored_frozen_modules", ())),
        "param_dtype": str(next(d.parameters()).dtype),
        "optimizer": type(backend.optimizer).__name__,
        "lr": args.lr,
        "max_grad_norm": args.max_grad_norm,
        "flex_available": bool(getattr(sf.dflash_family_model, "FLEX_ATTENTION_AVAILABLE", False)),
    }
    return types.SimpleNamespace(
        model=model,
        wrapped=wrapped,
        backend=backend,
        strategy=strategy,
        core=core,
        info=info,
        capture_width=len(d.target_layer_ids) * int(d.config.hidden_size),
    )


def make_batch(sf, st, args, shape, T, device, seed):
    import torch

    n = args.samples
    S = T // n
    g = torch.Generator(device=device).manual_seed(seed)
    loss_mask = torch.ones(n, S, dtype=torch.long, device=device)
    prompt = int(args.prompt_frac * S)
    if prompt:
        loss_mask[:, :prompt] = 0
    tensors = {
        "input_ids": torch.randint(
            0, shape["vocab_size"], (n, S), device=device, generator=g
        ),
        "loss_mask": loss_mask,
        # the captured target layers' hidden states, concatenated
        "hidden_states": torch.randn(
            n, S, st.capture_width, device=device, dtype=torch.bfloat16, generator=g
        ),
    }
    batch = sf.TrainBatch(
        sample_ids=[f"bench-{T}-{i}" for i in range(n)],
        strategy="dflash",
        tensors=tensors,
        metadata={"target_repr": None, "ttt_length": None},
    )
    # OnlineDFlashModel._sample_anchor_positions' width for this mask
    candidates = max(0, S - 1 - prompt)
    width = min(args.anchors, candidates)
    return batch, width


def is_oom(exc):
    import torch

    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(
        torch.cuda, "OutOfMemoryError", None
    )
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return "out of memory" in str(exc).lower()


def sync(device):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def time_steps(step_fn, warmup, steps, device):
    times = []
    first_ms = None
    last = None
    for i in range(warmup + steps):
        sync(device)
        t0 = time.perf_counter()
        last = step_fn()
        sync(device)
        ms = (time.perf_counter() - t0) * 1e3
        if i == 0:
            first_ms = ms
        if i >= warmup:
            times.append(ms)
    return times, first_ms, last


def _float(x):
    if x is None:
        return None
    return float(x.item() if hasattr(x, "item") else x)


def run_one(sf, st, args, shape, T, harness, base, device):
    import torch

    cuda = device == "cuda"
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    resident_before = torch.cuda.memory_allocated() / 1e9 if cuda else 0.0
    batch, width = make_batch(sf, st, args, shape, T, device, seed=T)

    if harness == "core":

        def step():
            return st.core.train_step(batch)

    else:

        def step():
            out = st.strategy.forward_loss(batch)
            st.backend.backward(out.loss, is_boundary=True)
            gn = st.backend.step()
            return types.SimpleNamespace(
                loss=out.loss.detach(), grad_norm=gn, metrics=dict(out.metrics)
            )

    times, first_ms, last = time_steps(step, args.warmup, args.steps, device)
    peak = torch.cuda.max_memory_allocated() / 1e9 if cuda else 0.0
    reserved = torch.cuda.max_memory_reserved() / 1e9 if cuda else 0.0
    loss = _float(last.loss)
    gn = _float(last.grad_norm)
    metrics = getattr(last, "metrics", None) or {}
    acc = metrics.get("acc", metrics.get("accuracy"))
    # Outside the timed steps: the anchor width SpecForge itself draws for
    # this batch's loss mask (checks the per-sample figure reported).
    with torch.no_grad():
        anchors, keep = st.model._sample_anchor_positions(
            T // args.samples, batch.tensors["loss_mask"], batch.tensors["loss_mask"].device
        )
    sf_width = int(anchors.shape[1])
    kept = int(keep.sum().item())
    if sf_width != width:
        log(f"anchor width: SpecForge drew {sf_width}, expected {width}")
    del anchors, keep
    del batch, last, step
    gc.collect()
    resident = torch.cuda.memory_allocated() / 1e9 if cuda else 0.0
    med = statistics.median(times)
    rec = dict(base)
    rec.update(
        {
            "tokens": T,
            "samples": args.samples,
            "tokens_per_sample": T // args.samples,
            "anchors": args.anchors,
            "anchors_per_sample_used": sf_width,
            "blocks": sf_width * args.samples,
            "blocks_kept": kept,
            "draft_positions": sf_width * args.samples * shape["block_size"],
            "block_size": shape["block_size"],
            "supervised_frac": round(1.0 - int(args.prompt_frac * (T // args.samples)) / (T // args.samples), 4),
            "harness": harness,
            "ms_per_step": round(med, 2),
            "tok_per_s": round(T / (med / 1e3), 1),
            "peak_gb": round(peak, 2),
            "resident_gb": round(resident, 2),
            "step_gb": round(peak - resident, 2),
            "resident_gb_before": round(resident_before, 2),
            "peak_reserved_gb": round(reserved, 2),
            "ms_min": round(min(times), 2),
            "ms_mean": round(statistics.mean(times), 2),
            "ms_all": [round(t, 2) for t in times],
            "first_step_ms": round(first_ms, 1),
            "loss": None if loss is None else round(loss, 5),
            "grad_norm": None if gn is None else round(gn, 5),
        }
    )
    if acc is not None:
        rec["acc"] = round(_float(acc), 5)
    emit(rec)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="Run as: PYTHONPATH=.baseline/specforge python3 bench/specforge_dflash_step.py --tokens=4096",
    )
    ap.add_argument("--tokens", default="4096",
                    help="comma list of tokens per step (all samples together), e.g. 4096,16384")
    ap.add_argument("--samples", type=int, default=1,
                    help="samples per step: rows of tokens/samples each (SpecForge never packs rows)")
    ap.add_argument("--anchors", type=int, default=512,
                    help="training.num_anchors: anchor blocks per sample (per batch row)")
    ap.add_argument("--attention", choices=["flex", "sdpa"], default="flex",
                    help="training.attention_backend: flex_attention (the recipe) or sdpa")
    ap.add_argument("--prompt-frac", type=float, default=0.0,
                    help="leave this fraction at the start of each sample unsupervised (default: all supervised)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--harness", default="core",
                    help="comma list of core (TrainerCore.train_step) and manual")
    ap.add_argument("--wrap", choices=["fsdp", "ddp", "none"], default="fsdp",
                    help="fsdp: the trainer's default (SHARD_GRAD_OP); ddp: fsdp_sharding NO_SHARD; none: unwrapped")
    ap.add_argument("--dist", choices=["nccl", "gloo", "none"], default="nccl")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--warmup-ratio", type=float, default=0.04)
    ap.add_argument("--lr-scheduler", choices=["cosine", "constant"], default="cosine")
    ap.add_argument("--max-steps", type=int, default=10000)
    ap.add_argument("--loss-decay-gamma", type=float, default=7.0)
    ap.add_argument("--objective-chunk-blocks", type=int, default=128)
    ap.add_argument("--loss-type", default="dflash",
                    choices=["dflash", "dpace", "dpace-cumulative-confidence-only",
                             "dpace-continuation-value-only"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", choices=["qwen3-8b", "tiny"], default="qwen3-8b",
                    help="tiny: toy sizes, only to check the assembly")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: only with --shape=tiny, to check the assembly")
    args = ap.parse_args(argv)
    args.attention_backend = {"flex": "flex_attention", "sdpa": "sdpa"}[args.attention]
    args.token_list = [int(x) for x in args.tokens.split(",") if x.strip()]
    args.harnesses = [h.strip() for h in args.harness.split(",") if h.strip()]
    bad = [h for h in args.harnesses if h not in ("core", "manual")]
    if bad:
        ap.error(f"unknown harness {bad}")
    if args.samples < 1 or args.anchors < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("--samples, --anchors and --steps must be positive, --warmup not negative")
    for T in args.token_list:
        if T % args.samples:
            ap.error(f"--tokens {T} is not a multiple of --samples {args.samples}")
        if T // args.samples < 2:
            ap.error("each sample needs at least two tokens")
    if not 0.0 <= args.prompt_frac < 1.0:
        ap.error("--prompt-frac must be in [0, 1)")
    return args


def main(argv=None):
    args = parse_args(argv)  # before any heavy import, so --help works anywhere
    shape = shape_config(args.shape)
    device = args.device
    logging.basicConfig(level=logging.WARNING)

    base = {
        "bench": "specforge_dflash_step",
        "attention": args.attention_backend,
        "specforge_commit": SPECFORGE_COMMIT,
        "shape": args.shape,
        "optimizer": "specforge.optimizer.BF16Optimizer(AdamW fp32 masters, wd 0, clip "
        f"{args.max_grad_norm}, lr {args.lr} {args.lr_scheduler} warmup_ratio {args.warmup_ratio}, "
        f"total_steps {args.max_steps})",
        "objective": f"{args.loss_type}, decay gamma {args.loss_decay_gamma}, "
        f"{args.objective_chunk_blocks} blocks per loss chunk",
    }
    if args.shape != "qwen3-8b":
        base["note"] = "toy shape: an assembly check, not a measurement"

    with contextlib.redirect_stdout(sys.stderr):
        try:
            import torch
            import transformers

            apply_transformers_shims()
            sf = import_specforge()
        except Exception as exc:
            traceback.print_exc()
            emit(dict(base, error=f"import: {exc!r}", stage="import"))
            return 3

        env = {
            "bench": "specforge_dflash_step_env",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "specforge_commit": SPECFORGE_COMMIT,
            "attention": args.attention_backend,
            "argv": sys.argv[1:] if argv is None else list(argv),
        }
        try:
            import triton

            env["triton"] = triton.__version__
        except Exception as exc:
            env["triton"] = repr(exc)
        if device == "cuda" and not torch.cuda.is_available():
            emit(dict(env, shims=list(SHIMS)))
            emit(dict(base, error="CUDA not available (--device=cpu --shape=tiny only checks the assembly)", stage="env"))
            return 4
        if args.attention == "flex" and not getattr(sf.dflash_family_model, "FLEX_ATTENTION_AVAILABLE", False):
            emit(dict(env, shims=list(SHIMS)))
            emit(dict(base, error="flex_attention not importable in this torch (try --attention=sdpa)", stage="env"))
            return 4
        torch.manual_seed(args.seed)

        dist_backend = init_dist(args.dist, device)
        wrap = args.wrap
        if dist_backend is None and wrap != "none":
            log(f"no process group; {wrap} needs one -> running unwrapped")
            wrap = "none"
        env["dist_backend"] = dist_backend

        st = None
        build_errors = []
        for attempt_wrap in ([wrap, "none"] if wrap != "none" else [wrap]):
            try:
                st = build_step(sf, args, shape, attempt_wrap, device)
                wrap = attempt_wrap
                break
            except Exception as exc:
                traceback.print_exc()
                build_errors.append(f"wrap={attempt_wrap}: {type(exc).__name__}: {first_line(exc)}")
                st = None
                gc.collect()
                if device == "cuda":
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
        while i < len(args.token_list):
            T = args.token_list[i]
            non_oom_failures = 0
            for harness in args.harnesses:
                try:
                    run_one(sf, st, args, shape, T, harness, base, device)
                    any_success = True
                except Exception as exc:
                    oom = is_oom(exc)
                    if not oom:
                        traceback.print_exc()
                        non_oom_failures += 1
                        rc = 6
                    emit(
                        dict(
                            base,
                            tokens=T,
                            samples=args.samples,
                            anchors=args.anchors,
                            block_size=shape["block_size"],
                            harness=harness,
                            error=("OOM: " if oom else f"{type(exc).__name__}: ") + first_line(exc),
                            peak_gb=round(torch.cuda.max_memory_allocated() / 1e9, 2)
                            if device == "cuda" else None,
                        )
                    )
                finally:
                    # drop grads left by a failed step and cached blocks
                    for p in st.model.parameters():
                        p.grad = None
                    gc.collect()
                    if device == "cuda":
                        torch.cuda.empty_cache()
            if wrap != "none" and not any_success and non_oom_failures == len(args.harnesses):
                # Every step failed under the wrapper (not for memory): rebuild
                # without it once and retry this T.
                log(f"all steps failed under {wrap}; rebuilding with --wrap none")
                st = None
                gc.collect()
                if device == "cuda":
                    torch.cuda.empty_cache()
                try:
                    st = build_step(sf, args, shape, "none", device)
                except Exception as exc:
                    traceback.print_exc()
                    emit(dict(base, error=f"rebuild unwrapped: {exc!r}", stage="build"))
                    return 5
                base["note"] = f"the {wrap}-wrapped step failed; this is the unwrapped step"
                wrap = "none"
                base["wrap"] = "none"
                emit(dict(env, wrap="none", shims=list(SHIMS), note=base["note"]))
                rc = 0
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
