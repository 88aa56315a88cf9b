#!/usr/bin/env python3
"""Tokenizer families against HF `tokenizers` (issue 29).

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
and decoded text, the first lines in full, and HF's encode time. Run on
the GPU machine:

    python3 tests/golden/make_tokenizer_families.py
    python3 tests/golden/make_tokenizer_families.py --time_only   # HF's speed alone
    # A larger corpus, not committed: tokenizer_families_test reads it
    # from E3_TOKENIZER_FAMILIES_DIR.
    python3 tests/golden/make_tokenizer_families.py --chars=8000000 --out=/tmp/families
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
    lines = corpus(chars)
    with gzip.open(os.path.join(OUT, "corpus.jsonl.gz"), "wt", encoding="utf-8", compresslevel=9) as f:
        for t in lines:
            f.write(json.dumps(t, ensure_ascii=False) + "\n")
    chars = sum(map(len, lines))
    expected = {"comment": "Made by tests/golden/make_tokenizer_families.py; do not edit.",
                "tokenizers": tokenizers.__version__, "lines": len(lines), "chars": chars, "chunk": CHUNK,
                "families": {}}
    for name, spec in families(lines[::7]).items():
        text = json.dumps(spec, ensure_ascii=False)
        tok = tokenizers.Tokenizer.from_str(text)
        with gzip.open(os.path.join(OUT, f"{name}.json.gz"), "wt", encoding="utf-8", compresslevel=9) as f:
            f.write(text)
        expected["families"][name] = expectations(tok, lines)
        e = expected["families"][name]
        print(f"{name}: {e['tokens']} tokens, HF encode {chars / e['hf_encode_seconds'] / 1e6:.2f} M chars/s")
    with gzip.open(os.path.join(OUT, "expected.json.gz"), "wt", encoding="utf-8", compresslevel=9) as f:
        json.dump(expected, f, ensure_ascii=False, separators=(",", ":"))
    print(f"tokenizers {tokenizers.__version__}: {len(lines)} lines, {chars} chars")


if __name__ == "__main__":
    main()
