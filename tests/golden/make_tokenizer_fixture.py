#!/usr/bin/env python3
"""Expected token ids for the tokenizer parity test, made with HF `tokenizers`
through transformers' apply_chat_template on the bundled tiny-code-llama.

Run on a machine with transformers (the GPU machine):
    python3 tests/golden/make_tokenizer_fixture.py examples/tiny-code-llama \
        examples/data/train_conversations.jsonl tests/fixtures/tokenizer

Writes, compactly:
  <out>_parity.tsv   one line per conversation: index, token count, FNV-1a-64
                     of the ids (as little-endian int32 bytes)
  <out>_head.jsonl   the full ids of the first 40 conversations, and of the
                     first 20 eval prompts with add_generation_prompt=True,
                     for readable diffs when the hash disagrees
  <out>_plain.jsonl  plain-text encodings (no template) of tricky strings
"""
import json
import struct
import sys

from transformers import AutoTokenizer

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3


def fnv1a64(ids):
    h = FNV_OFFSET
    for b in b"".join(struct.pack("<i", i) for i in ids):
        h ^= b
        h = (h * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def ids_of(tok, messages, gen_prompt=False):
    out = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen_prompt)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


PLAIN = [
    "hello world",
    "  leading spaces and trailing   ",
    "def f(x):\n    return x**2\n\n\n",
    "tabs\tand\r\nwindows newlines",
    "unicode: caf\u00e9 na\u00efve \u2500\u2500 \u4e2d\u6587 \U0001F600 emoji",
    "numbers 1234567 3.14159 0x1F",
    "contractions: don't I'm they're we've you'll he'd it's",
    "specials inline <|eot_id|> and <|start_header_id|>x<|end_header_id|>",
    "",
    "a",
    "\n\n\n",
]


def main():
    model_dir, data_path, out = sys.argv[1:4]
    tok = AutoTokenizer.from_pretrained(model_dir)
    convs = [json.loads(l)["conversations"] for l in open(data_path)]
    with open(out + "_parity.tsv", "w") as f:
        f.write("# index\tnum_tokens\tfnv1a64(ids as int32 LE)\n")
        for i, c in enumerate(convs):
            ids = ids_of(tok, c)
            f.write(f"{i}\t{len(ids)}\t{fnv1a64(ids):016x}\n")
    with open(out + "_head.jsonl", "w") as f:
        for i, c in enumerate(convs[:40]):
            f.write(json.dumps({"source": "train", "index": i, "generation_prompt": False,
                                "ids": ids_of(tok, c)}) + "\n")
        eval_path = data_path.replace("train_conversations", "eval_prompts")
        for i, line in enumerate(open(eval_path)):
            if i >= 20:
                break
            c = json.loads(line)["conversations"]
            f.write(json.dumps({"source": "eval", "index": i, "generation_prompt": True,
                                "ids": ids_of(tok, c, True)}) + "\n")
    with open(out + "_plain.jsonl", "w") as f:
        for s in PLAIN:
            ids = tok(s, add_special_tokens=False)["input_ids"]
            f.write(json.dumps({"text": s, "ids": ids, "decoded": tok.decode(ids)}) + "\n")
    print(f"wrote {len(convs)} conversations to {out}_*")


if __name__ == "__main__":
    main()
