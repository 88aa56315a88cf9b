"""The environment Hugging Face transformers renders chat templates in,
reproduced for the C++ data reader, which embeds this file
(common/text/chat_template.cc, through common/text/embedded_python.h).

What transformers sets up, and this reproduces:
- Jinja2's ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks,
  the loop-controls extension ({% break %}, {% continue %}) and the
  {% generation %} block, which marks the text the assistant generates;
- a `tojson` filter that keeps non-ASCII text and takes json.dumps'
  indent, separators and sort_keys (Jinja's own escapes HTML);
- the globals raise_exception(message) and strftime_now(format);
- the variables messages, tools, documents, add_generation_prompt, the
  tokenizer's special tokens and any template kwargs.

The C++ side calls compile() once per template and render() per
conversation, with JSON text in and out.
"""

import datetime
import json

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

_MIN_JINJA = (3, 1)


class _RenderState:
    """What one render tracks: output length so far and generation spans."""

    def __init__(self):
        self.length = 0
        self.spans = []


_state = None  # the render in progress; rendering is serialised by the GIL


class _GenerationBlock(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: renders its body unchanged and
    records where in the output it landed. The template is rendered through
    generate(), so when the block runs, everything before it has been
    consumed and counted."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_mark", [])
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _mark(self, caller):
        text = caller()
        if _state is not None and text:
            _state.spans.append((_state.length, _state.length + len(text)))
        return text


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


_fixed_now = None  # a datetime that strftime_now reports instead of now


def _strftime_now(fmt):
    now = _fixed_now if _fixed_now is not None else datetime.datetime.now()
    return now.strftime(fmt)


def _make_environment():
    version = tuple(int(p) for p in jinja2.__version__.split(".")[:2])
    if version < _MIN_JINJA:
        raise RuntimeError(
            "chat templates need Jinja2 >= 3.1 (as transformers does); found " + jinja2.__version__)
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_env = None
_templates = []


def compile(source):
    """Compiles a template; returns its handle (a decimal string). A syntax
    error raises with the line it is on."""
    global _env
    if _env is None:
        _env = _make_environment()
    _templates.append(_env.from_string(source))
    return str(len(_templates) - 1)


def set_now(iso):
    """Pins strftime_now to an ISO date or datetime ("" unpins): for tests."""
    global _fixed_now
    _fixed_now = datetime.datetime.fromisoformat(iso) if iso else None
    return ""


def _byte_offsets(text, offsets):
    """Maps str indices of `text` to UTF-8 byte offsets."""
    out, at, pos = {}, 0, 0
    for index in sorted(set(offsets)):
        at += len(text[pos:index].encode("utf-8", "surrogatepass"))
        pos = index
        out[index] = at
    return out


def _render_one(template, variables):
    """Renders once; returns (text, generation spans in str indices)."""
    global _state
    _state = _RenderState()
    try:
        pieces = []
        for piece in template.generate(**variables):
            pieces.append(piece)
            _state.length += len(piece)
        return "".join(pieces), _state.spans
    finally:
        _state = None


def render(handle, request_json):
    """Renders one conversation, or several prefixes of it, in one call.

    request: {messages, tools, documents, variables, renders}, each render
    being {count, add_generation_prompt}: the first `count` messages (all
    when absent). Returns JSON {renders: [{text, spans}]}, spans being the
    generation blocks' [begin, end) UTF-8 byte offsets."""
    template = _templates[int(handle)]
    request = json.loads(request_json)
    messages = request["messages"]
    base = dict(request.get("variables") or {})
    base["tools"] = request.get("tools")
    base["documents"] = request.get("documents")
    out = []
    for spec in request.get("renders") or [{}]:
        variables = dict(base)
        count = spec.get("count")
        variables["messages"] = messages if count is None else messages[:count]
        variables["add_generation_prompt"] = bool(spec.get("add_generation_prompt", False))
        text, spans = _render_one(template, variables)
        bytes_at = _byte_offsets(text, [i for span in spans for i in span])
        out.append({"text": text, "spans": [[bytes_at[b], bytes_at[e]] for b, e in spans]})
    return json.dumps({"renders": out}, ensure_ascii=False)
