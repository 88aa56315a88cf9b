#!/usr/bin/env python3
"""Tokenizer families against HF `tokenizers`.

Real tokenizer.json files of these families are megabytes, so this builds
equivalent ones with the `tokenizers` library itself: the same pipeline
(normalizer, pre-tokenizer, model flags, decoder) as each family's
published file, with a small vocab trained here:
- llama2: SentencePiece BPE as Llama 2 / Mistral v0.1 write it (Prepend +
  Replace normalizer, no pre-tokenizer, byte_fallback, fuse_unk, the
  Replace/ByteFallback/Fuse/Strip decoder);
- metaspace_first: the newer conversion (Metaspace pre-tokenizer with
  prepend_scheme "first", no split; Metaspace decoder);
- metaspace_split: Metaspace with prepend "always" and split;
- gemma: Replace(" ", "\u2581") normalizer, no pre-tokenizer, byte_fallback;
- deepseek_v3: byte-level BPE behind DeepSeek-V3's three Split regexes;
- gpt_oss: byte-level BPE behind the o200k Split regex;
- cl100k: byte-level BPE behind tiktoken's cl100k_base regex as tiktoken
  writes it, possessive quantifiers included (Phi-4's tokenizer is
  cl100k-based);
- tekken: byte-level BPE behind Mistral's Tekken regex (o200k's letter
  classes, single digits, no contractions), with ignore_merges.
Then encodes a corpus of about a million characters (prose, this
repository's own source code, CJK, emoji, whitespace runs, combining
marks, the tricky strings of make_tokenizer_variants.py) and records, per
100 lines, the token count and hashes of the ids, offsets (UTF-8 bytes)
and decoded text, the first lines in full, and HF's encode time.

Each family also carries the post_processor its published tokenizer.json
has (POST_PROCESSORS), and the expectations record HF's
encode(text, add_special_tokens=True) for it ("special"): the first lines
and a few pairs in full, every line by hashes per SPECIAL_CHUNK lines.
VARIANTS put the other post-processor types (GPT-2's trimming ByteLevel,
BertProcessing, RobertaProcessing, a multi-id template, a Sequence with the
trim last) on a family's file, with the same records. Run on the GPU
machine:

    python3 tests/golden/make_tokenizer_families.py
    python3 tests/golden/make_tokenizer_families.py --time_only   # HF's speed alone
    # A larger corpus, not committed: tokenizer_families_test reads it
    # from E3_TOKENIZER_FAMILIES_DIR.
    python3 tests/golden/make_tokenizer_families.py --chars=8000000 --out=/tmp/families
    # Post-processors and their expectations on the committed files and
    # corpus (same vocab, same corpus), written to --out:
    python3 tests/golden/make_tokenizer_families.py --post_processors_only --out=/tmp/pp
"""
import gzip
import json
import os
import random
import sys
import time

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers, Regex

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizers")
SP = "\u2581"
CHUNK = 100
FULL_LINES = 40
SPECIAL_CHUNK = 1000
SPECIAL_FULL_LINES = 12
SPECIAL_PAIRS = 8

DEEPSEEK_V3 = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
]
O200K = (r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"""
         r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"""
         r"""\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

CL100K = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
TEKKEN = (r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"""
          r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"""
          r"""\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

FAMILIES = ("llama2", "metaspace_first", "metaspace_split", "gemma", "deepseek_v3", "gpt_oss", "cl100k", "tekken")
SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]


def source_lines(limit):
    """This repository's own C++ and Python source, line by line (real code:
    indentation runs, operators, comments), in a fixed order."""
    lines, total = [], 0
    for folder in ("common", "teacher_server", "student_trainer", "tools", "bench"):
        for base, dirs, files in sorted(os.walk(os.path.join(ROOT, folder))):
            dirs.sort()
            for name in sorted(files):
                if not name.endswith((".cc", ".h", ".py", ".cu")):
                    continue
                for line in open(os.path.join(base, name), encoding="utf-8", errors="replace"):
                    lines.append(line.rstrip("\n"))
                    total += len(lines[-1])
                    if total >= limit:
                        return lines
    return lines


def corpus(chars):
    """`chars` characters of mixed text, the same every run: conversations
    (up to 70%), source code (up to 15% more), then random mixtures."""
    rng = random.Random(29)
    lines = []
    sys.path.insert(0, HERE)
    from make_tokenizer_variants import TEXTS
    lines += [t for t in TEXTS if t]
    data = os.path.join(ROOT, "examples", "data", "train_conversations.jsonl")
    for raw in open(data, encoding="utf-8"):
        for turn in json.loads(raw)["conversations"]:
            lines.append(turn.get("content") or turn.get("value") or "")
        if sum(map(len, lines)) > 0.7 * chars:
            break
    lines += source_lines(0.15 * chars)
    pools = {
        "cjk": [chr(c) for c in range(0x4E00, 0x4E00 + 400)] + [chr(c) for c in range(0x3041, 0x3097)],
        "hangul": [chr(c) for c in range(0xAC00, 0xAC00 + 200)],
        "emoji": ["\U0001F600", "\U0001F44D\U0001F3FD", "\U0001F468\u200d\U0001F469\u200d\U0001F467", "\u2764\ufe0f",
                  "\U0001F680", "\U0001F1EB\U0001F1F7"],
        "space": [" ", "  ", "\t", "\n", "\r\n", "\u3000", "\u00a0", "    ", "\n\n"],
        "latin": ["caf\u00e9", "cafe\u0301", "na\u00efve", "\u00c5ngstr\u00f6m", "stra\u00dfe", "\u0130stanbul",
                  "don't", "I'M", "they'RE", "x\u00b2", "\u00bd"],
        "cyrillic": ["\u041f\u0440\u0438\u0432\u0435\u0442", "\u043c\u0438\u0440", "\u0417\u0434\u0440\u0430\u0432\u0441\u0442\u0432\u0443\u0439"],
        "arabic": ["\u0645\u0631\u062d\u0628\u0627", "\u0633\u0644\u0627\u0645"],
        "digits": ["1", "12", "123", "1234567", "3.14159", "0x1F", "\u0663\u0664", "2024-07-26"],
        "code": ["def f(x):", "return x**2", "{", "}", "for (int i = 0; i < n; ++i)", "#include <vector>",
                 "=>", "!==", "::", "<|im_start|>", "<|im_end|>", "<s>", "</s>"],
    }
    kinds = list(pools)
    total = sum(map(len, lines))
    while total < chars:
        parts = []
        for _ in range(rng.randint(3, 40)):
            kind = rng.choice(kinds)
            piece = rng.choice(pools[kind])
            if kind == "cjk" or kind == "hangul":
                piece = "".join(rng.choice(pools[kind]) for _ in range(rng.randint(1, 12)))
            parts.append(piece)
            parts.append(rng.choice(pools["space"]) if rng.random() < 0.5 else "")
        lines.append("".join(parts))
        total += len(lines[-1])
    return lines


def sentencepiece_family(name, normalizer, pre, decoder, train_lines):
    model = models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    tok = tokenizers.Tokenizer(model)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SP), normalizers.Replace(" ", SP)])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="never", split=True)
    trainer = trainers.BpeTrainer(vocab_size=1500, limit_alphabet=120, special_tokens=SPECIALS[:3])
    tok.train_from_iterator(train_lines, trainer)
    spec = json.loads(tok.to_str())
    trained = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {t: i for i, t in enumerate(SPECIALS[:3])}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t, _ in trained:
        if t not in vocab:
            vocab[t] = len(vocab)
    spec["model"]["vocab"] = vocab
    spec["normalizer"] = normalizer
    spec["pre_tokenizer"] = pre
    spec["decoder"] = decoder
    return finish(spec)


def byte_level_family(splits, train_lines, ignore_merges=False):
    tok = tokenizers.Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in splits] +
        [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=SPECIALS[1:3],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_lines, trainer)
    return finish(json.loads(tok.to_str()))


def finish(spec):
    """Adds the chat specials (not normalized) and one normalized added token."""
    ids = set(spec["model"]["vocab"].values())
    added = [a for a in spec.get("added_tokens", []) if a["content"] in spec["model"]["vocab"]]
    next_id = max(ids) + 1
    for content, special in (("<|im_start|>", True), ("<|im_end|>", True), ("<think>", False)):
        added.append({"id": next_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": not special, "special": special})
        next_id += 1
    spec["added_tokens"] = added
    return spec


def families(train_lines):
    return {
        "llama2": sentencepiece_family(
            "llama2",
            {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SP},
                                                 {"type": "Replace", "pattern": {"String": " "}, "content": SP}]},
            None,
            {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": SP}, "content": " "}, {"type": "ByteFallback"},
                {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            train_lines),
        "metaspace_first": sentencepiece_family(
            "metaspace_first", None,
            {"type": "Metaspace", "replacement": SP, "prepend_scheme": "first", "split": False},
            {"type": "Metaspace", "replacement": SP, "prepend_scheme": "first", "split": False},
            train_lines),
        "metaspace_split": sentencepiece_family(
            "metaspace_split", None,
            {"type": "Metaspace", "replacement": SP, "prepend_scheme": "always", "split": True},
            {"type": "Metaspace", "replacement": SP, "prepend_scheme": "always", "split": True},
            train_lines),
        "gemma": sentencepiece_family(
            "gemma", {"type": "Replace", "pattern": {"String": " "}, "content": SP}, None,
            {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": SP}, "content": " "}, {"type": "ByteFallback"},
                {"type": "Fuse"}]},
            train_lines),
        "deepseek_v3": byte_level_family(DEEPSEEK_V3, train_lines),
        "gpt_oss": byte_level_family([O200K], train_lines),
        "cl100k": byte_level_family([CL100K], train_lines),
        "tekken": byte_level_family([TEKKEN], train_lines, ignore_merges=True),
    }


def added_id(spec, content):
    """The id of `content` as a special added token, added past every id
    when the file lacks it (Gemma's <bos>, DeepSeek-V3's BOS)."""
    for a in spec["added_tokens"]:
        if a["content"] == content:
            return a["id"]
    if content in spec["model"]["vocab"]:
        i = spec["model"]["vocab"][content]
    else:
        i = max(list(spec["model"]["vocab"].values()) + [a["id"] for a in spec["added_tokens"]]) + 1
    spec["added_tokens"].append({"id": i, "content": content, "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True})
    return i


def template(spec, single, pair, extra=None):
    """TemplateProcessing as `tokenizers` writes it: pieces are "$A"/"$B"
    (type id after ":") or a special token's content."""
    def pieces(t):
        out = []
        for p in t:
            name, _, type_id = p.partition(":")
            kind = "Sequence" if name in ("$A", "$B") else "SpecialToken"
            out.append({kind: {"id": name[1:] if kind == "Sequence" else name, "type_id": int(type_id or 0)}})
        return out
    specials = {}
    for p in single + pair:
        name = p.partition(":")[0]
        if name not in ("$A", "$B") and name not in specials:
            specials[name] = {"id": name, "ids": [added_id(spec, name)], "tokens": [name]}
    specials.update(extra or {})
    return {"type": "TemplateProcessing", "single": pieces(single), "pair": pieces(pair), "special_tokens": specials}


def byte_level_pp(add_prefix_space=True, trim_offsets=False):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": trim_offsets,
            "use_regex": True}


def bos_template(spec, bos):
    """Llama 2 / Mistral / Gemma / DeepSeek-V3: BOS before each sequence."""
    return template(spec, [bos, "$A"], [bos, "$A", bos + ":1", "$B:1"])


# Each family's published post_processor (the file's `post_processor`).
POST_PROCESSORS = {
    # Llama-2 and Mistral v0.1: "<s> $A", pair "<s> $A <s> $B".
    "llama2": lambda spec: bos_template(spec, "<s>"),
    "metaspace_first": lambda spec: bos_template(spec, "<s>"),
    "metaspace_split": lambda spec: bos_template(spec, "<s>"),
    # Gemma: the same with <bos>.
    "gemma": lambda spec: bos_template(spec, "<bos>"),
    # DeepSeek-V3: its BOS.
    "deepseek_v3": lambda spec: bos_template(spec, "<\uff5cbegin\u2581of\u2581sentence\uff5c>"),
    # transformers' TikTokenConverter (GPT-OSS's file): ByteLevel(trim_offsets=False).
    "gpt_oss": lambda spec: byte_level_pp(),
    # Llama 3's: Sequence[ByteLevel(trim_offsets=False), "<|begin_of_text|> $A"].
    "cl100k": lambda spec: {"type": "Sequence", "processors": [
        byte_level_pp(), bos_template(spec, "<|begin_of_text|>")]},
    # Mistral's Tekken files (Nemo): "<s> $A".
    "tekken": lambda spec: bos_template(spec, "<s>"),
}

# Other post-processor types, each on one family's file.
VARIANTS = {
    # GPT-2's: trims the spaces byte-level tokens carry out of the offsets.
    "gpt2_trim": ("cl100k", lambda spec: byte_level_pp(add_prefix_space=False, trim_offsets=True)),
    "trim_prefix": ("gpt_oss", lambda spec: byte_level_pp(add_prefix_space=True, trim_offsets=True)),
    "roberta": ("deepseek_v3", lambda spec: {"type": "RobertaProcessing", "sep": ["</s>", added_id(spec, "</s>")],
                                             "cls": ["<s>", added_id(spec, "<s>")], "trim_offsets": True,
                                             "add_prefix_space": True}),
    "bert": ("llama2", lambda spec: {"type": "BertProcessing", "sep": ["</s>", added_id(spec, "</s>")],
                                     "cls": ["<s>", added_id(spec, "<s>")]}),
    # A special token of two ids, and an EOS after the sequence.
    "template_multi": ("gemma", lambda spec: template(
        spec, ["[START]", "$A", "</s>"], ["[START]", "$B:1", "</s>:1", "$A"],
        {"[START]": {"id": "[START]", "ids": [added_id(spec, "<s>"), added_id(spec, "<|im_start|>")],
                     "tokens": ["<s>", "<|im_start|>"]}})),
    # The trim after the template: the specials' offsets stay (0, 0).
    "sequence_trim_last": ("tekken", lambda spec: {"type": "Sequence", "processors": [
        template(spec, ["<s>", "$A", "</s>"], ["<s>", "$A", "</s>", "$B:1", "</s>:1"]),
        byte_level_pp(add_prefix_space=False, trim_offsets=True)]}),
}


def with_post_processor(spec, make):
    spec = json.loads(json.dumps(spec))
    spec["post_processor"] = make(spec)
    return spec


def pair_byte_offsets(a, b, enc):
    """UTF-8 byte offsets of a pair's tokens in their own text; None where
    HF gives an offset past that text or no sequence ids (then only the ids
    are compared)."""
    out = []
    for (s, e), seq in zip(enc.offsets, enc.sequence_ids):
        if seq is None and (s, e) != (0, 0):
            # A Sequence post-processor leaves no sequence ids: which text an
            # offset counts in is unknown (the byte conversion would use A's).
            print("  pair tokens without sequence ids: ids only")
            return None
        text = b if seq == 1 else a
        if max(s, e) > len(text):
            print(f"  pair offsets ({s}, {e}) past a text of {len(text)} characters: ids only")
            return None
        out.append(byte_offsets(text, [(s, e)])[0])
    return out


def special_expectations(tok, lines, plain):
    """HF's encode(text, add_special_tokens=True), and with `plain` =False
    too, whose offsets a trimming post-processor changes."""
    out = {}
    for key, add in (("special", True), ("plain", False))[:2 if plain else 1]:
        chunks = []
        encodings = [tok.encode(t, add_special_tokens=add) for t in lines]
        for c in range(0, len(lines), SPECIAL_CHUNK):
            n, h_ids, h_off = 0, 0xcbf29ce484222325, 0xcbf29ce484222325
            for text, enc in zip(lines[c:c + SPECIAL_CHUNK], encodings[c:c + SPECIAL_CHUNK]):
                n += len(enc.ids)
                h_ids = fnv(",".join(map(str, enc.ids)) + ";", h_ids)
                h_off = fnv(",".join(f"{b}-{e}" for b, e in byte_offsets(text, enc.offsets)) + ";", h_off)
            chunks.append([n, f"{h_ids:016x}", f"{h_off:016x}"])
        out[key] = {"chunks": chunks, "full": [{"ids": e.ids, "offsets": byte_offsets(t, e.offsets)}
                                               for t, e in list(zip(lines, encodings))[:SPECIAL_FULL_LINES]]}
    pairs = []
    for k in range(SPECIAL_PAIRS):
        a, b = lines[2 * k], lines[2 * k + 1]
        enc = tok.encode(a, b, add_special_tokens=True)
        pairs.append({"a": 2 * k, "b": 2 * k + 1, "ids": enc.ids, "offsets": pair_byte_offsets(a, b, enc)})
    out["pairs"] = pairs
    return out


def post_processor_records(specs, lines, expected, recompute):
    """Sets each family's post_processor, records HF's output for it and
    for VARIANTS; returns the specs to write."""
    out = {}
    for name, spec in specs.items():
        spec = with_post_processor(spec, POST_PROCESSORS[name])
        tok = tokenizers.Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
        if recompute:
            expected["families"][name] = expectations(tok, lines)
        else:
            # The add_special_tokens=False records stand: only a trimming
            # ByteLevel would change them, and no family's file has one.
            assert '"trim_offsets": true' not in json.dumps(spec["post_processor"]), name
        expected["families"][name].update(special_expectations(tok, lines, plain=False))
        out[name] = spec
        print(f"{name}: post_processor {spec['post_processor']['type']}")
    expected["special_chunk"] = SPECIAL_CHUNK
    expected["variants"] = {}
    for variant, (base, make) in VARIANTS.items():
        spec = with_post_processor(out[base], make)
        tok = tokenizers.Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
        record = {"family": base, "post_processor": spec["post_processor"],
                  "added_tokens": spec["added_tokens"]}
        record.update(special_expectations(tok, lines, plain=True))
        expected["variants"][variant] = record
        print(f"variant {variant} on {base}: {spec['post_processor']['type']}")
    return out


def fnv(text, h=0xcbf29ce484222325):
    for b in text.encode("utf-8"):
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def byte_offsets(text, offsets):
    pos = [0]
    for ch in text:
        pos.append(pos[-1] + len(ch.encode("utf-8")))
    return [[pos[b], pos[e]] for b, e in offsets]


def expectations(tok, lines):
    chunks, full = [], []
    start = time.perf_counter()
    encodings = [tok.encode(t, add_special_tokens=False) for t in lines]
    seconds = time.perf_counter() - start
    for c in range(0, len(lines), CHUNK):
        n, h_ids, h_off, h_dec = 0, 0xcbf29ce484222325, 0xcbf29ce484222325, 0xcbf29ce484222325
        for text, enc in zip(lines[c:c + CHUNK], encodings[c:c + CHUNK]):
            offsets = byte_offsets(text, enc.offsets)
            n += len(enc.ids)
            h_ids = fnv(",".join(map(str, enc.ids)) + ";", h_ids)
            h_off = fnv(",".join(f"{b}-{e}" for b, e in offsets) + ";", h_off)
            h_dec = fnv(tok.decode(enc.ids, skip_special_tokens=False) + ";", h_dec)
        chunks.append([n, f"{h_ids:016x}", f"{h_off:016x}", f"{h_dec:016x}"])
    for text, enc in list(zip(lines, encodings))[:FULL_LINES]:
        full.append({"ids": enc.ids, "offsets": byte_offsets(text, enc.offsets),
                     "decoded": tok.decode(enc.ids, skip_special_tokens=False),
                     "decoded_skip": tok.decode(enc.ids, skip_special_tokens=True)})
    return {"chunks": chunks, "full": full, "hf_encode_seconds": seconds,
            "tokens": sum(len(e.ids) for e in encodings)}


def time_only():
    """HF's encode speed on the committed corpus and files, best of three,
    for the same-machine comparison in bench/README.md."""
    with gzip.open(os.path.join(OUT, "corpus.jsonl.gz"), "rt", encoding="utf-8") as f:
        lines = [json.loads(l) for l in f]
    chars = sum(map(len, lines))
    for name in FAMILIES:
        with gzip.open(os.path.join(OUT, f"{name}.json.gz"), "rt", encoding="utf-8") as f:
            tok = tokenizers.Tokenizer.from_str(f.read())
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for t in lines:
                tok.encode(t, add_special_tokens=False)
            best = min(best, time.perf_counter() - start)
        print(json.dumps({"bench": "tokenizer_encode", "family": name, "impl": "hf_tokenizers",
                          "version": tokenizers.__version__, "chars": chars, "seconds": best,
                          "m_chars_per_s": chars / best / 1e6}))


def post_processors_only():
    """Adds the post-processors and their records to the committed files
    (same vocab, same corpus, same add_special_tokens=False records)."""
    with gzip.open(os.path.join(COMMITTED, "corpus.jsonl.gz"), "rt", encoding="utf-8") as f:
        lines = [json.loads(l) for l in f]
    with gzip.open(os.path.join(COMMITTED, "expected.json.gz"), "rt", encoding="utf-8") as f:
        expected = json.load(f)
    specs = {}
    for name in FAMILIES:
        with gzip.open(os.path.join(COMMITTED, f"{name}.json.gz"), "rt", encoding="utf-8") as f:
            specs[name] = json.load(f)
    expected["tokenizers"] = tokenizers.__version__
    write(post_processor_records(specs, lines, expected, recompute=False), expected)


def write(specs, expected):
    for name, spec in specs.items():
        with gzip.open(os.path.join(OUT, f"{name}.json.gz"), "wt", encoding="utf-8", compresslevel=9) as f:
            f.write(json.dumps(spec, ensure_ascii=False))
    with gzip.open(os.path.join(OUT, "expected.json.gz"), "wt", encoding="utf-8", compresslevel=9) as f:
        json.dump(expected, f, ensure_ascii=False, separators=(",", ":"))


COMMITTED = OUT


def main():
    if "--time_only" in sys.argv:
        return time_only()
    global OUT
    chars = 1_000_000
    for arg in sys.argv[1:]:
        if arg.startswith("--chars="):
            chars = int(arg.split("=", 1)[1])
        elif arg.startswith("--out="):
            OUT = arg.split("=", 1)[1]
    os.makedirs(OUT, exist_ok=True)
    if "--post_processors_only" in sys.argv:
        return post_processors_only()
    lines = corpus(chars)
    with gzip.open(os.path.join(OUT, "corpus.jsonl.gz"), "wt", encoding="utf-8", compresslevel=9) as f:
        for t in lines:
            f.write(json.dumps(t, ensure_ascii=False) + "\n")
    chars = sum(map(len, lines))
    expected = {"comment": "Made by tests/golden/make_tokenizer_families.py; do not edit.",
                "tokenizers": tokenizers.__version__, "lines": len(lines), "chars": chars, "chunk": CHUNK,
                "families": {}}
    specs = families(lines[::7])
    specs = post_processor_records(specs, lines, expected, recompute=True)
    for name in specs:
        e = expected["families"][name]
        print(f"{name}: {e['tokens']} tokens, HF encode {chars / e['hf_encode_seconds'] / 1e6:.2f} M chars/s")
    write(specs, expected)
    print(f"tokenizers {tokenizers.__version__}: {len(lines)} lines, {chars} chars")


if __name__ == "__main__":
    main()
