#!/usr/bin/python3
"""teacher_server --preview_data, the real binary on the bundled model and data.

Checks what docs/guides/data.md shows: the run config and the plain flags
give the same preview; every sample's header counts agree with the totals;
the trained spans are marked (brackets through a pipe, colours on a
terminal) and hold the assistant's answer and nothing of the prompt; the
reasoning Qwen3's template drops is warned about; malformed lines, a model
directory without tokenizer.json and a bad line count exit non-zero naming
what is wrong; nothing is served.

  preview_data_test.py --teacher_bin=build/teacher_server/teacher_server --source_dir=.
"""
import argparse
import os
import pty
import re
import shutil
import subprocess
import sys
import tempfile

HEADER = re.compile(r"^--- (?P<where>\S+:\d+): (?P<kind>conversation|input_ids), (?P<tokens>\d+) tokens?"
                    r"(?: \(cut from \d+ to max_seq_len\))?, (?P<trained>\d+) trained \([\d.]+%\)(?P<rest>.*)$")
TOTALS = re.compile(r"^teacher: preview: (?P<lines>\d+) lines?: (?P<kept>\d+) samples? \((?P<tokens>\d+) tokens?, "
                    r"(?P<trained>\d+) trained, [\d.%-]+\), (?P<dropped>\d+) dropped, (?P<malformed>\d+) malformed, "
                    r"(?P<blank>\d+) blank; (?P<warnings>\d+) warnings?$")

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL: " + what)


def run(args, cwd, env=None):
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def samples(stdout):
    """(header match, body) per previewed kept or dropped line, in order: the
    body is what follows the header up to the next header or the totals."""
    out = []
    for block in re.split(r"\n(?=--- |teacher: preview: )", stdout):
        header, _, body = block.partition("\n")
        m = HEADER.match(header)
        if m:
            out.append((m, body))
    return out


def marked_runs(text, open_mark="[[", close_mark="]]"):
    return re.findall(re.escape(open_mark) + r"(.*?)" + re.escape(close_mark), text, flags=re.S)


def bundled(teacher, src):
    data = "examples/data/train_conversations.jsonl"
    by_config = run([teacher, "--config=examples/configs/demo.yaml", "--preview_data=2"], src)
    check(by_config.returncode == 0, f"--config preview exits 0 (got {by_config.returncode}: {by_config.stderr})")
    by_flags = run([teacher, "--model_dir=examples/tiny-code-llama", f"--data={data}", "--max_seq_len=512",
                    "--preview_data", "2"], src)
    check(by_flags.returncode == 0, f"flags preview exits 0 (got {by_flags.returncode}: {by_flags.stderr})")
    check(by_config.stdout == by_flags.stdout, "the run config and the same flags give the same preview")
    out = by_config.stdout
    check("serving on" not in out and "backend" not in out, "the preview loads no model and serves nothing")
    check(out.startswith(f"teacher: preview of the first 2 line(s) of {data} as the teacher trains on them: "
                         "template examples/tiny-code-llama/chat_template.jinja, max_seq_len 512"),
          "the first line names the data, the template and max_seq_len:\n" + out[:300])
    got = samples(out)
    check([m["where"] for m, _ in got] == [f"{data}:1", f"{data}:2"], f"two samples, lines 1 and 2: {got}")
    tokens = trained = 0
    for m, body in got:
        tokens += int(m["tokens"])
        trained += int(m["trained"])
        check(m["kind"] == "conversation" and m["rest"] == "", f"{m['where']} is a kept conversation")
        check(0 < int(m["trained"]) < int(m["tokens"]), f"{m['where']}: some but not all tokens trained")
        runs = marked_runs(body)
        check(len(runs) == 1, f"{m['where']}: one assistant turn, one marked run: {runs}")
        if runs:
            check(runs[0].rstrip().endswith("<|eot_id|>"), f"{m['where']}: the trained run ends with <|eot_id|>")
            check("<|start_header_id|>" not in runs[0] and "Continue this Python code" not in runs[0],
                  f"{m['where']}: nothing of the prompt or the assistant header is trained")
        check(body.startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>"),
              f"{m['where']}: the text is the template's rendering")
    totals = [TOTALS.match(line) for line in out.splitlines() if line.startswith("teacher: preview: ")]
    check(len(totals) == 1 and totals[0] is not None, f"one totals line: {totals}")
    if totals and totals[0]:
        t = totals[0]
        check((int(t["lines"]), int(t["kept"]), int(t["tokens"]), int(t["trained"]), int(t["malformed"]))
              == (2, 2, tokens, trained, 0), f"the totals add up the samples: {t.group(0)}")
    return out


def reasoning(teacher, src):
    args = [teacher, "--model_dir=examples/tiny-code-llama", "--data=tests/fixtures/preview_reasoning.jsonl",
            "--chat_template=tests/fixtures/chat_templates/qwen3.jinja", "--preview_data=1"]
    r = run(args, src)
    check(r.returncode == 0, f"qwen3 preview exits 0 (got {r.returncode}: {r.stderr})")
    warning = ("warning: tests/fixtures/preview_reasoning.jsonl:1: messages[1] (assistant): its reasoning "
               "(\"reasoning_content\", 23 bytes) is not in the rendered text: the chat template "
               "(tests/fixtures/chat_templates/qwen3.jinja) drops it, so it is not trained")
    check(warning in r.stdout.splitlines(), "the first answer's dropped reasoning is warned about:\n" + r.stdout)
    check(r.stdout.count("\nwarning: ") == 1, "the last answer's reasoning is rendered: no second warning")
    check("Two plus three is five." not in r.stdout, "the dropped reasoning is not in the text")
    got = samples(r.stdout)
    check(len(got) == 1, f"one sample: {got}")
    runs = marked_runs(got[0][1]) if got else []
    check(len(runs) == 2 and "Five times four is twenty." in runs[1],
          f"the last turn's reasoning is trained: {runs}")
    answers = run(args + ["--train_reasoning=false"], src)
    runs = [run for _, body in samples(answers.stdout) for run in marked_runs(body)]
    check(answers.returncode == 0 and len(runs) == 2 and runs[1].startswith("20") and "Five" not in runs[1],
          f"train_reasoning=false trains the answer only: {runs}")


def on_terminal(args, cwd, env):
    """(exit code, output) of `args` with its stdout on a terminal."""
    master, slave = pty.openpty()
    p = subprocess.Popen(args, cwd=cwd, stdout=slave, stderr=subprocess.PIPE, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO once the child has closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    p.wait(timeout=120)
    os.close(master)
    return p.returncode, b"".join(chunks).decode("utf-8", "replace")


def colours(teacher, src):
    """On a terminal the trained spans are coloured instead of bracketed,
    unless NO_COLOR is set."""
    args = [teacher, "--config=examples/configs/demo.yaml", "--preview_data=1"]
    env = dict(os.environ)
    env.pop("NO_COLOR", None)
    rc, text = on_terminal(args, src, env)
    check(rc == 0, f"the terminal preview exits 0 (got {rc})")
    check("\x1b[1;32m" in text and "\x1b[0m" in text and "[[" not in text,
          "on a terminal the trained tokens are coloured, not bracketed")
    env["NO_COLOR"] = "1"
    rc, text = on_terminal(args, src, env)
    check(rc == 0 and "\x1b[" not in text and "[[" in text, "NO_COLOR keeps the brackets on a terminal")


def errors(teacher, src, scratch):
    bad = os.path.join(scratch, "bad.jsonl")
    with open(bad, "w") as f:
        f.write('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
        f.write('{"messages": [{"role": "bot", "content": "x"}]}\n')
    r = run([teacher, "--model_dir=examples/tiny-code-llama", f"--data={bad}", "--preview_data=5"], src)
    check(r.returncode == 1, f"a malformed line exits 1 (got {r.returncode})")
    check(f"--- {bad}:2: malformed, not a sample: messages[0].role is \"bot\"; expected system, developer, user, "
          "assistant or tool" in r.stdout, "the malformed line is named with what was expected:\n" + r.stdout)
    check("teacher_server: error: 1 of the 2 line(s) previewed are malformed" in r.stderr, r.stderr)

    no_tokenizer = os.path.join(scratch, "model")
    os.makedirs(no_tokenizer)
    for name in ("config.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(os.path.join(src, "examples/tiny-code-llama", name), no_tokenizer)
    r = run([teacher, f"--model_dir={no_tokenizer}", "--data=examples/data/train_conversations.jsonl",
             "--preview_data=1"], src)
    check(r.returncode == 1 and f"{no_tokenizer}/tokenizer.json: cannot open" in r.stderr,
          f"a model directory without tokenizer.json is named (exit {r.returncode}): {r.stderr}")

    r = run([teacher, "--model_dir=examples/tiny-code-llama", f"--data={scratch}/none.jsonl", "--preview_data=1"], src)
    check(r.returncode == 1 and "none.jsonl" in r.stderr and r.stdout == "",
          f"a missing data file is named (exit {r.returncode}): {r.stderr}")
    r = run([teacher, "--config=examples/configs/demo.yaml", "--preview_data=0"], src)
    check(r.returncode == 2 and "--preview_data=0: expected a number of lines, at least 1" in r.stderr,
          f"--preview_data=0 is refused (exit {r.returncode}): {r.stderr}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--teacher_bin", required=True)
    parser.add_argument("--source_dir", required=True)
    args = parser.parse_args()
    teacher = os.path.abspath(args.teacher_bin)
    src = os.path.abspath(args.source_dir)
    out = bundled(teacher, src)
    print(out.split("\n--- ")[0] + "\n--- " + out.split("\n--- ")[1][:400] + "\n...")
    reasoning(teacher, src)
    colours(teacher, src)
    with tempfile.TemporaryDirectory(prefix="e3-preview-") as scratch:
        errors(teacher, src, scratch)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("preview_data_test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
