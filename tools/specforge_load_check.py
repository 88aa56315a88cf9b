#!/usr/bin/env python3
"""Loads an exported draft into SpecForge's own draft classes and checks that
SpecForge computes the same logits as tools/acceptance_crosscheck.py.

What it proves
--------------
SpecForge users warm-start from, finetune or evaluate a draft folder
(config.json + model.safetensors) through SpecForge's registry:
specforge.training.model_loading.load_draft_config_source (the config, as
SpecForge's trainer reads model.draft_checkpoint_path / draft_model_config),
specforge.modeling.auto.AutoDraftModel.from_config (the class named by
config.json's "architectures": DFlashDraftModel, or LlamaForCausalLMEagle3
with EAGLE-3.1's fc_norm / norm_output turned on by the config keys of the
same names) and warm_start_draft_model (its AutoDraftModel.from_pretrained
+ load_state_dict(strict=False) path). This script

1. builds SpecForge's class from the export's config.json, loads the
   export's tensors with load_state_dict(strict=False) and lists the keys
   the class has and the file lacks (missing), the file has and the class
   lacks (unexpected), and the ones of another shape (mismatched);
2. fills the documented frozen-target tensors the class holds but the
   export leaves out on purpose from the eval dump (reported on their own
   under "frozen_target_filled", never counted as loaded);
3. runs SpecForge's own loaders on the folder as well: warm_start_draft_model
   (into a fresh model, whose tensors must equal step 1's) and
   AutoDraftModel.from_pretrained(..., output_loading_info=True), whose
   missing / unexpected / mismatched keys are reported too;
4. runs SpecForge's model the way SpecForge runs it and compares its logits
   with our independent implementation (tools/acceptance_crosscheck.py,
   whose tau the e2e tests prove equal to the C++ trainer's), in fp32:
   * DFlash (DFlashDraftModel.spec_generate's draft call): for a round at
     row t the context is the target states of rows 0..t (the dump's
     aux_hidden), the block [s[t+1], MASK x (B-1)] embedded with the
     target's embedding at positions t+1..t+B, position_ids 0..t+B, a fresh
     DynamicCache, use_cache=True, is_causal=False; logits = the target's
     lm_head (dump target_lm_head) of the block's rows 1..B-1, as
     _sample_draft_tokens reads them. Once with the config's
     _attn_implementation "sdpa" and once "eager" (build_dflash_draft sets
     it from training.attention_backend).
   * EAGLE-3 / EAGLE-3.1 (the first TTT step of SpecForge's
     OnlineEagle3Model): project_hidden_states(aux) (fc_norm, then fc),
     embed_input_ids of the input ids shifted by one (specforge.utils.padding,
     left=False), causal over the prefix at positions 0..n-1, backbone, then
     compute_logits. Row t's logits are the first draft step of a round at
     row t over the prefix rows 0..t. Once with attention_backend "sdpa"
     (cache_hidden lists, the additive causal mask of
     prepare_decoder_attention_mask) and once "flex_attention" (SpecForge's
     default training backend: DynamicCache and a block mask).
   Later EAGLE steps are not compared: SpecForge's training TTT feeds the
   pre-norm output to the next step whatever norm_output says (its
   norm_output only decides whether compute_logits applies the final norm,
   default true), while SGLang and our chain feed norm(out) with
   norm_output; the first step is the same in both.

Numbers: logits_rel_err = max|a - b| / max|b| over every compared logit of a
path (b ours, a SpecForge's), the worst path; each path also reports the
Frobenius-norm relative error ||a - b|| / ||b||. argmax_agree = the share of
rows whose argmax agrees, the worst path; an argmax that differs only where
our own top two logits lie within twice that row's largest difference (a
near tie) is counted, but does not fail the check. Pass: no unexpected and
no mismatched key, no missing key outside the frozen-target set,
warm_start_draft_model and from_pretrained accepting the folder with the
same tensors, SpecForge reading the same block size / mask token / layer
ids / vocab map, every path at logits_rel_err <= --tolerance (1e-3) and no
argmax differing outside a near tie.

Keys expected to be missing (the frozen-target set)
---------------------------------------------------
* EAGLE-3 / EAGLE-3.1: "embed_tokens.weight". The draft reads the TARGET's
  input embedding, frozen: the C++ student holds it as a buffer it never
  trains and draft_export.cc writes only trained tensors (plus d2t/t2d).
  SpecForge itself expects this: build_eagle3_draft warm-starts with
  allow_missing_embedding=True, then load_embedding(target) and
  freeze_embedding(). It is filled here from the dump's embed_tokens (the
  target's). (SpecForge's own to_hf export does ship it; a user who calls
  AutoDraftModel.from_pretrained on our export alone for inference gets a
  randomly initialised embedding, a warning SpecForge's from_pretrained
  filters out; they must load the target's embedding, as its trainer does.)
* DFlash: none. DFlashDraftModel owns no embedding or head: spec_generate
  embeds the block with target.model.embed_tokens and reads
  target.lm_head, as SGLang's and vLLM's DFlash loaders do (the export
  holds fc, hidden_norm, layers.N.*, norm). Those two target tensors come
  from the dump (embed_tokens, target_lm_head) and are listed under
  "frozen_target_outside_model".
Non-persistent buffers (rotary inv_freq, cos/sin caches) are not part of a
state dict and never show up.

Inputs
------
--draft DIR: our trainer's export (config.json, model.safetensors).
--eval_dump FILE: the student's eval dump (student.eval_dump), as
tools/acceptance_crosscheck.py reads it: input_ids, cu_seqlens,
prompt_lengths, aux_hidden, embed_tokens, and for DFlash target_lm_head.
--target_dir DIR (optional): the target model folder; embed_tokens and the
lm_head (tied or lm_head.weight) are read from it instead, for a dump
trimmed to its tokens and aux states (eval.compact.safetensors, which
tools/specforge_load_check.sh writes after checking that the bundled
model holds exactly the dump's tensors): the full dumps hold the target's
embedding and head (8 MiB each for the tiny model), too much to carry to
a GPU machine next to the 53 MiB tree under its 64 MiB limit.

Run
---
Produce a DFlash and an EAGLE-3.1 export with their dumps on the CPU with
the built binaries and the bundled tiny model:

    tools/specforge_load_check.sh .baseline/loadcheck

then, where SpecForge's requirements are installed (torch 2.x, transformers 5):

    PYTHONPATH=.baseline/specforge python3 tools/specforge_load_check.py \\
        --draft=.baseline/loadcheck/dflash/export \\
        --eval_dump=.baseline/loadcheck/dflash/eval.safetensors
    PYTHONPATH=.baseline/specforge python3 tools/specforge_load_check.py \\
        --draft=.baseline/loadcheck/eagle31/export \\
        --eval_dump=.baseline/loadcheck/eagle31/eval.safetensors

or, with the compact dumps (what fits a device run's carry):

    PYTHONPATH=.baseline/specforge python3 tools/specforge_load_check.py \\
        --draft=.baseline/loadcheck/dflash/export \\
        --eval_dump=.baseline/loadcheck/dflash/eval.compact.safetensors \\
        --target_dir=examples/tiny-code-llama --samples=2

Without SpecForge, --ours_only runs steps that need only torch (1.13 or
later): reading the export and the dump and our logits, with their
self-consistency against acceptance_crosscheck.py's proposals.

Exit codes: 0 pass, 1 the check failed, 2 bad input or SpecForge could not
be imported or run. The last stdout line is one JSON object:
{"check": "specforge_load", "kind", "missing", "unexpected",
"logits_rel_err", "argmax_agree", "pass", ...details}.
"""
import argparse
import copy
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))

# The tensors SpecForge's class holds that our export leaves out on purpose,
# and the eval-dump tensor that fills each (see the docstring).
FROZEN_TARGET = {
    "eagle": {"embed_tokens.weight": "embed_tokens"},
    "dflash": {},
}
DEFAULT_PATHS = {"eagle": ["sdpa", "flex_attention"], "dflash": ["sdpa", "eager"]}


# The target's tensors a dump carries for the draft, and their names in a
# Hugging Face checkpoint of the target (an lm_head tied to the embedding,
# or absent, is the embedding).
TARGET_TENSORS = {"embed_tokens": "model.embed_tokens.weight", "target_lm_head": "lm_head.weight"}


def read_target_tensors(ac, target_dir, names):
    """{dump name: fp32 tensor} of `names` (TARGET_TENSORS keys) read from the
    target model's safetensors (single file or sharded with an index)."""
    import torch
    with open(os.path.join(target_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    config = config.get("text_config", config)
    index = os.path.join(target_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
    else:
        weight_map = None  # one model.safetensors
    out = {}
    for name in names:
        key = TARGET_TENSORS[name]
        if name == "target_lm_head" and (config.get("tie_word_embeddings") or
                                         (weight_map is not None and key not in weight_map)):
            key = TARGET_TENSORS["embed_tokens"]
        shard = weight_map.get(key) if weight_map is not None else "model.safetensors"
        if shard is None:
            raise ac.FormatError(f"{target_dir}: no tensor {key!r}")
        tensors, _ = ac.read_safetensors(os.path.join(target_dir, shard), names={key})
        if key not in tensors:
            raise ac.FormatError(f"{target_dir}/{shard}: no tensor {key!r}")
        out[name] = tensors[key].to(torch.float32)
    return out


class CheckError(Exception):
    """SpecForge could not be imported or refused to run: exit 2."""


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Load an exported DFlash / EAGLE-3(.1) draft into SpecForge's draft classes "
                    "(0 missing and 0 unexpected keys outside the frozen-target set) and compare "
                    "SpecForge's logits with tools/acceptance_crosscheck.py's in fp32.")
    p.add_argument("--draft", required=True, help="export folder (config.json, model.safetensors)")
    p.add_argument("--eval_dump", required=True, help="the student's eval dump (safetensors)")
    p.add_argument("--target_dir", default=None,
                   help="the target model folder (HF safetensors): take embed_tokens and the lm_head from "
                        "it instead of the dump (for a dump trimmed to its tokens and aux states, which "
                        "tools/specforge_load_check.sh writes as eval.compact.safetensors)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--samples", type=int, default=1, help="dump samples to compare (default 1: the first)")
    p.add_argument("--max_rounds", type=int, default=16,
                   help="DFlash: rounds (anchor rows) per sample, spread from the prompt's end (default 16)")
    p.add_argument("--paths", default=None,
                   help="comma-separated backends to run SpecForge with (DFlash: sdpa,eager; "
                        "EAGLE: sdpa,flex_attention; default: both of the kind)")
    p.add_argument("--tolerance", type=float, default=1e-3,
                   help="largest max|a-b|/max|b| of the logits (default 1e-3)")
    p.add_argument("--no_compile", action="store_true",
                   help="set TORCHDYNAMO_DISABLE=1 (SpecForge's EAGLE code wraps rope and RMSNorm in "
                        "torch.compile); use where inductor cannot build")
    p.add_argument("--skip_from_pretrained", action="store_true",
                   help="skip warm_start_draft_model and AutoDraftModel.from_pretrained (step 3)")
    p.add_argument("--ours_only", action="store_true",
                   help="only our side (no SpecForge): read the inputs, compute our logits, check them "
                        "against acceptance_crosscheck.py's own proposals")
    p.add_argument("--json_out", help="also write the JSON report here")
    args = p.parse_args(argv)
    if args.samples < 1 or args.max_rounds < 1:
        p.error("--samples and --max_rounds must be >= 1")
    return args


# --- our side: tools/acceptance_crosscheck.py ---------------------------------


class Ours:
    """The inputs and our reference logits, from acceptance_crosscheck.py's
    classes (no SpecForge, no transformers)."""

    def __init__(self, ac, torch, args, device):
        self.ac, self.torch = ac, torch
        self.config = ac.read_draft_config(args.draft)
        self.kind = "dflash" if ac.is_dflash(self.config) else "eagle"
        self.label = ("dflash" if self.kind == "dflash" else
                      "eagle3.1" if self.config.get("fc_norm") or self.config.get("norm_output")
                      else "eagle3")
        self.weights_path = os.path.join(args.draft, "model.safetensors")
        names = ac.dump_tensor_names(self.config)
        if args.target_dir:
            target = [n for n in TARGET_TENSORS if n in names]
            self.dump, self.meta = ac.load_eval_dump(args.eval_dump, [n for n in names if n not in target])
            self.dump.update(read_target_tensors(ac, args.target_dir, target))
            self.target_source = f"target_dir {args.target_dir}"
        else:
            self.dump, self.meta = ac.load_eval_dump(args.eval_dump, names)
            self.target_source = f"eval dump {args.eval_dump}"
        self.draft = ac.load_draft(args.draft, self.config, self.dump, device, torch.float32)
        self.samples = ac.split_samples(self.draft, self.dump, args.eval_dump)[: args.samples]
        self.export, _ = ac.read_safetensors(self.weights_path)
        cu = [int(x) for x in self.dump["cu_seqlens"].reshape(-1)]
        self.spans = list(zip(cu, cu[1:]))[: args.samples]
        self.device, self.args = device, args

    def sample_aux(self, b):
        begin, end = self.spans[b]
        return self.dump["aux_hidden"][begin:end].to(self.device, self.torch.float32)

    def sample_tokens(self, b):
        return self.samples[b][0].tokens

    # EAGLE: every row's first draft step ------------------------------------

    def eagle_logits(self, b):
        """[n-1, draft_vocab]: row t = lm_head(norm(o_t)), o_t the pre-norm
        midlayer output of row t over rows 0..t (full_forward, the
        crosscheck's cache-free reference)."""
        ac, d = self.ac, self.draft
        rows, _ = self.samples[b]
        n = len(rows.tokens)
        out = ac.full_forward(d, *rows.slice(0, n - 1))
        return ac.rms_norm(out, d.w["norm.weight"], d.cfg.rms_norm_eps) @ d.w["lm_head.weight"].T

    def eagle_selfcheck(self, b, logits):
        """The argmax of the prompt's last row, mapped through d2t, is the
        first token the crosscheck's KV-cache drafter proposes."""
        rows, p = self.samples[b]
        drafter = self.ac.IncrementalDrafter(self.draft, rows, 1)
        drafter.start(p)
        first = drafter.propose(p - 1, 1)[0]
        i = int(logits[p - 1].argmax())
        return first == i + self.draft.d2t[i]

    # DFlash: block rounds ---------------------------------------------------

    def dflash_rounds(self, b):
        rows, p = self.samples[b]
        n = len(rows.tokens)
        last = n - 2  # the anchor s[t+1] must exist
        count = min(self.args.max_rounds, last - (p - 1) + 1)
        if count <= 0:
            return []
        if count == 1:
            return [p - 1]
        span = last - (p - 1)
        return sorted({p - 1 + round(i * span / (count - 1)) for i in range(count)})

    def dflash_logits(self, b, rounds):
        """[(t, logits [B-1, V], proposals)] for each round row t, through the
        crosscheck's KV-cache drafter (the serving flow): its block output
        is captured and read through the final norm and the target's head
        as its proposals() does."""
        ac, d = self.ac, self.draft
        rows, p = self.samples[b]
        B = d.cfg.block_size
        captured = {}
        original = d.proposals

        def capture(x, k):
            captured["x"] = x
            return original(x, k)

        d.proposals = capture  # instance attribute: shadows the method
        try:
            drafter = ac.DFlashIncrementalDrafter(d, rows, None)
            drafter.start(p)
            current, out = p - 1, []
            for t in rounds:
                if t > current:
                    drafter.commit(current, t - current)
                    current = t
                ys = drafter.propose(t, B - 1)
                x = captured["x"]
                logits = ac.rms_norm(x[1:B], d.w["norm.weight"], d.cfg.rms_norm_eps) @ d.lm_head.T
                out.append((t, logits, ys))
        finally:
            del d.proposals
        return out


def compare(torch, theirs, ours):
    """max|a-b|/max|b|, ||a-b||/||b||, argmax agreement (share of rows) and the
    rows whose argmax differs beyond a near tie."""
    a, b = theirs.double(), ours.double()
    diff = (a - b).abs()
    rel_max = float(diff.max() / b.abs().max())
    rel_fro = float((a - b).norm() / b.norm())
    arg_a, arg_b = a.argmax(-1), b.argmax(-1)
    agree = arg_a == arg_b
    real = []
    for r in (~agree).nonzero().flatten().tolist():
        gap = float(b[r, arg_b[r]] - b[r, arg_a[r]])
        if gap > 2 * float(diff[r].max()):
            real.append(r)
    return {"rel_err_max": rel_max, "rel_err_fro": rel_fro,
            "argmax_agree": float(agree.double().mean()), "rows": int(b.shape[0]),
            "argmax_differs_beyond_tie": len(real)}


# --- SpecForge's side -----------------------------------------------------------


class SpecForge:
    """SpecForge's registry, loaders and draft classes (its public API, called
    as its trainer and spec_generate call them)."""

    def __init__(self, torch):
        self.torch = torch
        try:
            import specforge.modeling.draft  # noqa: F401  (registers the draft classes)
            from specforge.modeling.auto import AutoDraftModel
            from specforge.training import model_loading
            from specforge.utils import padding
            from transformers import DynamicCache
        except Exception as e:  # ImportError, or a transformers API SpecForge expects
            raise CheckError(
                f"cannot import SpecForge: {type(e).__name__}: {e}\n"
                "run with PYTHONPATH=<SpecForge checkout, e.g. .baseline/specforge> where its "
                "requirements are installed (torch 2.x, transformers 5), or pass --ours_only") from e
        import specforge
        import transformers
        self.AutoDraftModel, self.model_loading = AutoDraftModel, model_loading
        self.padding, self.DynamicCache = padding, DynamicCache
        self.where = os.path.dirname(os.path.dirname(os.path.abspath(specforge.__file__)))
        version = os.path.join(self.where, "version.txt")
        self.version = open(version).read().strip() if os.path.exists(version) else None
        self.transformers_version = transformers.__version__

    def config(self, draft_dir):
        return self.model_loading.load_draft_config_source(draft_dir)

    def build(self, kind, config, backend):
        """A fresh fp32 model, as build_eagle3_draft / build_dflash_draft make it."""
        torch = self.torch
        if kind == "eagle":
            return self.AutoDraftModel.from_config(config, attention_backend=backend,
                                                   torch_dtype=torch.float32)
        config = copy.deepcopy(config)
        config._attn_implementation = backend
        return self.AutoDraftModel.from_config(config, torch_dtype=torch.float32)


def persistent_state(model):
    return {k: v for k, v in model.state_dict().items()}


def load_export(sf, ours, config, backend):
    """Step 1: SpecForge's class from the config, the export's tensors through
    load_state_dict(strict=False). Returns (model, report)."""
    torch = sf.torch
    model = sf.build(ours.kind, config, backend)
    expected = persistent_state(model)
    mismatched = sorted(f"{k}: file {list(t.shape)}, class {list(expected[k].shape)}"
                        for k, t in ours.export.items()
                        if k in expected and list(t.shape) != list(expected[k].shape))
    bad = {m.split(":")[0] for m in mismatched}
    result = model.load_state_dict({k: t for k, t in ours.export.items() if k not in bad}, strict=False)
    missing, unexpected = sorted(result.missing_keys), sorted(result.unexpected_keys)
    frozen = FROZEN_TARGET[ours.kind]
    filled = {}
    with torch.no_grad():
        for key in missing:
            if key in frozen:
                src = ours.dump[frozen[key]]
                param = model.state_dict()[key]
                if list(src.shape) != list(param.shape):
                    raise ours.ac.FormatError(f"dump {frozen[key]}: {list(src.shape)}, SpecForge's {key} "
                                              f"is {list(param.shape)}")
                param.copy_(src.to(param.dtype))
                filled[key] = f"{frozen[key]} {list(src.shape)} from {ours.target_source}"
    # What was loaded is the file's values, bit for bit (in the class's dtype).
    state = model.state_dict()
    differs = sorted(k for k, t in ours.export.items()
                     if k in state and k not in bad and not torch.equal(state[k].cpu(), t.to(state[k].dtype)))
    report = {"missing": sorted(set(missing) - set(frozen)), "unexpected": unexpected,
              "mismatched": mismatched, "frozen_target_filled": filled,
              "loaded": len(ours.export) - len(unexpected) - len(bad), "loaded_not_equal": differs,
              "class": type(model).__name__}
    return model, report


def check_loaders(sf, ours, config, reference, draft_dir):
    """Step 3: warm_start_draft_model and AutoDraftModel.from_pretrained on the
    folder. Their tensors must equal step 1's (`reference`)."""
    torch = sf.torch
    frozen = set(FROZEN_TARGET[ours.kind])
    ref = persistent_state(reference)
    out = {}
    # SpecForge's warm start (model.draft_checkpoint_path = the export).
    try:
        model = sf.build(ours.kind, config, DEFAULT_PATHS[ours.kind][0])
        rep = sf.model_loading.warm_start_draft_model(
            model, draft_dir, draft_config=config,
            strategy="dflash" if ours.kind == "dflash" else "eagle3",
            allow_missing_embedding=ours.kind == "eagle")
        state = persistent_state(model)
        differs = sorted(k for k in state if k not in rep.missing_keys and k in ref
                         and not torch.equal(state[k].cpu(), ref[k].cpu()))
        out["warm_start"] = {"ok": not differs and set(rep.missing_keys) <= frozen,
                             "format": rep.checkpoint_format, "loaded_keys": rep.loaded_keys,
                             "missing": sorted(rep.missing_keys), "not_equal_to_load": differs}
    except Exception as e:
        out["warm_start"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    # The plain HF path (what the warm start runs first, whose unexpected keys
    # it does not look at).
    try:
        model, info = sf.AutoDraftModel.from_pretrained(draft_dir, config=copy.deepcopy(config),
                                                        output_loading_info=True)
        model = model.float()
        info = {k: sorted(str(x) for x in (v or [])) for k, v in dict(info).items()}
        state = persistent_state(model)
        missing = set(info.get("missing_keys", []))
        differs = sorted(k for k in state if k not in missing and k in ref
                         and not torch.equal(state[k].cpu(), ref[k].cpu()))
        out["from_pretrained"] = {
            "ok": (not info.get("unexpected_keys") and not info.get("mismatched_keys")
                   and missing <= frozen and not differs),
            "missing": sorted(missing), "unexpected": info.get("unexpected_keys", []),
            "mismatched": info.get("mismatched_keys", []), "not_equal_to_load": differs}
    except Exception as e:
        out["from_pretrained"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return out


def eagle_path(sf, ours, model, backend):
    """The first TTT step of OnlineEagle3Model over each compared sample;
    returns (SpecForge logits, our logits), rows 0..n-2 of every sample."""
    torch = sf.torch
    mine, theirs = [], []
    for b in range(len(ours.samples)):
        tokens = ours.sample_tokens(b)
        n = len(tokens)
        ids = torch.tensor(tokens, dtype=torch.long, device=ours.device)[None]
        hidden = model.project_hidden_states(ours.sample_aux(b)[None])
        positions = torch.arange(n, device=ours.device)[None]
        mask = torch.ones(1, n, dtype=torch.bool, device=ours.device)
        if backend == "flex_attention":
            cache_hidden, past, attention_mask = None, sf.DynamicCache(), mask
        else:
            cache_hidden, past = [[], []], None
            attention_mask = model.prepare_decoder_attention_mask(
                attention_mask=mask, hidden_states=hidden, batch_size=1, seq_length=n,
                past_key_values_length=0)
        embeds = model.embed_input_ids(sf.padding(ids, left=False)).to(hidden.dtype)
        out = model.backbone(input_embeds=embeds, hidden_states=hidden, cache_hidden=cache_hidden,
                             attention_mask=attention_mask, position_ids=positions,
                             past_key_values=past, use_cache=True)
        theirs.append(model.compute_logits(out)[0, : n - 1].float())
        mine.append(ours.eagle_logits(b))
    return torch.cat(theirs), torch.cat(mine), {}


def dflash_path(sf, ours, model, backend):
    """DFlashDraftModel.spec_generate's draft call for each round, from a
    fresh cache; returns (SpecForge logits, our logits, extras)."""
    torch = sf.torch
    d = ours.draft
    B = model.block_size
    embed = torch.nn.Embedding.from_pretrained(ours.dump["embed_tokens"].to(ours.device, torch.float32))
    head = torch.nn.Linear(d.cfg.hidden_size, d.cfg.vocab_size, bias=False).to(ours.device)
    with torch.no_grad():
        head.weight.copy_(ours.dump["target_lm_head"].to(ours.device, torch.float32))

    class Target:  # what _sample_draft_tokens reads of the target
        lm_head = head

    mine, theirs, tokens_agree, total = [], [], 0, 0
    for b in range(len(ours.samples)):
        tokens = ours.sample_tokens(b)
        aux = ours.sample_aux(b)
        for t, logits, ys in ours.dflash_logits(b, ours.dflash_rounds(b)):
            block_ids = torch.tensor([[tokens[t + 1]] + [model.mask_token_id] * (B - 1)],
                                     dtype=torch.long, device=ours.device)
            draft_hidden = model(target_hidden=aux[None, : t + 1], noise_embedding=embed(block_ids),
                                 position_ids=torch.arange(t + 1 + B, device=ours.device)[None],
                                 past_key_values=sf.DynamicCache(), use_cache=True, is_causal=False)
            theirs.append(head(draft_hidden[:, -B + 1:, :])[0].float())
            mine.append(logits)
            proposed = model._sample_draft_tokens(Target, draft_hidden, block_ids)[0].tolist()
            tokens_agree += sum(int(x == y) for x, y in zip(proposed, ys))
            total += B - 1
    return torch.cat(theirs), torch.cat(mine), {"proposals_agree": tokens_agree / max(total, 1)}


def config_agreement(ours, model):
    """What SpecForge read from config.json that our side reads too."""
    cfg = ours.draft.cfg
    problems = []
    if ours.kind == "dflash":
        for name, theirs, mine in (("block_size", model.block_size, cfg.block_size),
                                   ("mask_token_id", model.mask_token_id, cfg.mask_token_id),
                                   ("target_layer_ids", list(model.target_layer_ids), cfg.target_layer_ids)):
            if theirs != mine:
                problems.append(f"{name}: SpecForge {theirs!r}, ours {mine!r}")
    else:
        fc_norm = model.fc_norm is not None
        if fc_norm != cfg.fc_norm:
            problems.append(f"fc_norm: SpecForge {fc_norm}, ours {cfg.fc_norm}")
        # SpecForge's norm_output gates the final norm in compute_logits
        # (default true); the first step's logits need it on.
        if not model.norm_output:
            problems.append("norm_output: SpecForge's compute_logits would skip the final norm")
        if model.d2t.cpu().tolist() != ours.draft.d2t:
            problems.append("d2t: SpecForge's buffer differs from the export's")
    return problems


def run_specforge(sf, ours, args, report):
    torch = sf.torch
    config = sf.config(args.draft)
    paths = args.paths.split(",") if args.paths else DEFAULT_PATHS[ours.kind]
    reference, load = load_export(sf, ours, config, paths[0])
    report.update({"missing": load["missing"], "unexpected": load["unexpected"]})
    report["load"] = load
    if ours.kind == "dflash":
        report["frozen_target_outside_model"] = {
            "embed_tokens": f"the block's rows (spec_generate: target.model.embed_tokens), from {ours.target_source}",
            "lm_head": f"the logits (_sample_draft_tokens: target.lm_head), from {ours.target_source}"}
    if not args.skip_from_pretrained:
        report["loaders"] = check_loaders(sf, ours, config, reference, args.draft)
    report["config_problems"] = config_agreement(ours, reference)
    report["paths"] = {}
    state = persistent_state(reference)
    for backend in paths:
        try:
            model = reference if backend == paths[0] else sf.build(ours.kind, config, backend)
            if model is not reference:
                model.load_state_dict(state, strict=True)
            model = model.to(ours.device).float().eval()
            run = eagle_path if ours.kind == "eagle" else dflash_path
            with torch.no_grad():
                theirs, mine, extra = run(sf, ours, model, backend)
            report["paths"][backend] = dict(compare(torch, theirs, mine), **extra)
        except Exception as e:
            report["paths"][backend] = {"error": f"{type(e).__name__}: {e}",
                                        "traceback": traceback.format_exc(limit=6)}


def verdict(report, tolerance):
    reasons = []
    load = report.get("load", {})
    for field in ("missing", "unexpected"):
        if report.get(field):
            reasons.append(f"{field} keys: {report[field]}")
    if load.get("mismatched"):
        reasons.append(f"mismatched shapes: {load['mismatched']}")
    if load.get("loaded_not_equal"):
        reasons.append(f"loaded tensors differ from the file: {load['loaded_not_equal']}")
    for name, loader in (report.get("loaders") or {}).items():
        if not loader.get("ok"):
            reasons.append(f"{name}: {loader.get('error') or json.dumps(loader, sort_keys=True)}")
    reasons += [f"config: {p}" for p in report.get("config_problems", [])]
    rel, agree = [], []
    for name, path in report.get("paths", {}).items():
        if "error" in path:
            reasons.append(f"path {name}: {path['error']}")
            continue
        rel.append(path["rel_err_max"])
        agree.append(path["argmax_agree"])
        if not path["rel_err_max"] <= tolerance:  # NaN fails too
            reasons.append(f"path {name}: logits rel err {path['rel_err_max']:.3g} > {tolerance}")
        if path["argmax_differs_beyond_tie"]:
            reasons.append(f"path {name}: {path['argmax_differs_beyond_tie']} rows' argmax differs "
                           "beyond a near tie")
    if not report.get("paths"):
        reasons.append("no logits path ran")
    report["logits_rel_err"] = max(rel) if rel else None
    report["argmax_agree"] = min(agree) if agree else None
    report["pass"] = not reasons
    report["fail_reasons"] = reasons


def main(argv=None):
    args = parse_args(argv)
    if args.no_compile:
        os.environ["TORCHDYNAMO_DISABLE"] = "1"  # read when torch is imported
    import torch
    sys.path.insert(0, HERE)
    import acceptance_crosscheck as ac

    torch.set_grad_enabled(False)
    # fp32 means fp32: no TF32 in matmuls on the GPU.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    start = time.time()
    report = {"check": "specforge_load", "kind": None, "missing": None, "unexpected": None,
              "logits_rel_err": None, "argmax_agree": None, "pass": False}
    code = 1
    try:
        ours = Ours(ac, torch, args, device)
        report["kind"] = ours.label
        report.update(architecture=ours.config["architectures"][0], draft=args.draft,
                      eval_dump=args.eval_dump, samples=len(ours.samples), device=str(device),
                      dtype="float32", torch=torch.__version__,
                      rel_err_definition="max|specforge - ours| / max|ours| over all compared logits "
                                         "(worst path); rel_err_fro per path = ||a-b||_F / ||b||_F")
        if args.ours_only:
            report["ours"] = ours_only(ours, torch)
            report["pass"] = all(v["selfcheck"] for v in report["ours"].values())
            code = 0 if report["pass"] else 1
        else:
            sf = SpecForge(torch)
            report.update(specforge=sf.where, specforge_version=sf.version,
                          transformers=sf.transformers_version)
            run_specforge(sf, ours, args, report)
            verdict(report, args.tolerance)
            code = 0 if report["pass"] else 1
    except (ac.FormatError, OSError, CheckError) as e:
        print(f"error: {e}", file=sys.stderr)
        report["error"] = str(e)
        code = 2
    except Exception as e:  # SpecForge refused to build or load: name it
        traceback.print_exc()
        report["error"] = f"{type(e).__name__}: {e}"
        code = 2
    report["seconds"] = round(time.time() - start, 3)
    print_summary(report)
    line = json.dumps(report, sort_keys=False)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            f.write(json.dumps(report, indent=2) + "\n")
    print(line)
    return code


def ours_only(ours, torch):
    """Our logits per sample, checked against the crosscheck's own proposals."""
    out = {}
    for b in range(len(ours.samples)):
        if ours.kind == "eagle":
            logits = ours.eagle_logits(b)
            out[str(b)] = {"rows": int(logits.shape[0]), "vocab": int(logits.shape[1]),
                           "selfcheck": ours.eagle_selfcheck(b, logits)}
        else:
            rounds = ours.dflash_logits(b, ours.dflash_rounds(b))
            ok = all(logits.argmax(-1).tolist() == ys[: logits.shape[0]] for _, logits, ys in rounds)
            out[str(b)] = {"rounds": [t for t, _, _ in rounds],
                           "vocab": int(rounds[0][1].shape[1]) if rounds else 0,
                           "selfcheck": ok and bool(rounds)}
    return out


def print_summary(report):
    if report.get("paths"):
        for name, path in report["paths"].items():
            if "error" in path:
                print(f"path {name}: ERROR {path['error']}\n{path.get('traceback', '')}")
            else:
                print(f"path {name}: rel err max {path['rel_err_max']:.3g}, fro {path['rel_err_fro']:.3g}, "
                      f"argmax agree {path['argmax_agree']:.4f} over {path['rows']} rows")
    for reason in report.get("fail_reasons", []):
        print(f"FAIL: {reason}")


if __name__ == "__main__":
    sys.exit(main())
