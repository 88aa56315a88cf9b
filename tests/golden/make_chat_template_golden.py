#!/usr/bin/env python3
"""Golden renders of real chat templates by transformers.

Renders every conversation of tests/fixtures/chat_templates/conversations.json
with every template of templates.json through transformers' own
render_jinja_template (the code apply_chat_template runs), once per
add_generation_prompt value and kwargs variant, with strftime_now's clock
pinned. Writes tests/fixtures/chat_templates/golden.json: per case the text
(or the template's error) and, for add_generation_prompt=false, the trained
spans as UTF-8 byte offsets:
- templates with {% generation %} blocks: transformers' generation indices
  (what return_assistant_tokens_mask marks);
- others: each assistant turn located as the trainer's documented rule says
  (common/text/chat_template.cc), implemented here over transformers' renders:
  the turn's own rendering (the conversation with it, past its common
  prefix with the conversation before it plus the generation prompt;
  trailing whitespace dropped) found in the conversation's text; or that
  without a leading <think>...</think> block (templates that drop earlier
  turns' reasoning); or else its visible content plus the terminator the
  template writes after it.
  The C++ test also checks what any correct mask must satisfy (every answer
  inside, no user text inside), independently of this rule.

Run where transformers is installed (the GPU machine):
    python3 tests/golden/make_chat_template_golden.py [--check]
--check re-renders and compares with the committed golden.json.
"""

import argparse
import datetime
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures", "chat_templates")


def pin_clock(date):
    """Makes transformers' strftime_now report `date` (ISO); False when its
    module does not reach the clock through a `datetime` global."""
    import types
    import transformers.utils.chat_template_utils as ctu
    fixed = datetime.datetime.fromisoformat(date)

    class FixedDatetime(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return fixed

    clock = getattr(ctu, "datetime", None)
    if clock is datetime.datetime:  # `from datetime import datetime`
        ctu.datetime = FixedDatetime
        return True
    if clock is datetime:  # `import datetime`
        ctu.datetime = types.SimpleNamespace(datetime=FixedDatetime, date=datetime.date,
                                             timezone=datetime.timezone, timedelta=datetime.timedelta)
        return True
    return False


def render(template, messages, tools, agp, variables):
    """(text, generation char spans) as transformers renders them."""
    from transformers.utils.chat_template_utils import render_jinja_template
    rendered, indices = render_jinja_template(
        conversations=[messages], tools=tools, chat_template=template,
        add_generation_prompt=agp, return_assistant_tokens_mask=True, **variables)
    return rendered[0], [list(s) for s in (indices[0] if indices else [])]


def visible(content):
    c = content or ""
    at = c.rfind("</think>")
    if at >= 0:
        c = c[at + len("</think>"):]
    return c.strip(" \t\n\r\f\v")


def reasoning_of(message):
    for key in ("reasoning_content", "thinking"):
        if isinstance(message.get(key), str):
            return message[key]
    return ""


def skip_reasoning(text, span, message):
    start, end = span
    r = reasoning_of(message).strip(" \t\n\r\f\v")
    if r:
        at = text.find(r, start)
        if 0 <= at < end:
            start = at + len(r)
    think = text.rfind("</think>", 0, end)
    if think >= start and think < end:
        start = think + len("</think>")
    v = visible(message.get("content"))
    if v:
        at = text.find(v, start)
        if 0 <= at < end:
            start = at
    return [start, end]


def turn_spans(template, messages, tools, variables, train_reasoning):
    full, _ = render(template, messages, tools, False, variables)
    spans, cursor = [], 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before, _ = render(template, messages[:i], tools, True, variables)
        alone, _ = render(template, messages[:i + 1], tools, False, variables)
        common = 0
        while common < min(len(before), len(alone)) and before[common] == alone[common]:
            common += 1
        own = alone[common:].rstrip(" \t\n\r\f\v")
        candidates = [own]
        if own.startswith("<think>") and "</think>" in own:  # reasoning dropped from history
            candidates.append(own[own.index("</think>") + len("</think>"):].lstrip(" \t\n\r\f\v"))
        span = None
        for c in candidates:
            at = full.find(c, cursor) if c else -1
            if at >= 0:
                span = [at, at + len(c)]
                break
        if span is None:
            v = visible(m.get("content"))
            at = full.find(v, cursor) if v else -1
            if at < 0:
                raise ValueError(f"messages[{i}]: cannot locate the assistant turn")
            end = at + len(v)
            in_alone = alone.rfind(v)
            if in_alone >= 0:
                term = alone[in_alone + len(v):].rstrip(" \t\n\r\f\v")
                if full.startswith(term, end):
                    end += len(term)
            span = [at, end]
        if not train_reasoning:
            span = skip_reasoning(full, span, m)
        cursor = span[1]
        if span[1] > span[0]:
            spans.append(span)
    return spans


def to_bytes(text, spans):
    return [[len(text[:b].encode("utf-8")), len(text[:e].encode("utf-8"))] for b, e in spans]


def make_cases():
    convs = json.load(open(os.path.join(FIXTURES, "conversations.json"), encoding="utf-8"))
    spec = json.load(open(os.path.join(FIXTURES, "templates.json"), encoding="utf-8"))
    pinned = pin_clock(convs["pinned"]["strftime_now_date"])
    cases = []
    for t in spec["templates"]:
        source = open(os.path.join(FIXTURES, t["file"]), encoding="utf-8").read()
        generation = "{% generation" in source or "{%- generation" in source
        base = {k: t[k] for k in ("bos_token", "eos_token") if k in t}
        for kwargs in t.get("kwargs", [{}]):
            variables = dict(base, **kwargs)
            for conv in convs["conversations"]:
                tools = convs["tools"][conv["tools"]] if conv["tools"] else None
                for agp in conv["add_generation_prompt"]:
                    case = {"template": t["name"], "kwargs": kwargs, "conversation": conv["name"],
                            "add_generation_prompt": agp}
                    try:
                        text, gen = render(source, conv["messages"], tools, agp, variables)
                    except Exception as e:  # the template refuses: C++ must too
                        case["error"] = f"{type(e).__name__}: {e}"
                        cases.append(case)
                        continue
                    case["text"] = text
                    if not agp:
                        if generation:
                            case["spans"] = to_bytes(text, gen)
                        else:
                            for key, train in (("spans", True), ("answer_spans", False)):
                                case[key] = to_bytes(text, turn_spans(source, conv["messages"], tools,
                                                                      variables, train))
                    cases.append(case)
    import transformers
    import jinja2
    return {"comment": "Made by tests/golden/make_chat_template_golden.py; do not edit.",
            "transformers": transformers.__version__, "jinja2": jinja2.__version__,
            "strftime_now_pinned": pinned, "cases": cases}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--out", default=os.path.join(FIXTURES, "golden.json"))
    args = parser.parse_args()
    golden = make_cases()
    if args.check:
        old = json.load(open(args.out, encoding="utf-8"))
        same = old["cases"] == golden["cases"]
        print("golden.json matches" if same else "golden.json differs")
        return 0 if same else 1
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum("error" in c for c in golden["cases"])
    print(f"wrote {args.out}: {len(golden['cases'])} cases ({errors} refused by their template), "
          f"transformers {golden['transformers']}, jinja2 {golden['jinja2']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
