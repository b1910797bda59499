
"""Chat templates as llama.cpp renders them: the GGUF's own jinja template (``common_chat_templates_apply``: its
variables, its workarounds for templates without a system role or without string contents), llama.cpp's built-in
templates (``src/llama-chat.cpp``: ``llm_chat_detect_template`` / ``llm_chat_apply_template``) for GGUFs without one,
and the conversation header a context shift keeps.

What a jinja template is given, as llama.cpp's ``common_chat_template_direct_apply`` gives it:

- ``messages``: ``role``, ``content`` (a string; ``None`` becomes ``""``; a list of OpenAI content parts stays a list
  for templates that read parts, and is joined with newlines for the others), and ``tool_calls``,
  ``reasoning_content``, ``name``, ``tool_call_id`` when the message has them. The ``developer`` role is ``system``.
  A template that never reads a system message's content (Gemma 2 raises instead) gets the system content prepended
  to the next message, joined with a newline.
- ``bos_token`` / ``eos_token``: the vocabulary's BOS/EOS texts (empty without one).
- ``enable_thinking``: ``True`` unless asked otherwise (llama.cpp's default; Qwen 3's template then renders no empty
  ``<think>`` block; ``False`` gives the non-thinking prompt).
- ``add_generation_prompt``: ``True``, or *undefined* when off (llama.cpp only sets it when on).
- ``tools``: only when there are tools.
- ``date_string`` (``"%d %b %Y"``, read by Llama 3.x) and ``datetime`` (``"%b %d %Y"``) of now, local time.
- the request's ``chat_template_kwargs`` (``template_kwargs`` here), over all of the above.
- ``raise_exception(msg)``, ``strftime_now(fmt)`` and ``tojson`` (JSON, not HTML-escaped: ``", "`` / ``": "``
  separators, ``","`` between items with ``indent``, non-ASCII kept) as globals; ``tojson`` also as a filter.

llama.cpp's jinja engine strips blocks like jinja2 with ``trim_blocks`` and ``lstrip_blocks`` (its lexer: "default
config for chat template: lstrip_blocks = true, trim_blocks = true", the rules of huggingface.js) and drops a
template's final newline, as jinja2 does by default. Like llama.cpp's engine, an item or attribute of an undefined
value is undefined (``messages[0].role`` of no messages), not an error.

One difference, on purpose: llama.cpp removes a leading BOS text from the rendered prompt when the vocabulary adds a
BOS itself (the tokenizer then adds it back). Here the text keeps what the template writes and callers tokenize
with ``add_special=not starts_with_bos(...)``: the same tokens.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from samplechain.chat.builtin import BUILTINS, apply_builtin, builtin_template_name
from samplechain.chat.messages import join_parts, normalize_messages
from samplechain.chat.tools import ToolProbe, probe_tools
from samplechain.vocab import Vocab


class Templating(Protocol):
    """What the header helpers need of a model."""

    vocab: Vocab

    def apply_chat_template(self, messages: Sequence[dict[str, str]] | str,
                            add_generation_prompt: bool = True) -> str: ...

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]: ...


# jinja sources: llama.cpp's default for a GGUF without a template (common/chat.cpp CHATML_TEMPLATE_SRC), and the
# Gemma one this package has always used for a vocabulary with Gemma's turn markers (the same text as the built-in
# "gemma" with the BOS in front)
BUILTIN_TEMPLATES = {
    "gemma": (
        "{{ bos_token }}{% if messages and messages[0]['role'] == 'system' %}"
        "{% set first = messages[0]['content'] + '\n\n' %}{% set rest = messages[1:] %}"
        "{% else %}{% set first = '' %}{% set rest = messages %}{% endif %}"
        "{% for message in rest %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
        "{{ '<start_of_turn>' + role + '\n' + (first if loop.first else '') + message['content'] | trim"
        " + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
    ),
    "chatml": (
        "{%- for message in messages -%}\n"
        "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
        "{%- endfor -%}\n"
        "{%- if add_generation_prompt -%}\n"
        "  {{- '<|im_start|>assistant\n' -}}\n"
        "{%- endif -%}"
    ),
}



# --- jinja -------------------------------------------------------------------------------------------------------


def tojson(value: Any, indent: int | None = None, separators: Sequence[str] | None = None,
           sort_keys: bool = False, ensure_ascii: bool = False) -> str:
    """``tojson`` as llama.cpp's engine and transformers' chat templates have it (not jinja2's HTML-safe one)."""
    if separators is None:
        separators = (", ", ": ") if indent is None else (",", ": ")
    return json.dumps(_plain(value), ensure_ascii=ensure_ascii, indent=indent, separators=tuple(separators),
                      sort_keys=sort_keys)


def _plain(value: Any) -> Any:
    from jinja2 import Undefined

    if isinstance(value, Undefined):
        return None
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, Iterator)):  # an Iterator: a filter's generator (``map``)
        return [_plain(v) for v in value]
    return value


def _raise_exception(message: str) -> None:
    raise ValueError(f"chat template: {message}")


@functools.lru_cache(maxsize=1)
def _environment():
    from jinja2 import ChainableUndefined, Undefined
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Environment(ImmutableSandboxedEnvironment):
        """llama.cpp's engine concatenates a string and an undefined or null value with ``+`` as the string alone
        (firefunction v2's template adds an undefined ``functions``); Python's ``+`` raises."""

        intercepted_binops = frozenset(["+"])

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            left_null, right_null = left is None or isinstance(left, Undefined), right is None or isinstance(
                right, Undefined)
            if operator == "+" and ((left_null and isinstance(right, str)) or (right_null and isinstance(left, str))):
                return ("" if left_null else left) + ("" if right_null else right)
            return super().call_binop(context, operator, left, right)

    # ChainableUndefined: like llama.cpp's engine, ``messages[0].role`` of no messages is undefined, not an error
    # loopcontrols: `{% break %}` and `{% continue %}`, which llama.cpp's engine parses (Command R7B's template)
    env = Environment(trim_blocks=True, lstrip_blocks=True, undefined=ChainableUndefined,
                      extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["tojson"] = tojson
    env.globals["raise_exception"] = _raise_exception
    return env


@dataclass(frozen=True)
class Caps(ToolProbe):
    """What a template does, found by rendering probes once per template: with messages (llama.cpp's
    ``jinja::caps``) and with tools, tool calls and results (minja's ``chat_template_caps``, ``ToolProbe``)."""

    system_role: bool = True  # reads a system message's content (else it is merged into the next message)
    string_content: bool = True  # renders a string content
    typed_content: bool = False  # renders a list of content parts

    def to_json(self) -> dict[str, bool]:
        """llama-server's ``chat_template_caps`` (``/props``)."""
        return {"supports_object_arguments": self.object_arguments,
                "supports_parallel_tool_calls": self.parallel_tool_calls,
                "supports_string_content": self.string_content,
                "supports_system_role": self.system_role, "supports_tool_calls": self.tool_calls,
                "supports_tool_responses": self.tool_responses, "supports_tools": self.tools,
                "supports_typed_content": self.typed_content}


_MARKER = "STRING_MARKER"


def _probe(template, messages: list[dict[str, Any]]) -> str | None:
    try:
        return template.render(messages=messages, tools=[], bos_token="", eos_token="", add_generation_prompt=True,
                               strftime_now=lambda fmt: _dt.datetime(2024, 7, 26).strftime(fmt))
    except Exception:
        return None


@functools.lru_cache(maxsize=32)
def _compile(source: str):
    """The compiled template and its caps (cached: a chat session renders the same template turn after turn)."""
    from jinja2 import TemplateError

    try:
        template = _environment().from_string(source)
    except TemplateError as e:
        raise ValueError(f"chat template does not parse: {e}") from e
    as_string = _probe(template, [{"role": "user", "content": _MARKER}])
    as_parts = _probe(template, [{"role": "user", "content": [{"type": "text", "text": _MARKER}]}])
    typed = as_parts is not None and _MARKER in as_parts and "'type'" not in as_parts and '"type"' not in as_parts
    string = as_string is not None and (_MARKER in as_string or not typed)
    def content(text: str) -> str | list[dict[str, str]]:
        return text if string else [{"type": "text", "text": text}]

    system = _probe(template, [{"role": "system", "content": content("System message")},
                               {"role": "user", "content": content("User message")}])
    return template, Caps(system_role=system is not None and "System message" in system, string_content=string,
                          typed_content=typed)


def template_caps(template: str) -> Caps:
    """What the jinja ``template`` supports (see ``Caps``); a ``ValueError`` when it does not parse."""
    return ChatTemplate(template).caps


def _for_caps(messages: list[dict[str, Any]], caps: Caps) -> list[dict[str, Any]]:
    """llama.cpp's workarounds: contents as the template takes them, a system message merged into the next one for
    a template without a system role."""
    out = []
    for m in messages:
        m = dict(m)
        if isinstance(m["content"], list) and not caps.typed_content:
            m["content"] = join_parts(m["content"])
        elif isinstance(m["content"], str) and caps.typed_content and not caps.string_content:
            m["content"] = [{"type": "text", "text": m["content"]}]
        out.append(m)
    if not caps.system_role and out and out[0]["role"] == "system":
        system = out.pop(0)
        if out:
            out[0]["content"] = join_parts(system["content"]) + "\n" + join_parts(out[0]["content"])
    return out


def token_text(vocab: Vocab, token: int | None) -> str:
    """A token's text (empty for none)."""
    return vocab.token_bytes(token).decode("utf-8", "replace") if token is not None else ""


def render(template: str, vocab: Vocab, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool, *,
           enable_thinking: bool | None = None, tools: Sequence[Mapping[str, Any]] | None = None,
           template_kwargs: Mapping[str, Any] | None = None, now: _dt.datetime | None = None) -> str:
    """A chat template applied to ``messages`` as llama.cpp applies it: a jinja template (sandboxed) with llama.cpp's
    variables and workarounds, or a built-in template's name (``"llama3"``, ``"mistral-v7"``, ...: ``BUILTINS``).

    ``enable_thinking``: ``None`` is llama.cpp's default (``True``, unless ``template_kwargs`` sets it).
    ``template_kwargs``: extra template variables (a request's ``chat_template_kwargs``), over the others.
    ``now``: the time ``strftime_now``, ``date_string`` and ``datetime`` show (default: now, local time)."""
    return _render(template, token_text(vocab, vocab.bos), token_text(vocab, vocab.eos), messages,
                   add_generation_prompt, enable_thinking=enable_thinking, tools=tools,
                   template_kwargs=template_kwargs, now=now)


def _render(template: str, bos: str, eos: str, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool, *,
           enable_thinking: bool | None = None, tools: Sequence[Mapping[str, Any]] | None = None,
           template_kwargs: Mapping[str, Any] | None = None, now: _dt.datetime | None = None) -> str:
    """A template applied with these BOS / EOS texts (``render``)."""
    msgs = normalize_messages(messages)
    if template.strip() in BUILTINS:
        return apply_builtin(template.strip(), msgs, add_generation_prompt)
    from jinja2 import TemplateError

    compiled, caps = _compile(template)
    now = now or _dt.datetime.now()
    kwargs = dict(template_kwargs or {})
    if enable_thinking is None:
        enable_thinking = kwargs.get("enable_thinking", True)
    if not isinstance(enable_thinking, bool):
        raise ValueError(f"enable_thinking must be true or false, got {enable_thinking!r}")
    context: dict[str, Any] = {"messages": _for_caps(msgs, caps), "bos_token": bos,
                               "eos_token": eos, "enable_thinking": enable_thinking}
    if tools:
        context["tools"] = [dict(t) for t in tools]
    context["datetime"] = now.strftime("%b %d %Y")
    context["date_string"] = now.strftime("%d %b %Y")
    context.update(kwargs)
    context["enable_thinking"] = enable_thinking
    if add_generation_prompt:
        context["add_generation_prompt"] = True
    try:
        return compiled.render(context, strftime_now=now.strftime)
    except TemplateError as e:
        raise ValueError(f"chat template failed: {e}") from e
    except (TypeError, AttributeError, KeyError, IndexError) as e:  # e.g. str + list in the template
        raise ValueError(f"chat template failed: {type(e).__name__}: {e}") from e


def apply_template(vocab: Vocab, messages: Sequence[Mapping[str, Any]] | str, add_generation_prompt: bool = True,
                   *, enable_thinking: bool | None = None, tools: Sequence[Mapping[str, Any]] | None = None,
                   template_kwargs: Mapping[str, Any] | None = None, now: _dt.datetime | None = None) -> str:
    """The vocabulary's chat template applied to ``messages`` (or one user message), as ``render``. A GGUF without
    a template gets the built-in one for its turn markers (``builtin_template_name``), after the BOS text when the
    vocabulary adds a BOS (the same tokens as llama.cpp, whose tokenizer adds it)."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    return ChatTemplate.of(vocab).render(messages, add_generation_prompt, tools=tools, enable_thinking=enable_thinking,
                                         variables=template_kwargs, now=now)


# --- the context-shift header ------------------------------------------------------------------------------------


def header_text(model: Templating, system: str | None) -> str:
    """The text every conversation with this system prompt starts with: the system turn and the chat header (the
    common prefix of two different first user turns). A context shift keeps it."""
    msgs = [{"role": "system", "content": system}] if system else []
    a = model.apply_chat_template([*msgs, {"role": "user", "content": "A"}])
    b = model.apply_chat_template([*msgs, {"role": "user", "content": "B"}])
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def header_tokens(model: Templating, system: str | None) -> int:
    """How many cache positions ``header_text`` takes at the start of a conversation (BOS included)."""
    text = header_text(model, system)
    return len(model.tokenize(text, add_special=not starts_with_bos(model.vocab, text)))


def starts_with_bos(vocab: Vocab, text: str) -> bool:
    return vocab.bos is not None and text.startswith(vocab.token_bytes(vocab.bos).decode("utf-8", "replace"))


# --- a template with its vocabulary's texts: what the chat layer renders ----------------------------------------


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template as the chat layer uses it: its source (jinja, or a built-in name) with the vocabulary's BOS
    and EOS texts, and what it does with tools (``caps``, probed once per template). ``prefix``: the BOS text a
    built-in template's output follows when the vocabulary adds a BOS (``apply_template``)."""

    source: str
    bos: str = ""
    eos: str = ""
    prefix: str = ""
    builtin: bool = False

    @classmethod
    def of(cls, vocab: Vocab) -> ChatTemplate:
        """The vocabulary's template: its own jinja source, else llama.cpp's built-in one for its turn markers."""
        bos, eos = token_text(vocab, vocab.bos), token_text(vocab, vocab.eos)
        if vocab.chat_template:
            return cls(vocab.chat_template, bos, eos, builtin=vocab.chat_template.strip() in BUILTINS)
        return cls(builtin_template_name(vocab), bos, eos, bos if vocab.add_bos else "", builtin=True)

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool, *,
               tools: Sequence[Mapping[str, Any]] | None = None, enable_thinking: bool | None = None,
               variables: Mapping[str, Any] | None = None, now: _dt.datetime | None = None) -> str:
        """``messages`` rendered as ``render`` renders them (``variables``: extra template variables)."""
        return self.prefix + _render(self.source, self.bos, self.eos, messages, add_generation_prompt,
                                     enable_thinking=enable_thinking, tools=tools, template_kwargs=variables, now=now)

    @property
    def caps(self) -> Caps:
        """What the template does with messages and with tools (the one probe, cached per template)."""
        return _caps(self)


@functools.lru_cache(maxsize=32)
def _caps(template: ChatTemplate) -> Caps:
    content = Caps() if template.builtin else _compile(template.source)[1]
    tools = probe_tools(lambda msgs, add, tools, variables: template.render(msgs, add, tools=tools,
                                                                            variables=variables), template.eos)
    return Caps(**{**dataclasses.asdict(tools), "system_role": content.system_role,
                   "string_content": content.string_content, "typed_content": content.typed_content})
