#!/usr/bin/env python3
"""Expected encodings for the tokenizer paths the bundled model does not use.

The bundled tiny-code-llama has GPT-2's ByteLevel regex and no normalizer.
This takes its vocab and merges and swaps in the other supported pieces
(Llama 3 / Qwen2 Split regexes, ignore_merges, add_prefix_space, NFC,
added tokens with lstrip/rstrip/single_word), then encodes tricky strings
with HF `tokenizers`. Run where `tokenizers` is installed (the GPU machine):

    python3 tests/golden/make_tokenizer_variants.py \
        examples/tiny-code-llama/tokenizer.json tests/fixtures/tokenizer_variants.jsonl

Writes one {"variant", "overrides"} line per variant (the C++ test applies
the same overrides to the same tokenizer.json), then one {"variant", "text",
"ids", "offsets", "decoded", "decoded_skip"} line per (variant, text);
offsets are HF's, converted from characters to UTF-8 bytes.
"""
import copy
import json
import sys

import tokenizers

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def split_then_byte_level(pattern, add_prefix_space=False):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": False,
         "use_regex": False}]}


VARIANTS = {
    "gpt2": {},
    "gpt2_prefix_space": {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True,
                                            "trim_offsets": True, "use_regex": True}},
    "llama3": {"pre_tokenizer": split_then_byte_level(LLAMA3), "ignore_merges": True},
    "llama3_merges": {"pre_tokenizer": split_then_byte_level(LLAMA3), "ignore_merges": False},
    "llama3_prefix_space": {"pre_tokenizer": split_then_byte_level(LLAMA3, True)},
    "qwen2_nfc": {"pre_tokenizer": split_then_byte_level(QWEN2), "normalizer": {"type": "NFC"}},
    "added_tokens": {"extra_added_tokens": [
        {"id": 8192, "content": "[M]", "single_word": False, "lstrip": True, "rstrip": True,
         "normalized": False, "special": True},
        {"id": 8193, "content": "go", "single_word": True, "lstrip": False, "rstrip": False,
         "normalized": True, "special": False},
        {"id": 8194, "content": "<|eot_id|>x", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": False},
        {"id": 8195, "content": "caf\u00e9", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": True, "special": False},
    ], "normalizer": {"type": "NFC"}},
}

TEXTS = [
    "hello world",
    "  leading spaces and trailing   ",
    "def f(x):\n    return x**2\n\n\n",
    "tabs\tand\r\nwindows newlines\t\t mixed  \t",
    "contractions: don't I'M they'Re WE'VE you'll HE'D it's it'\u017f 's'S'",
    "numbers 1234567 3.14159265358979 0x1F x\u00b2 \u00bd \u216b \u0663\u0664 12,345",
    "unicode spaces:\u3000x\u00a0y\u2028z\u0085w\u2009v \u200bu",
    "foo.\n\nbar \n  baz\r\n\r\n  qux !!!\n\n x",
    "$hello \tword _x 'hello' (a)[b]{c}",
    "nfc: e\u0301 cafe\u0301 \u212b \u1100\u1161\u11a8 a\u0323\u0307 \u0958 \u00e9\u0301",
    "emoji \U0001F600\U0001F44D\U0001F3FD family \U0001F468\u200d\U0001F469\u200d\U0001F467",
    "\u0417\u0434\u0440\u0430\u0432\u0441\u0442\u0432\u0443\u0439 \u4f60\u597d\u4e16\u754c "
    "\u3053\u3093\u306b\u3061\u306f \uc548\ub155 \u0645\u0631\u062d\u0628\u0627",
    "for (int i = 0; i < n; ++i) {\n\tx += y[i];\n}\n",
    "specials <|eot_id|>hello<|eot_id|> world<|eot_id|>x <|start_header_id|>",
    "a  [M]  b [M]c go ago go_ gone (go) caf\u00e9 cafe\u0301",
    "\n",
    " ",
    "   ",
    "",
    "a",
]


def build(base, overrides):
    tok = copy.deepcopy(base)
    if "pre_tokenizer" in overrides:
        tok["pre_tokenizer"] = overrides["pre_tokenizer"]
    if "normalizer" in overrides:
        tok["normalizer"] = overrides["normalizer"]
    if "ignore_merges" in overrides:
        tok["model"]["ignore_merges"] = overrides["ignore_merges"]
    tok["added_tokens"] = tok["added_tokens"] + overrides.get("extra_added_tokens", [])
    return tokenizers.Tokenizer.from_str(json.dumps(tok))


def byte_offsets(text, offsets):
    pos = [0]
    for ch in text:
        pos.append(pos[-1] + len(ch.encode("utf-8")))
    return [[pos[b], pos[e]] for b, e in offsets]


def main():
    base_path, out_path = sys.argv[1:3]
    base = json.load(open(base_path))
    with open(out_path, "w") as f:
        for name, overrides in VARIANTS.items():
            f.write(json.dumps({"variant": name, "overrides": overrides}) + "\n")
            tok = build(base, overrides)
            for text in TEXTS:
                enc = tok.encode(text, add_special_tokens=False)
                f.write(json.dumps({
                    "variant": name, "text": text, "ids": enc.ids,
                    "offsets": byte_offsets(text, enc.offsets),
                    "decoded": tok.decode(enc.ids, skip_special_tokens=False),
                    "decoded_skip": tok.decode(enc.ids, skip_special_tokens=True),
                }) + "\n")
    print(f"tokenizers {tokenizers.__version__}: wrote {len(VARIANTS)} variants x {len(TEXTS)} texts")


if __name__ == "__main__":
    main()
