#!/usr/bin/env python3
"""Writes the seed inputs of the libFuzzer harnesses (tests/fuzz/corpus/<name>/seed-*).

Seeds are small valid inputs of each format, taken from the repository's
own files where it has them (the bundled model, the golden fixtures, the
chat-template conversations), plus a few near misses. Run from anywhere;
protoc encodes the protobuf seeds from text. Inputs of crashes found and
fixed live beside the seeds as crash-* files and are never rewritten here
(trainer_state_fuzz/crash-a5dde26...: "tokens" as a string, which made the
reader before tests/fuzz existed throw out of nlohmann; libFuzzer found it
in 28 s from these seeds and the dictionary).
"""
import gzip
import json
import os
import struct
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def write(name, seed, data):
    d = os.path.join(CORPUS, name)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + seed), "wb") as f:
        f.write(data)


def read(rel, mode="r"):
    with open(os.path.join(ROOT, rel), mode) as f:
        return f.read()


def safetensors(tensors, metadata=None, tail=b""):
    header, blob = {}, b""
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + blob + tail


def shrink_tokenizer(tok, keep_ids):
    """A tokenizer.json of the same pipeline with only ids < keep_ids."""
    m = tok["model"]
    vocab = {t: i for t, i in m["vocab"].items() if i < keep_ids}
    merges = []
    for merge in m["merges"]:
        a, b = merge if isinstance(merge, list) else merge.split(" ", 1)
        if a in vocab and b in vocab and a + b in vocab:
            merges.append([a, b])
    out = dict(tok)
    out["model"] = dict(m, vocab=vocab, merges=merges)
    out["added_tokens"] = [t for t in tok["added_tokens"]][:8]
    return json.dumps(out, ensure_ascii=False)


def protoc(message, text):
    return subprocess.run(["protoc", "--proto_path=" + os.path.join(ROOT, "proto"), "--encode=e3.v1." + message,
                           "teacher.proto"], input=text.encode(), capture_output=True, check=True).stdout


def main():
    # safetensors: valid files, metadata, an empty one, a header that lies.
    f32 = struct.pack("<4f", 1, 2, 3, 4)
    write("safetensors_fuzz", "two", safetensors({"a.weight": ("F32", [2, 2], f32),
                                                   "b": ("I64", [1], struct.pack("<q", 7))},
                                                  metadata={"format": "pt"}))
    write("safetensors_fuzz", "bf16", safetensors({"w": ("BF16", [3], b"\x80\x3f" * 3), "z": ("BOOL", [0], b"")}))
    write("safetensors_fuzz", "empty", safetensors({}))
    write("safetensors_fuzz", "short", safetensors({"a": ("F32", [2, 2], f32)})[:-4])
    write("safetensors_fuzz", "lies", struct.pack("<Q", 1 << 40) + b"{}")

    # config.json: every golden architecture and the bundled model.
    write("model_config_fuzz", "tiny-code-llama", read("examples/tiny-code-llama/config.json"))
    golden = os.path.join(ROOT, "tests", "fixtures", "golden")
    for name in sorted(os.listdir(golden)):
        path = os.path.join(golden, name, "config.json")
        if os.path.isfile(path):
            write("model_config_fuzz", name, read(path))

    # tokenizer.json: each pipeline the tokenizer supports, vocab cut small.
    write("tokenizer_fuzz", "tiny-code-llama",
          shrink_tokenizer(json.loads(read("examples/tiny-code-llama/tokenizer.json")), 300))
    fam = os.path.join(ROOT, "tests", "fixtures", "tokenizers")
    for name in sorted(os.listdir(fam)):
        if name.endswith(".json.gz") and name not in ("expected.json.gz",):
            with gzip.open(os.path.join(fam, name), "rt", encoding="utf-8") as f:
                write("tokenizer_fuzz", name[:-len(".json.gz")], shrink_tokenizer(json.load(f), 300))
    # Post-processors: Llama 3's Sequence of a ByteLevel and a BOS template
    # (with a pair), then a trimming ByteLevel and Roberta's processor.
    with gzip.open(os.path.join(fam, "gpt_oss.json.gz"), "rt", encoding="utf-8") as f:
        spec = json.loads(shrink_tokenizer(json.load(f), 300))
    bos = {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}
    spec["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                  {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                  {"Sequence": {"id": "B", "type_id": 1}}], "special_tokens": bos},
        {"type": "RobertaProcessing", "sep": ["</s>", 1], "cls": ["<s>", 0], "trim_offsets": True,
         "add_prefix_space": False}]}
    write("tokenizer_fuzz", "post_processor", json.dumps(spec, ensure_ascii=False))

    # Training files: the bundled data's first lines, every line format, a
    # malformed line, gzip.
    lines = read("examples/data/train_conversations.jsonl").splitlines()
    short = [l for l in lines if len(l) < 600][:3]
    formats = [
        json.dumps({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": "hello"}]}),
        json.dumps({"conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]}),
        json.dumps({"input_ids": [1, 2, 3, 4, 5], "loss_mask": [0, 0, 1, 1, 1]}),
        json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]},
                                 {"role": "assistant", "content": None,
                                  "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]},
                                 {"role": "tool", "content": "42"},
                                 {"role": "assistant", "content": "42", "reasoning_content": "look"}]}),
        "{not json",
        "",
    ]
    write("dataset_fuzz", "bundled", "\n".join(short) + "\n")
    write("dataset_fuzz", "formats", "\n".join(formats) + "\n")
    write("dataset_fuzz", "gzip", gzip.compress(("\n".join(formats[:3]) + "\n").encode(), mtime=0))

    # Conversations of the golden chat-template tests, one per line format.
    convs = json.loads(read("tests/fixtures/chat_templates/conversations.json"))
    for c in convs["conversations"]:
        line = {"messages": c["messages"]}
        if c.get("tools"):
            line["tools"] = convs["tools"][c["tools"]]
        write("chat_template_fuzz", c["name"], json.dumps(line, ensure_ascii=False))
    write("chat_template_fuzz", "sharegpt", formats[1])

    # trainer_state.json as SaveCheckpoint writes it, and an older one.
    write("trainer_state_fuzz", "saved", json.dumps({"step": 12, "cursors": [{"epoch": 1, "next_batch": 5},
                                                                             {"epoch": 0, "next_batch": 7}],
                                                     "tokens": 3456, "subscriber_id": "rank-0"}, indent=2))
    write("trainer_state_fuzz", "minimal", '{"step": 0, "cursors": []}')

    # checksums.json as SaveCheckpoint writes it, and one naming a path.
    write("checkpoint_manifest_fuzz", "saved",
          json.dumps({"files": {"model.safetensors": {"bytes": 1234, "crc32c": "0a1b2c3d"},
                                "trainer_state.json": {"bytes": 88, "crc32c": "ffffffff"}}}, indent=2))
    write("checkpoint_manifest_fuzz", "path", '{"files": {"../x": {"bytes": 1, "crc32c": "00000000"}}}')

    # Requests to the teacher: selector byte, then the message.
    requests = [
        (0, "GetInfoRequest", "version: PROTOCOL_VERSION_CURRENT world_size: 4"),
        (1, "SubscribeRequest", 'version: PROTOCOL_VERSION_CURRENT rank: 1 world_size: 2 accepted_transports: '
                                'TRANSPORT_SHM accepted_transports: TRANSPORT_INLINE credit_window: 4 '
                                'resume { epoch: 0 next_batch: 3 } subscriber_id: "rank-1" host: "teacher-host"'),
        (1, "SubscribeRequest", 'version: PROTOCOL_VERSION_CURRENT rank: 9999 world_size: 10000 '
                                'accepted_transports: TRANSPORT_NCCL subscriber_id: "r" '
                                'nccl_unique_id: "' + "x" * 128 + '" student_on_gpu: true'),
        (2, "AckRequest", 'version: PROTOCOL_VERSION_CURRENT subscriber_id: "rank-0" rank: 0 batch_ids: 10000 '
                          'batch_ids: 20000 committed { epoch: 0 next_batch: 2 }'),
        (3, "GetWeightsRequest", 'version: PROTOCOL_VERSION_CURRENT names: "embed_tokens" names: "t2d"'),
        (4, "GenerateRequest", "version: PROTOCOL_VERSION_CURRENT input_ids: [3, 17, 42, 99] max_new_tokens: 8"),
    ]
    for i, (sel, msg, text) in enumerate(requests):
        write("request_fuzz", "%d-%s" % (i, msg), bytes([sel]) + protoc(msg, text))

    # What a teacher sends: a batch, an eval chunk, a weights stream, GetInfo.
    def ref(name, dtype, shape, data):
        return 'tensors { name: "%s" dtype: %s shape: [%s] inline_data: "%s" }' % (
            name, dtype, ", ".join(map(str, shape)), "".join("\\x%02x" % b for b in data))
    batch = ('version: PROTOCOL_VERSION_CURRENT batch_id: 10000 num_samples: 1 num_tokens: 2 transport: '
             'TRANSPORT_INLINE ' + ref("input_ids", "DTYPE_I32", [2], struct.pack("<2i", 5, 6)) + " " +
             ref("cu_seqlens", "DTYPE_I32", [2], struct.pack("<2i", 0, 2)) + " " +
             ref("aux_hidden", "DTYPE_BF16", [2, 3], b"\x00\x3f" * 6))
    write("wire_fuzz", "batch", bytes([0]) + protoc("BatchDescriptor", batch))
    nccl = ('transport: TRANSPORT_NCCL payload_bytes: 64 tensors { name: "input_ids" dtype: DTYPE_I32 shape: [4] '
            'nccl { nbytes: 16 offset: 0 } } tensors { name: "cu" dtype: DTYPE_I32 shape: [2] '
            'nccl { nbytes: 8 offset: 16 } }')
    write("wire_fuzz", "nccl", bytes([0]) + protoc("BatchDescriptor", nccl))
    write("wire_fuzz", "eval", bytes([1]) + protoc("EvalSetChunk", "prompts: 1 generated: 1 ready: true "
                                                   "batch_count: 1 batch { " + batch + " }"))
    stream = b""
    for name, dtype, shape, total, data in [("t2d", "DTYPE_BOOL", [16], 16, b"\x01" * 4 + b"\x00" * 12),
                                            ("d2t", "DTYPE_I64", [4], 32, b"\x00" * 32),
                                            ("target_head", "DTYPE_F32", [4, 8], 128, b"\x00" * 64)]:
        chunk = protoc("WeightChunk", 'tensor { name: "%s" dtype: %s shape: [%s] inline_data: "%s" } '
                       'offset: 0 total_bytes: %d' % (name, dtype, ", ".join(map(str, shape)),
                                                       "".join("\\x%02x" % b for b in data), total))
        stream += struct.pack("<H", len(chunk)) + chunk
    write("wire_fuzz", "weights", bytes([2]) + stream)
    config = json.dumps(json.loads(read("examples/tiny-code-llama/config.json")))
    info = ('version: PROTOCOL_VERSION_CURRENT model { hidden_size: 256 vocab_size: 8192 draft_vocab_size: 64 '
            'config_json: %s } batches_per_epoch: 3 epochs: 1' % json.dumps(config))
    write("wire_fuzz", "info", bytes([3]) + protoc("GetInfoResponse", info))


if __name__ == "__main__":
    main()
