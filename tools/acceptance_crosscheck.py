#!/usr/bin/env python3
"""Independent cross-check of the acceptance length tau of a trained draft:
EAGLE-3 / EAGLE-3.1 chains and DFlash blocks.

What it checks
--------------
The C++ student measures tau(K): the mean number of tokens one verify round
produces when a serving engine runs the exported draft against a greedy
target, K draft tokens a round. For EAGLE-3 that is SGLang's chain
speculative decoding (speculative_eagle_topk=1, speculative_num_steps=K,
speculative_num_draft_tokens=K+1); for DFlash it is SGLang's block round,
of whose B - 1 proposals the first K are verified. The student writes the
evaluation inputs and its own results into an "eval dump"; this script
re-measures tau from the exported draft folder (config.json +
model.safetensors, read with a small safetensors reader of its own) and the
dump in plain PyTorch, running the draft the way a serving engine does: one
request at a time, with a real KV cache. It exits 1 when a chain's tau
differs from the C++ value by more than --tolerance. config.json's
"architectures" picks the draft: ["LlamaForCausalLMEagle3"] (EAGLE-3, and
EAGLE-3.1 with fc_norm / norm_output) or ["DFlashDraftModel"].

Rounds (per sample: tokens s[0..n-1], the first p of them the prompt; the
rest are the teacher's greedy continuation, i.e. what the target emits)
------------------------------------------------------------------------
A round at row t has the tokens known through s[t+1] (first t = p-1: s[p]
is the target's first generated token) and proposes y_1..y_K for
s[t+2..]. The target accepts the longest prefix y_1..y_a that matches
s[t+2..], capped at the tokens left in the data, and adds its bonus token:
advance = min(a+1, remaining); the next round is at row t + advance.
tau(K) = sum of advances / number of rounds, pooled over all samples.

EAGLE-3 semantics
-----------------
* Draft row r (0 <= r <= n-2) feeds the midlayer embeds = embed(s[r+1]) and
  hidden = fc(aux[r]) at rope position r: the target's hidden state of token
  r paired with the token that follows it.
* Extend: rows with teacher features run through the draft and leave their
  keys/values in its one-layer KV cache. First rows 0..p-1 (the prefill).
* A round at row t: y_1 = target id of argmax lm_head(norm(o_t)), o_t = row
  t's pre-norm midlayer output; for i = 2..K a decode step on embeds =
  embed(y_{i-1}), hidden = the previous step's pre-norm output (norm(out)
  with EAGLE-3.1's norm_output), position t+i-1, attending to rows 0..t and
  the chain's own keys so far. The chain's cache entries are dropped and
  rows t+1..t+advance are extended with the target's features.

DFlash semantics (student_trainer/draft/dflash_draft.h)
-------------------------------------------------------
* The context: the target's states of the captured layers (dump aux_hidden,
  [T, k*H], the layers side by side in target_layer_ids order), projected
  per row: c_r = hidden_norm(fc(aux[r])).
* Every draft layer (Qwen3: q_norm/k_norm on each head) caches the context
  rows' keys and values, through its own k_proj/v_proj, k_norm and rope at
  the row's position r; the context rows do not pass input_layernorm.
  First rows 0..p-1 (the prefill).
* A round at row t: the anchor is s[t+1], the last committed token, which
  the target has not run. The block [anchor, MASK x (B-1)] (the target's
  embeddings; MASK = dflash_config.mask_token_id) sits at positions
  t+1..t+B; in every layer its rows attend to the cached context rows
  0..t and to every row of the block (bidirectional). Rows 1..B-1 of the
  last layer through the final norm and the TARGET's lm_head (the dump's
  target_lm_head: the export has none) give B-1 greedy proposals; chain K
  verifies the first min(K, B-1) (a chain longer than the block proposes
  nothing past it). The block leaves nothing in the cache; after the
  verify, rows t+1..t+advance (the anchor and the accepted tokens, whose
  target states are now known) are appended to every layer's cache.

Where SGLang states these semantics
-----------------------------------
python/sglang/srt/speculative/eagle_worker.py:
  - draft_forward: the first draft token comes from the extend pass's
    logits ("we get 1 token from draft prefill and (#spec steps - 1) tokens
    here"); every decode step does forward_batch.positions.add_(1) (positions
    advance by one per step) and feeds back logits_output.hidden_states;
  - verify: greedy verification accepts the longest matching prefix plus
    the target's own next token (the bonus);
  - forward_draft_extend_after_decode: the accepted tokens and the bonus run
    through the draft again with the target's hidden states, replacing the
    chain's draft-only KV entries.
python/sglang/srt/models/llama_eagle3.py: fc over the concatenated aux
states, the midlayer's q/k/v read cat(input_layernorm(embeds),
hidden_norm(hidden)), and the hidden state handed to the next step is the
pre-norm residual sum (the fused norm returns both); hot_token_id (our d2t)
maps draft ids to target ids.
python/sglang/srt/speculative/dflash_worker.py:
  - forward_batch_generation: the prefill's captured target states of the
    prompt go into the draft KV cache at once, and the target's next token
    becomes the bonus token (the next block's anchor); a decode step drafts,
    verifies (DFlashVerifyInput.verify: the longest matching prefix plus the
    target's next token as the new bonus) and appends the target states of
    the commit_lens = accepted + 1 committed rows (the anchor and the
    accepted tokens) to the draft KV cache;
  - _append_target_hidden_to_draft_kv / _append_target_hidden_sequential:
    project_target_hidden (fc, hidden_norm) of the new rows, then per layer
    kv_proj, k_norm and k rope at the rows' own positions into that layer's
    KV cache;
  - _prepare_for_speculative_decoding: block_ids = [bonus token, mask x
    (B-1)] embedded by the target, positions seq_len + 0..B-1, run as a
    non-causal block over the cached context, and draft_hidden[:, 1:] into
    _greedy_sample_from_vocab_parallel_head with the target's lm_head.
docs/decisions/0061-dflash-export-and-round.md says which fields the
engines read from a DFlash export.

Inputs
------
--draft DIR: config.json and model.safetensors as
student_trainer/draft/draft_export.cc (EAGLE-3: any float dtype, d2t I64)
or student_trainer/draft/dflash_export.cc (DFlash: fc, hidden_norm,
layers.N.*, norm; a "model." prefix is accepted) writes them.
--eval_dump FILE (safetensors): input_ids I32 [T], cu_seqlens I32 [B+1],
prompt_lengths I32 [B], aux_hidden [T, num_aux*H] (F32/BF16), embed_tokens
[V, H] (F32/BF16), for a DFlash draft target_lm_head [V, H] (F32/BF16),
and metadata "meta": JSON with "chains" and the C++ results "tau",
"rounds", "tokens" (the tokens the rounds yield), each keyed by str(K) (a
plain number is taken for every chain), and "samples". Without C++ values
the script prints its own and exits 0; differing rounds, tokens or samples
are printed as notes (only tau decides the exit code).

Run
---
    python3 tools/acceptance_crosscheck.py --draft DIR --eval_dump FILE \\
        [--device cuda] [--dtype float64] [--tolerance 0.01] [--json_out F]
    python3 tools/acceptance_crosscheck.py --self_test

--self_test builds small random drafts (EAGLE-3, EAGLE-3.1, DFlash) and
synthetic eval sets whose continuations follow the draft's own greedy
proposals in places, checks that the KV-cache implementation accepts
exactly what a cache-free recomputation of every round accepts, round by
round (for DFlash also proposes the same tokens from every row), and then
runs the whole file path (export folder + eval dump with BF16 tensors)
through the main entry point, including a C++ tau off by 0.5 that must be
reported.

Needs only torch (1.13 or later) and the standard library.
"""
import argparse
import json
import math
import os
import struct
import sys
import tempfile
import time

import torch

DEFAULT_CHAINS = [3, 5, 7]
ARCHITECTURE = "LlamaForCausalLMEagle3"
DFLASH_ARCHITECTURE = "DFlashDraftModel"

class FormatError(Exception):
    """An input file that does not hold what this script expects."""


# --- safetensors -------------------------------------------------------------

_ST_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}


def _element_size(dtype):
    return torch.empty((), dtype=dtype).element_size()


def read_safetensors(path, names=None):
    """Reads a safetensors file: 8-byte little-endian header length, a JSON
    header {name: {dtype, shape, data_offsets}} with an optional
    "__metadata__" entry of strings, then the raw little-endian data.
    Returns ({name: CPU tensor}, metadata); `names` limits what is read (the
    eval dump's embed_tokens can be gigabytes)."""
    with open(path, "rb") as f:
        raw_len = f.read(8)
        if len(raw_len) != 8:
            raise FormatError(f"{path}: too short for a safetensors header")
        (header_len,) = struct.unpack("<Q", raw_len)
        try:
            header = json.loads(f.read(header_len).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise FormatError(f"{path}: bad safetensors header: {e}") from None
        metadata = header.pop("__metadata__", None) or {}
        base = 8 + header_len
        tensors = {}
        for name, info in header.items():
            if names is not None and name not in names:
                continue
            tensors[name] = _read_tensor(f, path, name, info, base)
    return tensors, metadata


def _read_tensor(f, path, name, info, base):
    if info.get("dtype") not in _ST_DTYPES:
        raise FormatError(f"{path}: tensor {name!r}: unsupported dtype {info.get('dtype')!r}")
    dtype = _ST_DTYPES[info["dtype"]]
    shape = [int(x) for x in info["shape"]]
    begin, end = (int(x) for x in info["data_offsets"])
    nbytes = math.prod(shape) * _element_size(dtype)
    if end - begin != nbytes:
        raise FormatError(f"{path}: tensor {name!r}: {end - begin} bytes for shape {shape} "
                          f"of {info['dtype']} ({nbytes} expected)")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    buf = bytearray(nbytes)
    f.seek(base + begin)
    if f.readinto(buf) != nbytes:
        raise FormatError(f"{path}: tensor {name!r}: file ends inside its data")
    # BOOL is one byte per value; read it as U8 and compare (any nonzero is true).
    if dtype == torch.bool:
        return torch.frombuffer(buf, dtype=torch.uint8).reshape(shape) != 0
    return torch.frombuffer(buf, dtype=dtype).reshape(shape)


def write_safetensors(path, tensors, metadata=None):
    """The matching writer (the self-test writes an export folder and an
    eval dump with it). Bytes come from copying each tensor into a buffer
    that torch.frombuffer wraps: no numpy, any dtype."""
    header = {"__metadata__": dict(metadata or {})}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        stored = t.to(torch.uint8) if t.dtype == torch.bool else t
        buf = bytearray(stored.numel() * stored.element_size())
        if buf:
            torch.frombuffer(buf, dtype=stored.dtype).copy_(stored.reshape(-1))
        header[name] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(buf)]}
        blobs.append(buf)
        offset += len(buf)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for buf in blobs:
            f.write(buf)


# --- the draft's config and rope ---------------------------------------------


def _field(obj, key, source, kind=float, default=None):
    if key not in obj or obj[key] is None:
        if default is None:
            raise FormatError(f"{source}: field {key!r} is required")
        return default
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FormatError(f"{source}: field {key!r}: expected a number, got {value!r}")
    if kind is int and value != int(value):
        raise FormatError(f"{source}: field {key!r}: expected an integer, got {value!r}")
    return kind(value)


def _flag(config, key, source):
    value = config.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise FormatError(f"{source}: field {key!r}: expected true or false")
    return value


def parse_rope(config, source):
    """The rope settings of a Llama config, as common/model/model_config.cc reads
    them: transformers 5 keeps everything in rope_parameters, transformers
    4 (what draft_export.cc writes) rope_theta at the top and rope_scaling
    (or null) beside it."""
    if isinstance(config.get("rope_parameters"), dict):
        params, prefix = dict(config["rope_parameters"]), "rope_parameters."
    else:
        scaling = config.get("rope_scaling")
        if scaling is not None and not isinstance(scaling, dict):
            raise FormatError(f"{source}: field 'rope_scaling': expected an object or null")
        params, prefix = dict(scaling or {}), "rope_scaling."
        if "rope_theta" in config and "rope_theta" not in params:
            params["rope_theta"] = config["rope_theta"]
    if "partial_rotary_factor" not in params and "partial_rotary_factor" in config:
        params["partial_rotary_factor"] = config["partial_rotary_factor"]
    src = source + " " + prefix.rstrip(".")
    rope = {
        "type": params.get("rope_type") or params.get("type") or "default",
        "theta": _field(params, "rope_theta", src, default=10000.0),
        "partial_rotary_factor": _field(params, "partial_rotary_factor", src, default=1.0),
        "factor": 1.0,
    }
    kind = rope["type"]
    if kind == "linear":
        rope["factor"] = _field(params, "factor", src)
    elif kind == "llama3":
        rope["factor"] = _field(params, "factor", src)
        rope["low_freq_factor"] = _field(params, "low_freq_factor", src)
        rope["high_freq_factor"] = _field(params, "high_freq_factor", src)
        rope["original_max_position_embeddings"] = _field(
            params, "original_max_position_embeddings", src, kind=int)
    elif kind == "yarn":
        max_pos = _field(config, "max_position_embeddings", source, kind=int)
        orig = _field(params, "original_max_position_embeddings", src, kind=int, default=max_pos)
        rope["original_max_position_embeddings"] = orig
        rope["factor"] = _field(params, "factor", src, default=max_pos / orig)
        for key in ("attention_factor", "mscale", "mscale_all_dim"):
            rope[key] = params.get(key)
        rope["beta_fast"] = _field(params, "beta_fast", src, default=32.0)
        rope["beta_slow"] = _field(params, "beta_slow", src, default=1.0)
        rope["truncate"] = bool(params.get("truncate", True))
    elif kind != "default":
        raise FormatError(f"{src}: unsupported rope type {kind!r} "
                          "(supported: default, linear, llama3, yarn)")
    return rope


def _yarn_mscale(scale, mscale):
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(rope, dim):
    """Inverse frequencies [dim/2] (fp32, as transformers'
    modeling_rope_utils.py computes them) and the cos/sin scale (yarn's
    attention factor, else 1). Mirrors common/torch/rope.cc."""
    theta = rope["theta"]
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    base = 1.0 / (theta ** exponent)
    kind = rope["type"]
    if kind == "default":
        return base, 1.0
    if kind == "linear":
        return base / rope["factor"], 1.0
    if kind == "llama3":
        # Keep high frequencies, divide low ones by `factor`, blend between.
        factor, lo, hi = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old_ctx = rope["original_max_position_embeddings"]
        wavelen = 2 * math.pi / base
        llama = torch.where(wavelen > old_ctx / lo, base / factor, base)
        smooth = (old_ctx / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * llama / factor + smooth * llama
        medium = (wavelen >= old_ctx / hi) & (wavelen <= old_ctx / lo)
        return torch.where(medium, smoothed, llama), 1.0
    # yarn (transformers' _compute_yarn_parameters)
    factor = rope["factor"]
    if rope.get("attention_factor") is not None:
        scaling = float(rope["attention_factor"])
    elif rope.get("mscale") and rope.get("mscale_all_dim"):
        scaling = _yarn_mscale(factor, rope["mscale"]) / _yarn_mscale(factor, rope["mscale_all_dim"])
    else:
        scaling = _yarn_mscale(factor, 1.0)
    orig = rope["original_max_position_embeddings"]

    def correction_dim(rotations):
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(rope["beta_fast"]), correction_dim(rope["beta_slow"])
    if rope["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0.0), min(high, dim - 1.0)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    pos_freqs = theta ** exponent
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # share of the unscaled frequency
    return interpolation * (1 - keep) + extrapolation * keep, scaling


class LayerDims:
    """What both drafts' configs say of their decoder layers (Llama/Qwen3
    fields), read with the same defaults the serving engines apply."""

    def read_layer_dims(self, config, source):
        self.hidden_size = _field(config, "hidden_size", source, int)
        self.intermediate_size = _field(config, "intermediate_size", source, int)
        self.num_heads = _field(config, "num_attention_heads", source, int)
        self.num_kv_heads = _field(config, "num_key_value_heads", source, int,
                                   default=self.num_heads)
        self.head_dim = _field(config, "head_dim", source, int,
                               default=self.hidden_size // self.num_heads)
        self.rms_norm_eps = _field(config, "rms_norm_eps", source, default=1e-6)
        self.vocab_size = _field(config, "vocab_size", source, int)

    def read_rope(self, config, source):
        self.rope = parse_rope(config, source)
        self.rotary_dim = int(self.head_dim * self.rope["partial_rotary_factor"])
        if self.num_heads % self.num_kv_heads:
            raise FormatError(f"{source}: num_key_value_heads must divide num_attention_heads")
        if self.rotary_dim <= 0 or self.rotary_dim > self.head_dim or self.rotary_dim % 2:
            raise FormatError(f"{source}: partial_rotary_factor gives rotary dim {self.rotary_dim}")


class DraftConfig(LayerDims):
    """The fields of an exported config.json the draft's forward needs."""

    def __init__(self, config, source="config.json"):
        archs = config.get("architectures")
        if not isinstance(archs, list) or not archs or archs[0] != ARCHITECTURE:
            raise FormatError(f"{source}: field 'architectures': expected [{ARCHITECTURE!r}]")
        if config.get("num_hidden_layers") != 1:
            raise FormatError(f"{source}: field 'num_hidden_layers': expected 1")
        if config.get("hidden_act", "silu") != "silu":
            raise FormatError(f"{source}: field 'hidden_act': only silu is supported")
        self.read_layer_dims(config, source)
        self.draft_vocab_size = _field(config, "draft_vocab_size", source, int)
        self.target_hidden_size = _field(config, "target_hidden_size", source, int,
                                         default=self.hidden_size)
        aux_ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        self.num_aux = len(aux_ids) if isinstance(aux_ids, list) else None  # else from fc
        # EAGLE-3.1: an RMSNorm per aux state before fc, and norm(out), the
        # state lm_head reads, handed to the next step (absent: EAGLE-3).
        self.fc_norm = _flag(config, "fc_norm", source)
        self.norm_output = _flag(config, "norm_output", source)
        self.read_rope(config, source)

    def weight_shapes(self):
        h, qd, kvd = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        i = self.intermediate_size
        return {
            "fc.weight": [h, self.num_aux * self.target_hidden_size],
            "midlayer.self_attn.q_proj.weight": [qd, 2 * h],
            "midlayer.self_attn.k_proj.weight": [kvd, 2 * h],
            "midlayer.self_attn.v_proj.weight": [kvd, 2 * h],
            "midlayer.self_attn.o_proj.weight": [h, qd],
            "midlayer.mlp.gate_proj.weight": [i, h],
            "midlayer.mlp.up_proj.weight": [i, h],
            "midlayer.mlp.down_proj.weight": [h, i],
            "midlayer.input_layernorm.weight": [h],
            "midlayer.hidden_norm.weight": [h],
            "midlayer.post_attention_layernorm.weight": [h],
            "norm.weight": [h],
            "lm_head.weight": [self.draft_vocab_size, h],
            **{f"fc_norm.{k}.weight": [self.target_hidden_size]
               for k in range(self.num_aux if self.fc_norm else 0)},
        }


def _dflash_setting(config, key, source, kind=int):
    """A DFlash setting as SGLang's parse_dflash_draft_config reads it:
    dflash_config first, then the top level."""
    dflash = config.get("dflash_config")
    if dflash is not None and not isinstance(dflash, dict):
        raise FormatError(f"{source}: field 'dflash_config': expected an object")
    if dflash and dflash.get(key) is not None:
        return _field(dflash, key, source + " dflash_config", kind)
    return _field(config, key, source, kind)


class DFlashConfig(LayerDims):
    """The fields of a DFlash export's config.json (dflash_export.cc) the
    block forward needs."""

    def __init__(self, config, source="config.json"):
        archs = config.get("architectures")
        if not isinstance(archs, list) or not archs or archs[0] != DFLASH_ARCHITECTURE:
            raise FormatError(f"{source}: field 'architectures': "
                              f"expected [{DFLASH_ARCHITECTURE!r}]")
        if config.get("hidden_act", "silu") != "silu":
            raise FormatError(f"{source}: field 'hidden_act': only silu is supported")
        if config.get("attention_bias"):
            raise FormatError(f"{source}: field 'attention_bias': only false is supported")
        self.read_layer_dims(config, source)
        self.num_layers = _field(config, "num_hidden_layers", source, int)
        self.block_size = _dflash_setting(config, "block_size", source)
        self.mask_token_id = _dflash_setting(config, "mask_token_id", source)
        layer_ids = (config.get("dflash_config") or {}).get("target_layer_ids")
        if layer_ids is None:
            layer_ids = config.get("target_layer_ids")
        if not isinstance(layer_ids, list) or not layer_ids:
            raise FormatError(f"{source}: field 'dflash_config.target_layer_ids': expected a "
                              "non-empty list")
        self.target_layer_ids = layer_ids
        # The context: the captured layers' states side by side, each of
        # the target's width, which is also the draft's.
        self.num_aux = len(layer_ids)
        self.target_hidden_size = self.hidden_size
        # Sliding-window layers would run causally in the engines; the
        # draft is trained bidirectional inside its block.
        layer_types = config.get("layer_types")
        if layer_types is not None and any(t != "full_attention" for t in layer_types):
            raise FormatError(f"{source}: field 'layer_types': only full_attention is supported")
        self.read_rope(config, source)
        if self.block_size < 2:
            raise FormatError(f"{source}: block_size {self.block_size}: a block needs its anchor "
                              "and a drafted row")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise FormatError(f"{source}: mask_token_id {self.mask_token_id} outside "
                              f"[0, {self.vocab_size})")

    def weight_shapes(self):
        h, d, i = self.hidden_size, self.head_dim, self.intermediate_size
        qd, kvd = self.num_heads * d, self.num_kv_heads * d
        shapes = {"fc.weight": [h, self.num_aux * h], "hidden_norm.weight": [h],
                  "norm.weight": [h]}
        for n in range(self.num_layers):
            shapes.update({
                f"layers.{n}.input_layernorm.weight": [h],
                f"layers.{n}.post_attention_layernorm.weight": [h],
                f"layers.{n}.self_attn.q_proj.weight": [qd, h],
                f"layers.{n}.self_attn.k_proj.weight": [kvd, h],
                f"layers.{n}.self_attn.v_proj.weight": [kvd, h],
                f"layers.{n}.self_attn.o_proj.weight": [h, qd],
                f"layers.{n}.self_attn.q_norm.weight": [d],
                f"layers.{n}.self_attn.k_norm.weight": [d],
                f"layers.{n}.mlp.gate_proj.weight": [i, h],
                f"layers.{n}.mlp.up_proj.weight": [i, h],
                f"layers.{n}.mlp.down_proj.weight": [h, i],
            })
        return shapes


# --- the draft ---------------------------------------------------------------


def at_least_fp32(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def rms_norm(x, weight, eps):
    # transformers' LlamaRMSNorm: statistics in (at least) fp32, the weight
    # applied after the cast back to x's dtype.
    h = x.to(at_least_fp32(x.dtype))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def apply_rope(x, cos, sin):
    """x [m, heads, head_dim]; cos/sin [m, rotary_dim]. HF's rotate_half on
    the first rotary_dim dims, the rest passed through (partial rotary)."""
    rd = cos.shape[-1]
    r, rest = x[..., :rd], x[..., rd:]
    rotated = torch.cat((-r[..., rd // 2:], r[..., : rd // 2]), dim=-1)
    out = r * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat((out, rest), dim=-1) if rest.shape[-1] else out


class DraftBase:
    """What both drafts share: the target's embedding, rope tables and
    grouped-query attention."""

    def __init__(self, cfg, weights, embed_tokens, device, dtype):
        self.cfg, self.device, self.dtype = cfg, device, dtype
        self.w = {k: v.to(device=device, dtype=dtype) for k, v in weights.items()}
        self.embed_tokens = embed_tokens.to(device=device, dtype=dtype)
        # Rope tables are computed in fp32 (as LlamaRotaryEmbedding does) and
        # cast to the activation dtype afterwards.
        inv_freq, self.rope_scaling = rope_inv_freq(cfg.rope, cfg.rotary_dim)
        self.inv_freq = inv_freq.to(device)
        self.scale = 1.0 / math.sqrt(cfg.head_dim)

    def embed(self, ids):
        return self.embed_tokens[torch.as_tensor(ids, device=self.device, dtype=torch.int64)]

    def _cos_sin(self, positions):
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((angles, angles), dim=-1)
        return ((emb.cos() * self.rope_scaling).to(self.dtype),
                (emb.sin() * self.rope_scaling).to(self.dtype))

    def attend(self, q, k, v, allowed=None):
        """q [m, heads, D] over k/v [s, kv_heads, D]; `allowed` [m, s] masks
        keys (None: every key). GQA: kv head j serves query heads
        j*n_rep .. (j+1)*n_rep-1 (transformers' repeat_kv)."""
        n_rep = self.cfg.num_heads // self.cfg.num_kv_heads
        k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * self.scale
        if allowed is not None:
            scores = scores.masked_fill(~allowed[None], float("-inf"))
        probs = torch.softmax(scores.to(at_least_fp32(q.dtype)), dim=-1).to(q.dtype)
        return torch.einsum("hqk,khd->qhd", probs, v).reshape(q.shape[0], -1)


class Eagle3Draft(DraftBase):
    """The exported draft's forward pieces (student_trainer/draft/eagle3_draft.h):
    fc, one Llama decoder layer whose q/k/v read cat(input_layernorm(embeds),
    hidden_norm(hidden)) with hidden as the residual, the final norm and
    lm_head over the draft vocab; target id = draft id + d2t[draft id]."""

    def __init__(self, cfg, weights, d2t, embed_tokens, device, dtype):
        super().__init__(cfg, weights, embed_tokens, device, dtype)
        self.d2t = d2t.to(torch.int64).tolist()  # on the host: one device sync per token, not two

    def make_rows(self, tokens, aux):
        return SampleRows(self, tokens, aux)

    def drafters(self):
        """(the serving engine's implementation, the cache-free reference)"""
        return IncrementalDrafter, NaiveDrafter

    def project_aux(self, aux):
        x = aux.to(self.device, self.dtype)
        if self.cfg.fc_norm:
            parts = x.chunk(self.cfg.num_aux, dim=-1)
            x = torch.cat([rms_norm(part, self.w[f"fc_norm.{k}.weight"], self.cfg.rms_norm_eps)
                           for k, part in enumerate(parts)], dim=-1)
        return x @ self.w["fc.weight"].T

    def next_hidden(self, out):
        """What the next draft step reads of a step's output: out itself
        (EAGLE-3), or norm(out) with norm_output (EAGLE-3.1)."""
        return rms_norm(out, self.w["norm.weight"], self.cfg.rms_norm_eps) if self.cfg.norm_output else out

    def layer_input(self, embeds, hidden):
        # The embedding half comes first (SpecForge/SGLang LlamaDecoderLayer).
        eps = self.cfg.rms_norm_eps
        return torch.cat((rms_norm(embeds, self.w["midlayer.input_layernorm.weight"], eps),
                          rms_norm(hidden, self.w["midlayer.hidden_norm.weight"], eps)), dim=-1)

    def keys_values(self, x, positions):
        """Rotated keys and values [m, kv_heads, head_dim] (not repeated:
        a serving engine caches the kv heads once)."""
        c = self.cfg
        k = (x @ self.w["midlayer.self_attn.k_proj.weight"].T).view(-1, c.num_kv_heads, c.head_dim)
        v = (x @ self.w["midlayer.self_attn.v_proj.weight"].T).view(-1, c.num_kv_heads, c.head_dim)
        cos, sin = self._cos_sin(positions)
        return apply_rope(k, cos, sin), v

    def queries(self, x, positions):
        c = self.cfg
        q = (x @ self.w["midlayer.self_attn.q_proj.weight"].T).view(-1, c.num_heads, c.head_dim)
        cos, sin = self._cos_sin(positions)
        return apply_rope(q, cos, sin)

    def finish(self, hidden, attn):
        """Residual (the hidden input), post-attention norm and SiLU MLP: the
        layer's pre-norm output, which is also what the next step reads."""
        w, eps = self.w, self.cfg.rms_norm_eps
        h = hidden + attn @ w["midlayer.self_attn.o_proj.weight"].T
        y = rms_norm(h, w["midlayer.post_attention_layernorm.weight"], eps)
        mlp = (torch.nn.functional.silu(y @ w["midlayer.mlp.gate_proj.weight"].T)
               * (y @ w["midlayer.mlp.up_proj.weight"].T)) @ w["midlayer.mlp.down_proj.weight"].T
        return h + mlp

    def draft_token(self, out):
        """Greedy draft token (a target id) from one pre-norm output [1, H]."""
        logits = rms_norm(out, self.w["norm.weight"], self.cfg.rms_norm_eps) @ self.w["lm_head.weight"].T
        i = int(logits[0].argmax())
        return i + self.d2t[i]


class SampleRows:
    """A sample's draft rows: row r = (embed(s[r+1]), fc(aux[r]), position r)."""

    def __init__(self, draft, tokens, aux):
        self.tokens = [int(x) for x in tokens]
        n = len(self.tokens)
        self.embeds = draft.embed(self.tokens[1:])
        self.hidden = draft.project_aux(aux[: n - 1])
        self.positions = torch.arange(n - 1, device=draft.device)

    def slice(self, begin, end):
        return self.embeds[begin:end], self.hidden[begin:end], self.positions[begin:end]


# --- the serving-engine implementation: a per-request KV cache ----------------


class KVCache:
    """One request's draft KV cache: slot i holds the key/value of position i
    (rows 0..t, then the chain's decode steps at t+1, t+2, ...)."""

    def __init__(self, capacity, cfg, device, dtype):
        shape = (capacity, cfg.num_kv_heads, cfg.head_dim)
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.length = 0

    def append(self, k, v):
        end = self.length + k.shape[0]
        self.k[self.length:end], self.v[self.length:end] = k, v
        self.length = end

    def truncate(self, length):
        self.length = length

    def view(self):
        return self.k[: self.length], self.v[: self.length]


def run_rows(draft, cache, embeds, hidden, positions):
    """Appends the rows' keys/values to the cache and returns the LAST row's
    pre-norm output [1, H]. Only it is needed: in a one-layer draft earlier
    rows' keys depend on their inputs alone, and the last row sees every
    cached key, the earlier rows included (causal by construction)."""
    x = draft.layer_input(embeds, hidden)
    cache.append(*draft.keys_values(x, positions))
    q = draft.queries(x[-1:], positions[-1:])
    return draft.finish(hidden[-1:], draft.attend(q, *cache.view()))


class IncrementalDrafter:
    """SGLang's flow for one request: prefill extend, K-1 decode steps per
    round into the cache, the chain's entries dropped after verify, then an
    extend of the accepted tokens + bonus with the target's features."""

    def __init__(self, draft, rows, max_chain):
        self.draft, self.rows = draft, rows
        capacity = rows.embeds.shape[0] + max_chain
        self.cache = KVCache(capacity, draft.cfg, draft.device, draft.dtype)
        self.last_out = None  # pre-norm output of the last extended row

    def start(self, p):
        self.last_out = run_rows(self.draft, self.cache, *self.rows.slice(0, p))

    def propose(self, t, k):
        assert self.cache.length == t + 1, "the cache must hold exactly rows 0..t"
        out, ys = self.last_out, [self.draft.draft_token(self.last_out)]
        for i in range(2, k + 1):
            position = torch.tensor([t + i - 1], device=self.draft.device)
            out = run_rows(self.draft, self.cache, self.draft.embed([ys[-1]]), self.draft.next_hidden(out),
                           position)
            ys.append(self.draft.draft_token(out))
        # The chain's keys came from the draft's own hidden states; the rows
        # that replace them are extended with the target's (commit).
        self.cache.truncate(t + 1)
        return ys

    def commit(self, t, advance):
        self.last_out = run_rows(self.draft, self.cache, *self.rows.slice(t + 1, t + 1 + advance))


# --- the reference: every chain recomputed from scratch, no cache -------------


def full_forward(draft, embeds, hidden, positions):
    """A plain causal forward over a whole sequence, every row's output."""
    x = draft.layer_input(embeds, hidden)
    k, v = draft.keys_values(x, positions)
    m = x.shape[0]
    idx = torch.arange(m, device=draft.device)
    causal = idx[None, :] <= idx[:, None]
    return draft.finish(hidden, draft.attend(draft.queries(x, positions), k, v, causal))


class NaiveDrafter:
    """Recomputes rows 0..t and the chain so far at every step: no cache, no
    state between rounds. Slow (quadratic), for the self-test only."""

    def __init__(self, draft, rows, max_chain=None):
        self.draft, self.rows = draft, rows

    def start(self, p):
        pass

    def propose(self, t, k):
        embeds, hidden, positions = self.rows.slice(0, t + 1)
        out = full_forward(self.draft, embeds, hidden, positions)[-1:]
        ys = [self.draft.draft_token(out)]
        for i in range(2, k + 1):
            embeds = torch.cat((embeds, self.draft.embed([ys[-1]])))
            hidden = torch.cat((hidden, self.draft.next_hidden(out)))
            positions = torch.cat((positions, torch.tensor([t + i - 1], device=self.draft.device)))
            out = full_forward(self.draft, embeds, hidden, positions)[-1:]
            ys.append(self.draft.draft_token(out))
        return ys

    def commit(self, t, advance):
        pass


# --- DFlash: block rounds ---------------------------------------------------------


class DFlashDraft(DraftBase):
    """The DFlash export's forward pieces (student_trainer/draft/dflash_draft.h):
    the context is hidden_norm(fc(captured states)); each Qwen3 layer's
    queries are the block's rows, its keys and values the context rows
    (through the layer's own k_proj/v_proj, k_norm and rope at the context
    row's position, never input_layernorm) and then the block's rows; the
    block sees all of them (bidirectional). The final norm, then the
    TARGET's lm_head: the export has no embedding or head of its own."""

    def __init__(self, cfg, weights, embed_tokens, lm_head, device, dtype):
        super().__init__(cfg, weights, embed_tokens, device, dtype)
        self.lm_head = lm_head.to(device=device, dtype=dtype)
        self.layers = [{name[len(f"layers.{n}."):]: t for name, t in self.w.items()
                        if name.startswith(f"layers.{n}.")} for n in range(cfg.num_layers)]

    def make_rows(self, tokens, aux):
        return DFlashRows(self, tokens, aux)

    def drafters(self):
        return DFlashIncrementalDrafter, DFlashNaiveDrafter

    def project_context(self, aux):
        """Captured states [m, k*H] -> context rows [m, H]."""
        x = aux.to(self.device, self.dtype) @ self.w["fc.weight"].T
        return rms_norm(x, self.w["hidden_norm.weight"], self.cfg.rms_norm_eps)

    def _heads(self, layer, name, x, heads):
        return (x @ layer[f"self_attn.{name}.weight"].T).view(-1, heads, self.cfg.head_dim)

    def keys_values(self, layer, x, positions):
        """One layer's rotated keys and values [m, kv_heads, D] of rows x
        [m, H] (context rows as they are, block rows after
        input_layernorm) at `positions`."""
        c = self.cfg
        k = rms_norm(self._heads(layer, "k_proj", x, c.num_kv_heads),
                     layer["self_attn.k_norm.weight"], c.rms_norm_eps)
        cos, sin = self._cos_sin(positions)
        return apply_rope(k, cos, sin), self._heads(layer, "v_proj", x, c.num_kv_heads)

    def queries(self, layer, h, positions):
        c = self.cfg
        q = rms_norm(self._heads(layer, "q_proj", h, c.num_heads), layer["self_attn.q_norm.weight"],
                     c.rms_norm_eps)
        cos, sin = self._cos_sin(positions)
        return apply_rope(q, cos, sin)

    def finish(self, layer, x, attn):
        """o_proj and the residual, post-attention norm and SiLU MLP."""
        eps = self.cfg.rms_norm_eps
        mid = x + attn @ layer["self_attn.o_proj.weight"].T
        m = rms_norm(mid, layer["post_attention_layernorm.weight"], eps)
        return mid + (torch.nn.functional.silu(m @ layer["mlp.gate_proj.weight"].T)
                      * (m @ layer["mlp.up_proj.weight"].T)) @ layer["mlp.down_proj.weight"].T

    def block_embeds(self, anchor):
        return self.embed([anchor] + [self.cfg.mask_token_id] * (self.cfg.block_size - 1))

    def block_positions(self, t):
        return torch.arange(t + 1, t + 1 + self.cfg.block_size, device=self.device)

    def proposals(self, x, k):
        """Rows 1..B-1 of the block's last layer output x [B, H] through the
        final norm and the target's head: the first min(k, B-1) greedy
        tokens, then -1 (no proposal, never matches) up to k."""
        take = min(k, self.cfg.block_size - 1)
        out = rms_norm(x[1: 1 + take], self.w["norm.weight"], self.cfg.rms_norm_eps)
        return (out @ self.lm_head.T).argmax(-1).tolist() + [-1] * (k - take)


class DFlashRows:
    """A sample's tokens and the target's captured states [n, k*H] as the
    dump holds them; the drafters project them when they need them."""

    def __init__(self, draft, tokens, aux):
        self.tokens = [int(x) for x in tokens]
        self.aux = aux[: len(self.tokens)].to(draft.device, draft.dtype)


class DFlashIncrementalDrafter:
    """SGLang's dflash_worker for one request: every layer keeps the
    context's keys and values in its KV cache (position i: context row i).
    The prefill appends rows 0..p-1; a round drafts the block against the
    cache without writing to it; the commit appends the rows the round
    verified (the anchor and the accepted tokens), whose target states
    are now known."""

    def __init__(self, draft, rows, max_chain):
        self.draft, self.rows = draft, rows
        self.caches = [KVCache(len(rows.tokens), draft.cfg, draft.device, draft.dtype)
                       for _ in draft.layers]

    def _append(self, begin, end):
        context = self.draft.project_context(self.rows.aux[begin:end])
        positions = torch.arange(begin, end, device=self.draft.device)
        for layer, cache in zip(self.draft.layers, self.caches):
            cache.append(*self.draft.keys_values(layer, context, positions))

    def start(self, p):
        self._append(0, p)

    def propose(self, t, k):
        d = self.draft
        assert all(c.length == t + 1 for c in self.caches), "the caches must hold rows 0..t"
        x, positions = d.block_embeds(self.rows.tokens[t + 1]), d.block_positions(t)
        for layer, cache in zip(d.layers, self.caches):
            h = rms_norm(x, layer["input_layernorm.weight"], d.cfg.rms_norm_eps)
            k_blk, v_blk = d.keys_values(layer, h, positions)
            k_ctx, v_ctx = cache.view()
            attn = d.attend(d.queries(layer, h, positions), torch.cat((k_ctx, k_blk)),
                            torch.cat((v_ctx, v_blk)))
            x = d.finish(layer, x, attn)
        return d.proposals(x, k)

    def commit(self, t, advance):
        self._append(t + 1, t + 1 + advance)


class DFlashNaiveDrafter:
    """Every round from scratch: rows 0..t projected again, and in every
    layer one key/value projection over the context rows and the block's
    rows together (the reference DFlash attention's formulation), with
    the block's allow-mask materialised. No state between rounds."""

    def __init__(self, draft, rows, max_chain=None):
        self.draft, self.rows = draft, rows

    def start(self, p):
        pass

    def propose(self, t, k):
        d, B = self.draft, self.draft.cfg.block_size
        context = d.project_context(self.rows.aux[: t + 1])
        positions = torch.arange(t + 1 + B, device=d.device)  # context rows, then the block
        # The block sees its sample's rows before its anchor and its whole block.
        allowed = torch.ones(B, t + 1 + B, dtype=torch.bool, device=d.device)
        x = d.block_embeds(self.rows.tokens[t + 1])
        for layer in d.layers:
            h = rms_norm(x, layer["input_layernorm.weight"], d.cfg.rms_norm_eps)
            keys, values = d.keys_values(layer, torch.cat((context, h)), positions)
            attn = d.attend(d.queries(layer, h, positions[t + 1:]), keys, values, allowed)
            x = d.finish(layer, x, attn)
        return d.proposals(x, k)

    def commit(self, t, advance):
        pass


# --- the round simulation ----------------------------------------------------


def count_accepted(ys, expected):
    """The length of the longest prefix of ys that equals expected."""
    a = 0
    while a < len(expected) and ys[a] == expected[a]:
        a += 1
    return a


def simulate(drafter, tokens, p, k):
    """Verify rounds of one request against the recorded greedy target.
    Returns [(accepted, advance)] per round."""
    n = len(tokens)
    rounds, t = [], p - 1
    drafter.start(p)
    while True:
        remaining = n - 2 - t  # tokens after s[t+1] still in the data
        if remaining == 0:
            return rounds
        ys = drafter.propose(t, k)
        a = count_accepted(ys, tokens[t + 2: t + 2 + min(k, remaining)])
        advance = min(a + 1, remaining)  # accepted + the target's bonus token
        rounds.append((a, advance))
        if advance < remaining:  # nothing is drafted after the data's end
            drafter.commit(t, advance)
        t += advance


def measure(draft, samples, chains, drafter_class):
    """Per chain: the per-sample round lists, rounds, produced and tau."""
    results = {}
    for k in chains:
        per_sample = [simulate(drafter_class(draft, rows, k), rows.tokens, p, k) for rows, p in samples]
        rounds = sum(len(r) for r in per_sample)
        produced = sum(adv for r in per_sample for _, adv in r)
        hist = [0] * (k + 1)
        for r in per_sample:
            for a, _ in r:
                hist[a] += 1
        results[k] = {"per_sample": per_sample, "rounds": rounds, "produced": produced,
                      "tau": produced / rounds if rounds else float("nan"), "accept_hist": hist}
    return results


# --- loading the inputs -------------------------------------------------------


def read_draft_config(draft_dir):
    config_path = os.path.join(draft_dir, "config.json")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise FormatError(f"{config_path}: {e}") from None
    if not isinstance(config, dict):
        raise FormatError(f"{config_path}: not a JSON object")
    return config


def is_dflash(config):
    archs = config.get("architectures")
    return isinstance(archs, list) and archs[:1] == [DFLASH_ARCHITECTURE]


def dump_tensor_names(config):
    """The eval dump's tensors this draft needs: a DFlash draft proposes
    through the target's lm_head, which its export does not hold."""
    return EVAL_TENSORS + (["target_lm_head"] if is_dflash(config) else [])


def load_draft(draft_dir, config, dump_tensors, device, dtype):
    """The export in `draft_dir` (config.json already read into `config`),
    with the target's tensors it needs from the eval dump."""
    config_path = os.path.join(draft_dir, "config.json")
    weights_path = os.path.join(draft_dir, "model.safetensors")
    archs = config.get("architectures")
    if not isinstance(archs, list) or archs[:1] not in ([ARCHITECTURE], [DFLASH_ARCHITECTURE]):
        raise FormatError(f"{config_path}: field 'architectures': expected [{ARCHITECTURE!r}] "
                          f"or [{DFLASH_ARCHITECTURE!r}], got {archs!r}")
    if is_dflash(config):
        cfg = DFlashConfig(config, config_path)
        tensors, _ = read_safetensors(weights_path)
        return build_dflash_draft(cfg, tensors, dump_tensors["embed_tokens"],
                                  dump_tensors["target_lm_head"], device, dtype, weights_path)
    cfg = DraftConfig(config, config_path)
    tensors, _ = read_safetensors(weights_path)
    return build_draft(cfg, tensors, dump_tensors["embed_tokens"], device, dtype, weights_path)


def _check_shapes(shapes, tensors, source):
    for name, shape in shapes.items():
        t = tensors.get(name)
        if t is None:
            raise FormatError(f"{source}: tensor {name!r} is missing")
        if list(t.shape) != shape or not t.is_floating_point():
            raise FormatError(f"{source}: tensor {name!r}: expected a float tensor {shape}, "
                              f"got {t.dtype} {list(t.shape)}")


def build_dflash_draft(cfg, tensors, embed_tokens, lm_head, device, dtype, source):
    # vLLM's loader adds a "model." prefix; the export has none, either is read.
    tensors = {name[len("model."):] if name.startswith("model.") else name: t
               for name, t in tensors.items()}
    shapes = cfg.weight_shapes()
    _check_shapes(shapes, tensors, source)
    for name, t in (("embed_tokens", embed_tokens), ("target_lm_head", lm_head)):
        if list(t.shape) != [cfg.vocab_size, cfg.hidden_size] or not t.is_floating_point():
            raise FormatError(f"{name}: expected a float tensor [{cfg.vocab_size}, "
                              f"{cfg.hidden_size}], got {t.dtype} {list(t.shape)}")
    weights = {name: tensors[name] for name in shapes}
    return DFlashDraft(cfg, weights, embed_tokens, lm_head, device, dtype)


def build_draft(cfg, tensors, embed_tokens, device, dtype, source):
    fc = tensors.get("fc.weight")
    if fc is None:
        raise FormatError(f"{source}: tensor 'fc.weight' is missing")
    num_aux = fc.shape[1] // cfg.target_hidden_size
    if cfg.num_aux is not None and cfg.num_aux != num_aux:
        raise FormatError(f"{source}: fc.weight reads {num_aux} aux states, config.json "
                          f"lists {cfg.num_aux} aux layer ids")
    cfg.num_aux = num_aux
    _check_shapes(cfg.weight_shapes(), tensors, source)
    d2t = tensors.get("d2t")
    if d2t is None:
        if cfg.draft_vocab_size != cfg.vocab_size:
            raise FormatError(f"{source}: tensor 'd2t' is missing")
        d2t = torch.zeros(cfg.draft_vocab_size, dtype=torch.int64)  # identity map
    ids = torch.arange(cfg.draft_vocab_size) + d2t.to(torch.int64)
    if list(d2t.shape) != [cfg.draft_vocab_size] or ids.min() < 0 or ids.max() >= cfg.vocab_size:
        raise FormatError(f"{source}: d2t must map {cfg.draft_vocab_size} draft ids into "
                          f"[0, {cfg.vocab_size})")
    if list(embed_tokens.shape) != [cfg.vocab_size, cfg.hidden_size]:
        raise FormatError(f"embed_tokens: expected [{cfg.vocab_size}, {cfg.hidden_size}], "
                          f"got {list(embed_tokens.shape)}")
    weights = {name: tensors[name] for name in cfg.weight_shapes()}
    return Eagle3Draft(cfg, weights, d2t, embed_tokens, device, dtype)


EVAL_TENSORS = ["input_ids", "cu_seqlens", "prompt_lengths", "aux_hidden", "embed_tokens"]


def load_eval_dump(path, names=None):
    names = names or EVAL_TENSORS
    tensors, metadata = read_safetensors(path, names=set(names))
    for name in names:
        if name not in tensors:
            why = (" (a DFlash draft proposes through the target's lm_head, which the "
                   "student writes into the dump)" if name == "target_lm_head" else "")
            raise FormatError(f"{path}: tensor {name!r} is missing{why}")
    meta = {}
    if "meta" in metadata:
        try:
            meta = json.loads(metadata["meta"])
        except json.JSONDecodeError as e:
            raise FormatError(f"{path}: metadata 'meta' is not JSON: {e}") from None
    return tensors, meta


def split_samples(draft, tensors, source):
    """[(SampleRows, prompt length)] from the packed eval dump, validated."""
    ids = tensors["input_ids"].to(torch.int64).reshape(-1)
    cu = [int(x) for x in tensors["cu_seqlens"].reshape(-1)]
    prompts = [int(x) for x in tensors["prompt_lengths"].reshape(-1)]
    aux = tensors["aux_hidden"]
    total = ids.shape[0]
    if not cu or cu[0] != 0 or cu[-1] != total or any(b <= a for a, b in zip(cu, cu[1:])):
        raise FormatError(f"{source}: cu_seqlens must rise strictly from 0 to {total}")
    if len(prompts) != len(cu) - 1:
        raise FormatError(f"{source}: prompt_lengths has {len(prompts)} entries for "
                          f"{len(cu) - 1} samples")
    width = draft.cfg.num_aux * draft.cfg.target_hidden_size
    if list(aux.shape) != [total, width]:
        raise FormatError(f"{source}: aux_hidden: expected [{total}, {width}], got {list(aux.shape)}")
    if ids.numel() and (ids.min() < 0 or ids.max() >= draft.cfg.vocab_size):
        raise FormatError(f"{source}: input_ids outside [0, {draft.cfg.vocab_size})")
    samples = []
    for b, (begin, end) in enumerate(zip(cu, cu[1:])):
        p, n = prompts[b], end - begin
        if not 1 <= p < n:
            raise FormatError(f"{source}: sample {b}: prompt length {p} outside [1, {n - 1}]")
        samples.append((draft.make_rows(ids[begin:end], aux[begin:end]), p))
    return samples


# --- comparison and report ------------------------------------------------------


def _lookup(table, k):
    """meta[...] per chain: a dict keyed by str(K) (JSON keys are strings),
    or one number for every chain."""
    if isinstance(table, dict):
        table = table.get(str(k), table.get(k))
    if isinstance(table, bool) or not isinstance(table, (int, float)):
        return None
    return table


def compare(results, meta, tolerance, extra):
    """Builds the report: per chain our tau/rounds/produced tokens, the C++
    ones, the difference, and which chains are beyond the tolerance."""
    report = dict(extra, tolerance=tolerance, chains=list(results), tau={}, rounds={},
                  tokens={}, accept_hist={}, cpp_tau={}, cpp_rounds={}, cpp_tokens={},
                  abs_diff={}, failed_chains=[], cpp_samples=meta.get("samples"))
    for k, r in results.items():
        key = str(k)
        report["tau"][key], report["rounds"][key] = r["tau"], r["rounds"]
        report["tokens"][key], report["accept_hist"][key] = r["produced"], r["accept_hist"]
        cpp_tau = _lookup(meta.get("tau"), k)
        report["cpp_tau"][key] = None if cpp_tau is None else float(cpp_tau)
        for name in ("rounds", "tokens"):
            value = _lookup(meta.get(name), k)
            report["cpp_" + name][key] = None if value is None else int(value)
        diff = None if cpp_tau is None else abs(r["tau"] - cpp_tau)
        report["abs_diff"][key] = diff
        if diff is not None and not diff <= tolerance:  # NaN fails too
            report["failed_chains"].append(k)
    report["ok"] = not report["failed_chains"]
    return report


def print_notes(report, out):
    """Counts that differ from the C++ ones: not failures by themselves
    (the tolerance is on tau), but they point at how the dump was read."""
    for k in report["chains"]:
        key = str(k)
        mine, theirs = report["tokens"][key], report["cpp_tokens"][key]
        if theirs is not None and theirs != mine:
            print(f"note: chain {k}: the rounds yield {mine} tokens here, {theirs} in C++",
                  file=out)
    if report["cpp_samples"] is not None and report["cpp_samples"] != report["samples"]:
        print(f"note: {report['samples']} samples in the dump, meta says {report['cpp_samples']}",
              file=out)


def _fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def print_report(report, out=sys.stdout):
    for k in report["chains"]:
        key = str(k)
        print(f"chain {k}: tau {report['tau'][key]:.4f} "
              f"(C++ {_fmt(report['cpp_tau'][key], '.4f')}, "
              f"|diff| {_fmt(report['abs_diff'][key], '.4f')}), "
              f"rounds {report['rounds'][key]} (C++ {_fmt(report['cpp_rounds'][key], 'd')})",
              file=out)
    print(json.dumps(report, sort_keys=True), file=out)


def crosscheck(draft_dir, eval_dump, device, dtype, tolerance, json_out=None, out=None,
               err=None):
    """The main path: prints the report to `out` (stdout), failures to `err`
    (stderr). Returns (exit code, report)."""
    out, err = out or sys.stdout, err or sys.stderr
    start = time.time()
    config = read_draft_config(draft_dir)
    tensors, meta = load_eval_dump(eval_dump, dump_tensor_names(config))
    draft = load_draft(draft_dir, config, tensors, device, dtype)
    samples = split_samples(draft, tensors, eval_dump)
    chains = [int(k) for k in meta.get("chains", DEFAULT_CHAINS)]
    if any(k < 1 for k in chains):
        raise FormatError(f"{eval_dump}: meta chains {chains}: chain lengths must be >= 1")
    results = measure(draft, samples, chains, draft.drafters()[0])
    extra = {"architecture": DFLASH_ARCHITECTURE if is_dflash(config) else ARCHITECTURE,
             "samples": len(samples), "tokens_total": int(tensors["input_ids"].numel()),
             "device": str(device), "dtype": str(dtype).replace("torch.", ""),
             "seconds": round(time.time() - start, 3)}
    report = compare(results, meta, tolerance, extra)
    print_report(report, out)
    print_notes(report, out)
    if json_out:
        with open(json_out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, sort_keys=True)
            f.write("\n")
    for k in report["failed_chains"]:
        print(f"FAIL: chain {k}: |tau - C++ tau| = {report['abs_diff'][str(k)]:.4f} "
              f"> tolerance {tolerance}", file=err)
    return (0 if report["ok"] else 1), report


# --- self-test --------------------------------------------------------------------

SELF_TEST_CONFIG = {
    "architectures": [ARCHITECTURE],
    "model_type": "llama",
    "num_hidden_layers": 1,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "vocab_size": 256,
    "draft_vocab_size": 96,
    "target_hidden_size": 64,
    "tie_word_embeddings": False,
    "max_position_embeddings": 256,
    "rope_theta": 10000.0,
    # llama3 scaling with a short original context, so that the scaled
    # branch of the inverse frequencies is taken at these small positions.
    "rope_scaling": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    "torch_dtype": "float32",
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
}

SELF_TEST_CHAINS = [1, 3, 5, 7]
GENERATOR_CHAIN = 7  # the synthetic target follows chains of up to this many tokens

DFLASH_SELF_TEST_CONFIG = {
    "architectures": [DFLASH_ARCHITECTURE],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "attention_bias": False,
    "rms_norm_eps": 1e-6,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rope_theta": 10000.0,
    "rope_scaling": SELF_TEST_CONFIG["rope_scaling"],
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "block_size": 5,
    "num_target_layers": 4,
    "layer_types": ["full_attention"] * 2,
    "dflash_config": {"mask_token_id": 255, "target_layer_ids": [1, 3], "block_size": 5},
}
# Chain 4 is the whole block's B - 1 proposals, which the synthetic target
# follows; chain 6 asks for more than a block proposes.
DFLASH_SELF_TEST_CHAINS = [1, 2, 4, 6]
DFLASH_GENERATOR_CHAIN = 4

# (prompt length, total length): an ordinary mix, a prompt of one token, one
# with no continuation beyond the first generated token (no rounds), one
# with a single round.
SELF_TEST_SHAPES = [(9, 60), (1, 35), (4, 5), (6, 8), (12, 70), (3, 41), (17, 50)]


def _bf16_exact(t):
    # Rounded to bf16-representable values, so that the eval dump's BF16
    # tensors hold exactly what the in-memory test used.
    return t.to(torch.bfloat16).to(torch.float32)


def make_self_test_weights(cfg, g):
    h, nh, nkv, d, i = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                        cfg.intermediate_size)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=g) * std

    # Scales keep activations O(1): attention far from uniform, logits far
    # from ties (as tests/golden/make_eagle3_golden.py does).
    weights = {
        "fc.weight": randn(h, 3 * h, std=1 / math.sqrt(3 * h)),
        "midlayer.self_attn.q_proj.weight": randn(nh * d, 2 * h, std=1.5 / math.sqrt(2 * h)),
        "midlayer.self_attn.k_proj.weight": randn(nkv * d, 2 * h, std=1.5 / math.sqrt(2 * h)),
        "midlayer.self_attn.v_proj.weight": randn(nkv * d, 2 * h, std=1 / math.sqrt(2 * h)),
        "midlayer.self_attn.o_proj.weight": randn(h, nh * d, std=1 / math.sqrt(nh * d)),
        "midlayer.mlp.gate_proj.weight": randn(i, h, std=1 / math.sqrt(h)),
        "midlayer.mlp.up_proj.weight": randn(i, h, std=1 / math.sqrt(h)),
        "midlayer.mlp.down_proj.weight": randn(h, i, std=1 / math.sqrt(i)),
        "midlayer.input_layernorm.weight": 1 + randn(h, std=0.1),
        "midlayer.hidden_norm.weight": 1 + randn(h, std=0.1),
        "midlayer.post_attention_layernorm.weight": 1 + randn(h, std=0.1),
        "norm.weight": 1 + randn(h, std=0.1),
        "lm_head.weight": randn(cfg.draft_vocab_size, h, std=2 / math.sqrt(h)),
    }
    draft_ids = torch.randperm(cfg.vocab_size, generator=g)[: cfg.draft_vocab_size].sort().values
    d2t = draft_ids - torch.arange(cfg.draft_vocab_size)
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[draft_ids] = True
    embed = _bf16_exact(randn(cfg.vocab_size, h))
    return weights, d2t, t2d, embed


def make_dflash_self_test_weights(cfg, g):
    """Random DFlash weights in the export's names, and the target's
    embedding and head (bf16-exact: the dump may store them as BF16)."""
    h = cfg.hidden_size

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=g) * std

    weights = {"fc.weight": randn(h, cfg.num_aux * h, std=1 / math.sqrt(cfg.num_aux * h)),
               "hidden_norm.weight": 1 + randn(h, std=0.1), "norm.weight": 1 + randn(h, std=0.1)}
    for shape_name, shape in cfg.weight_shapes().items():
        if shape_name in weights:
            continue
        if shape_name.endswith("norm.weight"):
            # q/k norms above one sharpen the attention, which the unit-RMS
            # heads would otherwise keep near uniform.
            scale = 2.0 if "self_attn" in shape_name else 1.0
            weights[shape_name] = scale * (1 + randn(*shape, std=0.1))
        else:
            weights[shape_name] = randn(*shape, std=1 / math.sqrt(shape[1]))
    # Embeddings smaller than the attention's and MLP's outputs, so that the
    # mask rows' proposals follow the context and the anchor rather than
    # the mask token's own embedding.
    embed = _bf16_exact(randn(cfg.vocab_size, h, std=0.5))
    lm_head = _bf16_exact(randn(cfg.vocab_size, h, std=2 / math.sqrt(h)))
    return weights, embed, lm_head


def synthesize_sample(draft, g, p, n, generator_chain):
    """Tokens and aux states of one sample whose continuation a synthetic
    target writes: from each round start it emits the draft's own greedy
    proposals for a random number of tokens (0..generator_chain), then a
    token the draft did not propose. Rounds of that chain length line up
    with it; shorter chains start mid-way, from the target's features, and
    agree only sometimes."""
    aux = _bf16_exact(torch.randn(n, draft.cfg.num_aux * draft.cfg.target_hidden_size,
                                  generator=g))
    vocab = draft.cfg.vocab_size
    naive = draft.drafters()[1]
    tokens = torch.randint(0, vocab, (p + 1,), generator=g).tolist()  # prompt + first token
    t = p - 1
    while len(tokens) < n:
        rows = draft.make_rows(tokens, aux[: len(tokens)])
        chain = naive(draft, rows).propose(t, generator_chain)
        a = int(torch.randint(0, generator_chain + 1, (1,), generator=g))
        bonus = int(torch.randint(0, vocab, (1,), generator=g))
        while a < generator_chain and bonus == chain[a]:
            bonus = int(torch.randint(0, vocab, (1,), generator=g))
        tokens += (chain[:a] + [bonus])[: n - len(tokens)]
        t += a + 1
    return tokens, aux


def synthesize_samples(draft, g, generator_chain):
    samples = []
    for p, n in SELF_TEST_SHAPES:
        tokens, aux = synthesize_sample(draft, g, p, n, generator_chain)
        rows = draft.make_rows(tokens, aux)
        rows.dump_aux = aux  # kept for the eval dump
        samples.append((rows, p))
    return samples


def _check(condition, message):
    if not condition:
        raise AssertionError("self-test: " + message)


def self_test_equivalence(draft, samples, chains, generator_chain):
    """The KV-cache implementation against the cache-free recomputation:
    the same accepted count in every round of every sample and chain."""
    incremental_class, naive_class = draft.drafters()
    incremental = measure(draft, samples, chains, incremental_class)
    naive = measure(draft, samples, chains, naive_class)
    for k in chains:
        for b, (inc, ref) in enumerate(zip(incremental[k]["per_sample"], naive[k]["per_sample"])):
            _check(inc == ref, f"chain {k}, sample {b}: incremental rounds {inc} != naive {ref}")
        expected = sum(len(rows.tokens) - 1 - p for rows, p in samples)
        _check(incremental[k]["produced"] == expected,
               f"chain {k}: produced {incremental[k]['produced']} != {expected}")
        hist = incremental[k]["accept_hist"]
        print(f"self-test chain {k}: tau incremental {incremental[k]['tau']:.6f}, "
              f"naive {naive[k]['tau']:.6f}, rounds {incremental[k]['rounds']}, "
              f"accepted-count histogram {hist}")
        # Non-trivial acceptance: some rounds accept nothing, some accept tokens.
        _check(hist[0] > 0 and sum(hist[1:]) > 0, f"chain {k}: trivial acceptance {hist}")
    _check(incremental[generator_chain]["accept_hist"][generator_chain] > 0,
           "no full-length chain was accepted")
    return incremental


def self_test_files(cfg_json, model_tensors, dump_tensors, samples, results, device, dtype):
    """The file path: an export folder and an eval dump (BF16 aux and
    `dump_tensors`, the target's, and meta with the values just measured)
    through crosscheck(); then the same dump with one chain's C++ tau moved
    past the tolerance."""
    chains = list(results)
    tokens = [t for rows, _ in samples for t in rows.tokens]
    cu = [0]
    for rows, _ in samples:
        cu.append(cu[-1] + len(rows.tokens))
    meta = {"chains": chains, "tau": {str(k): r["tau"] for k, r in results.items()},
            "rounds": {str(k): r["rounds"] for k, r in results.items()},
            "tokens": {str(k): r["produced"] for k, r in results.items()}, "samples": len(samples)}
    dump = dict(dump_tensors,
                input_ids=torch.tensor(tokens, dtype=torch.int32),
                cu_seqlens=torch.tensor(cu, dtype=torch.int32),
                prompt_lengths=torch.tensor([p for _, p in samples], dtype=torch.int32),
                aux_hidden=torch.cat([s.dump_aux for s, _ in samples]).to(torch.bfloat16))
    with tempfile.TemporaryDirectory() as tmp:
        draft_dir = os.path.join(tmp, "draft")
        os.makedirs(draft_dir)
        with open(os.path.join(draft_dir, "config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg_json, f, indent=2)
        write_safetensors(os.path.join(draft_dir, "model.safetensors"), model_tensors,
                          {"format": "pt"})
        dump_path = os.path.join(tmp, "eval_dump.safetensors")
        write_safetensors(dump_path, dump, {"meta": json.dumps(meta)})
        code, report = crosscheck(draft_dir, dump_path, device, dtype, 0.01,
                                  json_out=os.path.join(tmp, "report.json"))
        _check(code == 0, "crosscheck on the self-test's own files failed")
        for k in chains:
            _check(report["abs_diff"][str(k)] == 0.0 and report["rounds"][str(k)] ==
                   results[k]["rounds"], f"chain {k}: the file path measured another tau")
        meta["tau"][str(chains[1])] += 0.5
        write_safetensors(dump_path, dump, {"meta": json.dumps(meta)})
        with open(os.devnull, "w") as quiet:
            code, report = crosscheck(draft_dir, dump_path, device, dtype, 0.01, out=quiet,
                                      err=quiet)
        _check(code == 1 and report["failed_chains"] == [chains[1]],
               f"a C++ tau off by 0.5 on chain {chains[1]} was not reported")
        print(f"self-test files: crosscheck passes on its own dump and names chain {chains[1]} "
              "when its C++ tau is off by 0.5")


def self_test_eagle3(device, dtype):
    # EAGLE-3, then EAGLE-3.1 (fc_norm, norm_output) on the same weights
    # plus its norms.
    for config in (SELF_TEST_CONFIG, dict(SELF_TEST_CONFIG, fc_norm=True, norm_output=True)):
        print("self-test:", "EAGLE-3.1" if config.get("norm_output") else "EAGLE-3")
        g = torch.Generator().manual_seed(20250611)
        cfg = DraftConfig(config, "self-test config")
        cfg.num_aux = 3
        weights, d2t, t2d, embed = make_self_test_weights(cfg, g)
        if cfg.fc_norm:
            for k in range(cfg.num_aux):
                weights[f"fc_norm.{k}.weight"] = 1 + torch.randn(cfg.target_hidden_size, generator=g) * 0.1
        draft = build_draft(cfg, dict(weights, d2t=d2t), embed, device, dtype, "self-test weights")
        samples = synthesize_samples(draft, g, GENERATOR_CHAIN)
        results = self_test_equivalence(draft, samples, SELF_TEST_CHAINS, GENERATOR_CHAIN)
        self_test_files(config, dict(weights, d2t=d2t.to(torch.int64), t2d=t2d),
                        {"embed_tokens": embed}, samples, results, device, dtype)


def self_test_dflash(device, dtype):
    print("self-test: DFlash")
    g = torch.Generator().manual_seed(20250612)
    cfg = DFlashConfig(DFLASH_SELF_TEST_CONFIG, "self-test config")
    weights, embed, lm_head = make_dflash_self_test_weights(cfg, g)
    draft = build_dflash_draft(cfg, weights, embed, lm_head, device, dtype, "self-test weights")
    samples = synthesize_samples(draft, g, DFLASH_GENERATOR_CHAIN)
    # Token by token: a round from every row, the cache extended one row at
    # a time, proposes exactly what the recomputation does.
    proposed = set()
    for rows, p in samples:
        incremental = DFlashIncrementalDrafter(draft, rows, None)
        naive = DFlashNaiveDrafter(draft, rows)
        incremental.start(p)
        for t in range(p - 1, len(rows.tokens) - 2):
            ys = incremental.propose(t, DFLASH_GENERATOR_CHAIN)
            _check(ys == naive.propose(t, DFLASH_GENERATOR_CHAIN),
                   f"row {t}: the cached context proposes {ys}, the recomputation otherwise")
            proposed.update(ys)
            incremental.commit(t, 1)
    _check(len(proposed) > 20, f"the proposals hardly vary: {sorted(proposed)}")
    results = self_test_equivalence(draft, samples, DFLASH_SELF_TEST_CHAINS, DFLASH_GENERATOR_CHAIN)
    # Proposals beyond the block's B - 1 never match: chain 6 is chain 4.
    _check(results[6]["per_sample"] == results[4]["per_sample"],
           "a chain longer than the block accepted other than the whole block")
    # The target's head in BF16, as a bf16 student writes it.
    self_test_files(DFLASH_SELF_TEST_CONFIG, weights,
                    {"embed_tokens": embed, "target_lm_head": lm_head.to(torch.bfloat16)},
                    samples, results, device, dtype)


def self_test(device, dtype):
    self_test_eagle3(device, dtype)
    self_test_dflash(device, dtype)
    print("self-test passed")


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Re-measures the acceptance length tau of an exported EAGLE-3 draft (as "
                    "SGLang's chain speculative decoding, topk 1, K steps, serves it) or DFlash "
                    "draft (as SGLang's block rounds serve it, the first K of a block's "
                    "proposals verified) against a greedy target, and compares it with the "
                    "C++ student's values in the eval dump's metadata. Exit 1 if a chain "
                    "differs by more than --tolerance.")
    parser.add_argument("--draft", help="exported draft folder (config.json, model.safetensors)")
    parser.add_argument("--eval_dump", help="the C++ student's eval dump (safetensors)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu; e.g. cuda)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                        help="weights and activations (default float32)")
    parser.add_argument("--tolerance", type=float, default=0.01,
                        help="largest allowed |tau - C++ tau| per chain (default 0.01)")
    parser.add_argument("--json_out", help="also write the JSON report to this file")
    parser.add_argument("--self_test", action="store_true",
                        help="check the KV-cache implementations against cache-free ones on "
                             "random EAGLE-3 and DFlash drafts, and the file path end to end")
    args = parser.parse_args(argv)
    if not args.self_test and (not args.draft or not args.eval_dump):
        parser.error("--draft and --eval_dump are required (or --self_test)")
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_grad_enabled(False)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if args.self_test:
        self_test(device, dtype)
        return 0
    try:
        code, _ = crosscheck(args.draft, args.eval_dump, device, dtype, args.tolerance,
                             args.json_out)
    except (FormatError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
