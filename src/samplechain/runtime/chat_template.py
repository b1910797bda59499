# ruff: noqa: RUF001  (DeepSeek's turn markers are full-width characters)
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

import datetime as _dt
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

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


# --- messages ----------------------------------------------------------------------------------------------------

_PASSED_KEYS = ("tool_calls", "reasoning_content", "name", "tool_call_id")


def _content_parts(content: list, i: int) -> list[dict[str, str]]:
    parts = []
    for j, part in enumerate(content):
        if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
            raise ValueError(f"message {i}: content part {j} must be an object with a string 'type', got {part!r}")
        if part["type"] != "text":
            raise ValueError(f"message {i}: content part {j} has type {part['type']!r}: only text parts are "
                             "supported (images and audio need a multimodal model)")
        if not isinstance(part.get("text"), str):
            raise ValueError(f"message {i}: content part {j} (text) needs a string 'text', got {part.get('text')!r}")
        parts.append({"type": "text", "text": part["text"]})
    return parts


def join_parts(content: str | list[dict[str, str]]) -> str:
    """A content as one string: text parts joined with newlines (llama.cpp's ``concat_content_parts``)."""
    return content if isinstance(content, str) else "\n".join(p["text"] for p in content)


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as llama.cpp hands them to a template (``common_chat_msgs_parse_oaicompat`` +
    ``to_json_oaicompat``): a string role (``developer`` -> ``system``), a string content (``None`` -> ``""``) or a
    list of text parts, and the tool fields the message has. Anything else is a ``ValueError`` saying what."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError(f"messages must be a list of messages, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"message {i}: a chat message must be an object with a string role and content, "
                             f"got {m!r}")
        role = m.get("role")
        if not isinstance(role, str):
            raise ValueError(f"message {i}: a chat message needs a string role and content, got {m!r}")
        if "content" not in m and not m.get("tool_calls"):
            raise ValueError(f"message {i}: a chat message needs a string role and content (or tool_calls), "
                             f"got {m!r}")
        content = m.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):
            content = _content_parts(content, i)
            if not content:
                content = ""
        elif not isinstance(content, str):
            raise ValueError(f"message {i}: content must be a string, a list of content parts or null, "
                             f"got {type(content).__name__}")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content}
        for key in _PASSED_KEYS:
            if m.get(key) not in (None, "", []):
                msg[key] = m[key]
        out.append(msg)
    return out


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
    if isinstance(value, (list, tuple)):
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
class Caps:
    """What a template does with messages (llama.cpp's ``jinja::caps``, found by rendering probes)."""

    system_role: bool  # reads a system message's content (else it is merged into the next message)
    string_content: bool  # renders a string content
    typed_content: bool  # renders a list of content parts


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
    """What the jinja ``template`` supports (see ``Caps``)."""
    return _compile(template)[1]


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


def _token_text(vocab: Vocab, token: int | None) -> str:
    return vocab.token_bytes(token).decode("utf-8", "replace") if token is not None else ""


def render(template: str, vocab: Vocab, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool, *,
           enable_thinking: bool | None = None, tools: Sequence[Mapping[str, Any]] | None = None,
           template_kwargs: Mapping[str, Any] | None = None, now: _dt.datetime | None = None) -> str:
    """A chat template applied to ``messages`` as llama.cpp applies it: a jinja template (sandboxed) with llama.cpp's
    variables and workarounds, or a built-in template's name (``"llama3"``, ``"mistral-v7"``, ...: ``BUILTINS``).

    ``enable_thinking``: ``None`` is llama.cpp's default (``True``, unless ``template_kwargs`` sets it).
    ``template_kwargs``: extra template variables (a request's ``chat_template_kwargs``), over the others.
    ``now``: the time ``strftime_now``, ``date_string`` and ``datetime`` show (default: now, local time)."""
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
    context: dict[str, Any] = {"messages": _for_caps(msgs, caps), "bos_token": _token_text(vocab, vocab.bos),
                               "eos_token": _token_text(vocab, vocab.eos), "enable_thinking": enable_thinking}
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


# --- llama.cpp's built-in templates (src/llama-chat.cpp) ---------------------------------------------------------


def detect_builtin(template: str) -> str | None:
    """The built-in template llama.cpp's ``llm_chat_detect_template`` picks for a template's name or jinja source
    (``None``: unknown). Names it detects that ``BUILTINS`` lacks are returned too (``apply_builtin`` refuses them)."""
    if template in BUILTIN_NAMES:
        return template

    def has(s: str) -> bool:
        return s in template

    if has("<|im_start|>"):
        return "phi4" if has("<|im_sep|>") else "smolvlm" if has("<end_of_utterance>") else "chatml"
    if template.startswith("mistral") or has("[INST]"):
        if has("[SYSTEM_PROMPT]"):
            return "mistral-v7"
        if has("' [INST] ' + system_message") or has("[AVAILABLE_TOOLS]"):
            if has(" [INST]"):
                return "mistral-v1"
            if has('"[INST]"'):
                return "mistral-v3-tekken"
            return "mistral-v3"
        if has("content.strip()"):
            return "llama2-sys-strip"
        if has("bos_token + '[INST]"):
            return "llama2-sys-bos"
        return "llama2-sys" if has("<<SYS>>") else "llama2"
    rules: list[tuple[Callable[[], bool], str | Callable[[], str]]] = [
        (lambda: has("<|assistant|>") and has("<|end|>"), "phi3"),
        (lambda: has("[gMASK]<sop>"), "chatglm4"),
        (lambda: has("<|assistant|>") and has("<|user|>"),
         lambda: "exaone-moe" if has("<|tool_declare|>") else "falcon3" if has("</s>") else "glmedge"),
        (lambda: has("<|{{ item['role'] }}|>") and has("<|begin_of_image|>"), "glmedge"),
        (lambda: has("<|user|>") and has("<|endoftext|>"), "zephyr"),
        (lambda: has("bos_token + message['role']"), "monarch"),
        (lambda: has("<start_of_turn>"), "gemma"),
        (lambda: has("'\\n\\nAssistant: ' + eos_token"), "orion"),
        (lambda: has("GPT4 Correct "), "openchat"),
        (lambda: has("USER: ") and has("ASSISTANT: "), lambda: "vicuna-orca" if has("SYSTEM: ") else "vicuna"),
        (lambda: has("### Instruction:") and has("<|EOT|>"), "deepseek"),
        (lambda: has("<|START_OF_TURN_TOKEN|>") and has("<|USER_TOKEN|>"), "command-r"),
        (lambda: has("<|start_header_id|>") and has("<|end_header_id|>"), "llama3"),
        (lambda: has("[gMASK]sop"), "chatglm3"),
        (lambda: has("<用户>"), "minicpm"),
        (lambda: has("'Assistant: ' + message['content'] + eos_token"), "deepseek2"),
        (lambda: has("<｜Assistant｜>") and has("<｜User｜>") and has("<｜end▁of▁sentence｜>"), "deepseek3"),
        (lambda: has("[|system|]") and has("[|assistant|]") and has("[|endofturn|]"),
         lambda: "exaone4" if has("[|tool|]") else "exaone3"),
        (lambda: has("rwkv-world") or has("{{- 'User: ' + message['content']|trim + '\\n\\n' -}}"), "rwkv-world"),
        (lambda: has("<|start_of_role|>"),
         lambda: ("granite-4.0" if has("g4_default_system_message") else "granite-4.1")
         if has("<tool_call>") or has("<tools>") else "granite"),
        (lambda: has("message['role'] + additional_special_tokens[0] + message['content'] + "
                     "additional_special_tokens[1]"), "gigachat"),
        (lambda: has("<|role_start|>"), "megrez"),
        (lambda: has(" Ассистент:"), "yandex"),
        (lambda: has("<role>ASSISTANT</role>") and has("'HUMAN'"), "bailing"),
        (lambda: has("<role>ASSISTANT</role>") and has('"HUMAN"') and has("<think>"), "bailing-think"),
        (lambda: has("<role>ASSISTANT</role>") and has("<role>HUMAN</role>") and has("<|role_end|>"), "bailing2"),
        (lambda: has("<|header_start|>") and has("<|header_end|>"), "llama4"),
        (lambda: has("<|endofuserprompt|>"), "dots1"),
        (lambda: has("<|extra_0|>") and has("<|extra_4|>"), "hunyuan-moe"),
        (lambda: has("<|start|>") and has("<|channel|>"), "gpt-oss"),
        (lambda: has("<｜hy_Assistant｜>") and has("<｜hy_begin▁of▁sentence｜>"), "hunyuan-vl"),
        (lambda: has("<｜hy_Assistant｜>") and has("<｜hy_place▁holder▁no▁3｜>"), "hunyuan-dense"),
        (lambda: has("<|im_assistant|>assistant<|im_middle|>"), "kimi-k2"),
        (lambda: has("<seed:bos>"), "seed_oss"),
        (lambda: has("'Assistant: '  + message['content'] + '<|separator|>"), "grok-2"),
        (lambda: has("[unused9]系统：[unused10]"), "pangu-embedded"),
        (lambda: has("<|begin|>") and has("<|end|>") and has("<|content|>"), "solar-open"),
    ]
    for test, name in rules:
        if test():
            return name() if callable(name) else name
    return None


def _trim(s: str) -> str:
    return s.strip(" \t\n\v\f\r")  # C isspace


def _chatml(msgs, add):
    out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)
    return out + ("<|im_start|>assistant\n" if add else "")


def _mistral_v7(trailing_space: str):
    def apply(msgs, add):
        out = []
        for m in msgs:
            if m["role"] == "system":
                out.append(f"[SYSTEM_PROMPT]{trailing_space}{m['content']}[/SYSTEM_PROMPT]")
            elif m["role"] == "user":
                out.append(f"[INST]{trailing_space}{m['content']}[/INST]")
            else:
                out.append(f"{trailing_space}{m['content']}</s>")
        return "".join(out)
    return apply


def _mistral(name: str):
    leading = " " if name == "mistral-v1" else ""
    trailing = "" if name == "mistral-v3-tekken" else " "
    trim_assistant = name == "mistral-v3"

    def apply(msgs, add):
        out, inside = [], False
        for m in msgs:
            if not inside:
                out.append(f"{leading}[INST]{trailing}")
                inside = True
            if m["role"] == "system":
                out.append(m["content"] + "\n\n")
            elif m["role"] == "user":
                out.append(f"{m['content']}{leading}[/INST]")
            else:
                out.append(trailing + (_trim(m["content"]) if trim_assistant else m["content"]) + "</s>")
                inside = False
        return "".join(out)
    return apply


def _llama2(name: str):
    system_ok = name != "llama2"
    bos_inside = name == "llama2-sys-bos"
    strip = name == "llama2-sys-strip"

    def apply(msgs, add):
        out, inside = ["[INST] "], True
        for m in msgs:
            content = _trim(m["content"]) if strip else m["content"]
            if not inside:
                inside = True
                out.append("<s>[INST] " if bos_inside else "[INST] ")
            if m["role"] == "system":
                out.append(f"<<SYS>>\n{content}\n<</SYS>>\n\n" if system_ok else content + "\n")
            elif m["role"] == "user":
                out.append(content + " [/INST]")
            else:
                out.append(content + "</s>")
                inside = False
        return "".join(out)
    return apply


def _simple(turn: Callable[[str, str], str], generation: str):
    """A template that writes each message on its own and ends with a generation prompt."""
    def apply(msgs, add):
        return "".join(turn(m["role"], m["content"]) for m in msgs) + (generation if add else "")
    return apply


def _gemma(msgs, add):
    out, system = [], ""
    for m in msgs:
        if m["role"] == "system":
            system += _trim(m["content"])
            continue
        role = "model" if m["role"] == "assistant" else m["role"]
        out.append(f"<start_of_turn>{role}\n")
        if system and role != "model":
            out.append(system + "\n\n")
            system = ""
        out.append(_trim(m["content"]) + "<end_of_turn>\n")
    return "".join(out) + ("<start_of_turn>model\n" if add else "")


def _monarch(msgs, add):
    out = "".join(("" if i == 0 else "<s>") + f"{m['role']}\n{m['content']}</s>\n" for i, m in enumerate(msgs))
    return out + ("<s>assistant\n" if add else "")


def _orion(msgs, add):
    out, system = [], ""
    for m in msgs:
        if m["role"] == "system":
            system += m["content"]
        elif m["role"] == "user":
            out.append("Human: " + (system + "\n\n" if system else "") + m["content"] + "\n\nAssistant: </s>")
            system = ""
        else:
            out.append(m["content"] + "</s>")
    return "".join(out)


def _openchat(msgs, add):
    out = []
    for m in msgs:
        if m["role"] == "system":
            out.append(m["content"] + "<|end_of_turn|>")
        else:
            role = m["role"][:1].upper() + m["role"][1:]
            out.append(f"GPT4 Correct {role}: {m['content']}<|end_of_turn|>")
    return "".join(out) + ("GPT4 Correct Assistant:" if add else "")


def _vicuna(orca: bool):
    def turn(role, content):
        if role == "system":
            return f"SYSTEM: {content}\n" if orca else content + "\n\n"
        if role == "user":
            return f"USER: {content}\n"
        return f"ASSISTANT: {content}</s>\n" if role == "assistant" else ""
    return _simple(turn, "ASSISTANT:")


def _by_role(system: Callable[[str], str], user: Callable[[str], str], assistant: Callable[[str], str],
             generation: str):
    table = {"system": system, "user": user, "assistant": assistant}
    return _simple(lambda role, content: table[role](content) if role in table else "", generation)


def _minicpm(msgs, add):
    return "".join(f"<用户>{_trim(m['content'])}<AI>" if m["role"] == "user" else _trim(m["content"]) for m in msgs)


def _rwkv_world(msgs, add):
    out = []
    for i, m in enumerate(msgs):
        if m["role"] == "system":
            out.append(f"System: {_trim(m['content'])}\n\n")
        elif m["role"] == "user":
            out.append(f"User: {_trim(m['content'])}\n\n" + ("Assistant:" if i == len(msgs) - 1 else ""))
        elif m["role"] == "assistant":
            out.append(f"Assistant: {_trim(m['content'])}\n\n")
    return "".join(out)


def _granite(name: str):
    def turn(role, content):
        if role == "assistant_tool_call":
            head = ("<|start_of_role|>assistant_tool_call<|end_of_role|><|tool_call|>" if name == "granite"
                    else "<|start_of_role|>assistant<|end_of_role|><|tool_call|>")
        else:
            head = f"<|start_of_role|>{role}<|end_of_role|>"
        return f"{head}{content}<|end_of_text|>\n"
    return _simple(turn, "<|start_of_role|>assistant<|end_of_role|>")


# name -> (messages with string contents, add_generation_prompt) -> prompt; llm_chat_apply_template's branches
BUILTINS: dict[str, Callable[[list[dict[str, Any]], bool], str]] = {
    "chatml": _chatml,
    "llama2": _llama2("llama2"),
    "llama2-sys": _llama2("llama2-sys"),
    "llama2-sys-bos": _llama2("llama2-sys-bos"),
    "llama2-sys-strip": _llama2("llama2-sys-strip"),
    "mistral-v1": _mistral("mistral-v1"),
    "mistral-v3": _mistral("mistral-v3"),
    "mistral-v3-tekken": _mistral("mistral-v3-tekken"),
    "mistral-v7": _mistral_v7(" "),
    "mistral-v7-tekken": _mistral_v7(""),
    "phi3": _simple(lambda r, c: f"<|{r}|>\n{c}<|end|>\n", "<|assistant|>\n"),
    "phi4": _simple(lambda r, c: f"<|im_start|>{r}<|im_sep|>{c}<|im_end|>", "<|im_start|>assistant<|im_sep|>"),
    "falcon3": _simple(lambda r, c: f"<|{r}|>\n{c}\n", "<|assistant|>\n"),
    "zephyr": _simple(lambda r, c: f"<|{r}|>\n{c}<|endoftext|>\n", "<|assistant|>\n"),
    "monarch": _monarch,
    "gemma": _gemma,
    "orion": _orion,
    "openchat": _openchat,
    "vicuna": _vicuna(False),
    "vicuna-orca": _vicuna(True),
    "deepseek": _by_role(lambda c: c, lambda c: f"### Instruction:\n{c}\n", lambda c: f"### Response:\n{c}\n<|EOT|>\n",
                         "### Response:\n"),
    "command-r": _by_role(lambda c: f"<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>{_trim(c)}<|END_OF_TURN_TOKEN|>",
                          lambda c: f"<|START_OF_TURN_TOKEN|><|USER_TOKEN|>{_trim(c)}<|END_OF_TURN_TOKEN|>",
                          lambda c: f"<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{_trim(c)}<|END_OF_TURN_TOKEN|>",
                          "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
    "llama3": _simple(lambda r, c: f"<|start_header_id|>{r}<|end_header_id|>\n\n{_trim(c)}<|eot_id|>",
                      "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    "chatglm3": lambda msgs, add: "[gMASK]sop" + _simple(lambda r, c: f"<|{r}|>\n {c}", "<|assistant|>")(msgs, add),
    "chatglm4": lambda msgs, add: "[gMASK]<sop>" + _simple(lambda r, c: f"<|{r}|>\n{c}", "<|assistant|>\n")(msgs,
                                                                                                            add),
    "glmedge": _simple(lambda r, c: f"<|{r}|>\n{c}", "<|assistant|>"),
    "minicpm": _minicpm,
    "deepseek2": _by_role(lambda c: c + "\n\n", lambda c: f"User: {c}\n\n",
                          lambda c: f"Assistant: {c}<｜end▁of▁sentence｜>", "Assistant:"),
    "deepseek3": _by_role(lambda c: c + "\n\n", lambda c: f"<｜User｜>{c}",
                          lambda c: f"<｜Assistant｜>{c}<｜end▁of▁sentence｜>", "<｜Assistant｜>"),
    "exaone3": _by_role(lambda c: f"[|system|]{_trim(c)}[|endofturn|]\n", lambda c: f"[|user|]{_trim(c)}\n",
                        lambda c: f"[|assistant|]{_trim(c)}[|endofturn|]\n", "[|assistant|]"),
    "rwkv-world": _rwkv_world,
    "granite": _granite("granite"),
    "granite-4.0": _granite("granite-4.0"),
    "granite-4.1": _granite("granite-4.1"),
}

# every name llama.cpp's LLM_CHAT_TEMPLATES knows (llama_chat_builtin_templates); BUILTINS implements a subset
BUILTIN_NAMES = frozenset({
    "chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "mistral-v1", "mistral-v3",
    "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "phi3", "phi4", "falcon3", "zephyr", "monarch", "gemma",
    "orion", "openchat", "vicuna", "vicuna-orca", "deepseek", "deepseek2", "deepseek3", "deepseek-ocr", "command-r",
    "llama3", "chatglm3", "chatglm4", "glmedge", "minicpm", "exaone3", "exaone4", "exaone-moe", "rwkv-world", "dots1",
    "granite", "granite-4.0", "granite-4.1", "gigachat", "megrez", "yandex", "bailing", "bailing-think", "bailing2",
    "llama4", "smolvlm", "hunyuan-moe", "gpt-oss", "hunyuan-dense", "hunyuan-vl", "kimi-k2", "seed_oss", "grok-2",
    "pangu-embedded", "solar-open",
})


def apply_builtin(name: str, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
    """llama.cpp's built-in template ``name`` (``llm_chat_apply_template``: no BOS, no jinja) applied to
    ``messages``; content parts are joined with newlines as llama.cpp's legacy path joins them."""
    if name not in BUILTINS:
        known = "not implemented here" if name in BUILTIN_NAMES else "unknown"
        raise ValueError(f"built-in chat template {name!r} is {known}; available: {', '.join(sorted(BUILTINS))}")
    msgs = [{"role": m["role"], "content": join_parts(m["content"])} for m in normalize_messages(messages)]
    return BUILTINS[name](msgs, add_generation_prompt)


def builtin_template_name(vocab: Vocab) -> str:
    """The built-in template for a vocabulary without a chat template, by the turn markers it has as special
    tokens: Gemma's, Llama 3's, Mistral's (``[SYSTEM_PROMPT]``: v7, ``[INST]``: v3; ``-tekken`` for a Tekken
    vocabulary), Phi-3's, else ChatML, llama.cpp's default for a GGUF without a template."""
    texts = {vocab.token_bytes(i) for i in vocab.special}
    if {b"<start_of_turn>", b"<end_of_turn>"} <= texts:
        return "gemma"
    if {b"<|start_header_id|>", b"<|end_header_id|>", b"<|eot_id|>"} <= texts:
        return "llama3"
    if {b"[INST]", b"[/INST]"} <= texts:
        tekken = getattr(vocab.tokenizer, "pre", None) == "tekken"
        if b"[SYSTEM_PROMPT]" in texts:
            return "mistral-v7-tekken" if tekken else "mistral-v7"
        return "mistral-v3-tekken" if tekken else "mistral-v3"
    if {b"<|user|>", b"<|assistant|>", b"<|end|>"} <= texts:
        return "phi3"
    return "chatml"


def apply_template(vocab: Vocab, messages: Sequence[Mapping[str, Any]] | str, add_generation_prompt: bool = True,
                   *, enable_thinking: bool | None = None, tools: Sequence[Mapping[str, Any]] | None = None,
                   template_kwargs: Mapping[str, Any] | None = None, now: _dt.datetime | None = None) -> str:
    """The vocabulary's chat template applied to ``messages`` (or one user message), as ``render``. A GGUF without
    a template gets the built-in one for its turn markers (``builtin_template_name``), after the BOS text when the
    vocabulary adds a BOS (the same tokens as llama.cpp, whose tokenizer adds it)."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if vocab.chat_template:
        return render(vocab.chat_template, vocab, messages, add_generation_prompt, enable_thinking=enable_thinking,
                      tools=tools, template_kwargs=template_kwargs, now=now)
    bos = _token_text(vocab, vocab.bos) if vocab.add_bos else ""
    return bos + apply_builtin(builtin_template_name(vocab), messages, add_generation_prompt)


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
