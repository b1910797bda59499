"""Anthropic's Messages API on the wire: a request body translated to the chat layer's inputs (OpenAI-shaped
messages, a ``ToolRequest``, ``ChatOptions`` and llama-server's sampling fields), and the chat layer's answer
(``ChatMessage``, or ``MessageDiff``s as it streams) written back as Anthropic's message JSON and server-sent events.

llama.cpp does the same in ``tools/server/server-chat.cpp`` (``server_chat_convert_anthropic_to_oai``) and
``server-task.cpp`` (``to_json_anthropic``, ``to_json_anthropic_stream``, the partial results' ``to_json_anthropic``);
where this module differs, its docstrings say so."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from samplechain.chat import ChatMessage, ChatOptions, ChatSyntax, MessageDiff, MessageStream, ToolRequest, parse
from samplechain.chat.messages import random_id
from samplechain.chat.parse import parse_content
from samplechain.runtime.events import Final
from samplechain.server import prompts as pr
from samplechain.server.limits import MAX_MESSAGES, APIError, bad_request
from samplechain.server.responses import error_body, json_bytes

log = logging.getLogger(__name__)

# the body's Anthropic fields, translated here (never read as llama-server fields of the same name)
_ANTHROPIC_FIELDS = ("messages", "system", "tools", "tool_choice", "stop_sequences", "max_tokens", "thinking",
                     "metadata", "n", "n_cmpl", "n_predict", "max_completion_tokens", "parallel_tool_calls")
SKIPPED_SHOWN = 8  # tool types a skipped-tools log line names (each cut to SKIPPED_CHARS characters)
SKIPPED_CHARS = 64


def skipped_types(kinds: list[str]) -> str:
    """Skipped tool types for one log line: each named once, cut to ``SKIPPED_CHARS`` characters, at most
    ``SKIPPED_SHOWN`` of them, then how many more (a request chooses them: the line stays short)."""
    seen = list(dict.fromkeys(k[:SKIPPED_CHARS] for k in kinds))
    shown = ", ".join(repr(k) for k in seen[:SKIPPED_SHOWN])
    return shown + (f" and {len(seen) - SKIPPED_SHOWN} more" if len(seen) > SKIPPED_SHOWN else "")


def message_id() -> str:
    """``msg_`` + 24 random alphanumerics (Anthropic's shape; llama.cpp answers its ``chatcmpl-`` id)."""
    return random_id(24, "msg_")


def tool_use_id() -> str:
    """``toolu_`` + 24 random alphanumerics: a tool call's id when the model writes none."""
    return random_id(24, "toolu_")


# --- request -> chat layer ----------------------------------------------------------------------------------------


@dataclass
class Translated:
    """A Messages request as the chat layer takes it: llama-server's sampling ``fields``, OpenAI-shaped
    ``messages``, the ``request``'s tools, the chat ``options``, the client's stop sequences and ``max_tokens``
    (None for ``count_tokens``, where it is not required)."""

    fields: dict[str, Any]
    messages: list[dict[str, Any]]
    request: ToolRequest | None
    options: ChatOptions
    stops: tuple[str, ...]
    max_tokens: int | None


def _text_of(block: Mapping[str, Any], where: str) -> str:
    if not isinstance(block.get("text"), str):
        raise bad_request(f"{where}: a text block needs a string 'text'")
    return block["text"]


def _block(block: Any, where: str) -> str:
    """A content block's type, checked: an object with a string ``type``; images and documents are refused here
    (llama.cpp converts them to image parts and fails with a 500 when the model has no vision)."""
    if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
        raise bad_request(f"{where}: a content block must be an object with a string 'type'")
    kind = block["type"]
    if kind in ("image", "document"):
        raise bad_request(f"{where}: {kind} input is not supported: the model this server runs reads text only")
    return kind


def _billing_header(text: str) -> str:
    """Claude Code's ``x-anthropic-billing-header: ...; cch=xxxxx;`` system line with its per-request stamp made
    constant, so the prompt cache gets past it (llama.cpp's ``normalize_anthropic_billing_header``)."""
    prefix = "x-anthropic-billing-header:"
    if not text.startswith(prefix):
        return text
    i = text.find("cch=", len(prefix))
    if i < 0 or i + 9 >= len(text) or text[i + 9] != ";":
        return text
    return text[:i + 4] + "fffff" + text[i + 9:]


def system_text(system: Any) -> str | None:
    """``system``: a string or text blocks, joined with newlines (llama.cpp concatenates them without a
    separator, which glues Claude Code's blocks together); None when absent."""
    if system is None:
        return None
    if isinstance(system, str):
        return _billing_header(system)
    if not isinstance(system, list):
        raise bad_request("system: must be a string or an array of text blocks")
    texts = []
    for j, block in enumerate(system):
        where = f"system.{j}"
        kind = _block(block, where)
        if kind != "text":
            raise bad_request(f"{where}: system blocks must be text blocks, got type {kind!r}")
        texts.append(_billing_header(_text_of(block, where)))
    return "\n".join(texts)


def _tool_result(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A ``tool_result`` block as a tool message: its content a string or text blocks (joined, as llama.cpp
    does); ``is_error`` marks the text (llama.cpp drops the flag: the model could not tell a failure)."""
    use_id = block.get("tool_use_id")
    if not isinstance(use_id, str):
        raise bad_request(f"{where}: a tool_result block needs a string 'tool_use_id'")
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            kind = _block(part, f"{where}.content.{k}")
            if kind != "text":
                raise bad_request(f"{where}.content.{k}: unsupported content block type {kind!r} in a tool_result")
            parts.append(_text_of(part, f"{where}.content.{k}"))
        text = "".join(parts)
    else:
        raise bad_request(f"{where}: a tool_result's content must be a string or an array of blocks")
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise bad_request(f"{where}: 'is_error' must be true or false")
    return {"role": "tool", "tool_call_id": use_id, "content": f"Error: {text}" if is_error else text}


def _tool_call(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A ``tool_use`` block as an OpenAI tool call, its input object as compact JSON text (llama.cpp's ``dump``)."""
    name, call_id, args = block.get("name"), block.get("id", ""), block.get("input", {})
    if not isinstance(name, str) or not name:
        raise bad_request(f"{where}: a tool_use block needs a string 'name'")
    if not isinstance(call_id, str):
        raise bad_request(f"{where}: a tool_use block's 'id' must be a string")
    if not isinstance(args, Mapping):
        raise bad_request(f"{where}: a tool_use block's 'input' must be an object")
    arguments = json.dumps(args, ensure_ascii=False, separators=(",", ":"))
    return {"type": "function", "function": {"name": name, "arguments": arguments}, "id": call_id}


def _message(m: Any, i: int, last: bool) -> list[dict[str, Any]]:
    """One Anthropic message as OpenAI messages: its text blocks (joined with newlines; a last assistant message,
    the prefill, keeps its parts, which the chat layer joins with a blank line), its ``tool_use`` blocks as
    ``tool_calls``, its ``thinking`` blocks as ``reasoning_content`` (``redacted_thinking`` dropped), each
    ``tool_result`` a tool message. Tool messages and user text come in block order (llama.cpp puts a user
    message's text before its tool results; Anthropic puts the results first)."""
    if not isinstance(m, Mapping):
        raise bad_request(f"messages.{i}: a message must be an object with a role and content")
    role = m.get("role")
    if role not in ("user", "assistant", "system"):
        raise bad_request(f"messages.{i}: unexpected role {role!r}: a message's role is 'user', 'assistant' or "
                          "'system'")
    if "content" not in m:
        raise bad_request(f"messages.{i}: 'content' is required")
    content = m["content"]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise bad_request(f"messages.{i}: 'content' must be a string or an array of content blocks")
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thought = ""

    def flush() -> None:
        if texts or ((calls or thought) and role == "assistant"):
            msg: dict[str, Any] = {"role": role, "content": _prefill(texts) if last and role == "assistant"
                                   else "\n".join(texts)}
            if calls:
                msg["tool_calls"] = list(calls)
            if thought:
                msg["reasoning_content"] = thought
            out.append(msg)
        texts.clear()

    for j, block in enumerate(content):
        where = f"messages.{i}.content.{j}"
        kind = _block(block, where)
        if kind == "text":
            texts.append(_text_of(block, where))
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_call(block, where))
        elif kind == "tool_result" and role == "user":
            flush()
            out.append(_tool_result(block, where))
        elif kind == "thinking" and role == "assistant":
            if not isinstance(block.get("thinking"), str):
                raise bad_request(f"{where}: a thinking block needs a string 'thinking'")
            thought += block["thinking"]
        elif kind == "redacted_thinking" and role == "assistant":
            continue  # encrypted for Anthropic's models: nothing a template can show
        elif kind in ("tool_use", "tool_result", "thinking", "redacted_thinking"):
            raise bad_request(f"{where}: a {kind} block cannot be in a {role} message")
        else:
            raise bad_request(f"{where}: unsupported content block type {kind!r}")
    flush()
    return out


def _prefill(texts: list[str]) -> str | list[dict[str, str]]:
    """A prefill's texts: one string, or text parts (the chat layer joins them as llama.cpp joins a continued
    message's parts)."""
    if len(texts) <= 1:
        return texts[0] if texts else ""
    return [{"type": "text", "text": t} for t in texts]


def chat_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``system`` and ``messages`` as the chat layer's messages."""
    if "messages" not in body:
        raise bad_request("'messages' is required")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise bad_request("'messages' must be an array")
    if len(messages) > MAX_MESSAGES:
        raise bad_request(f"Field 'messages': at most {MAX_MESSAGES} messages, got {len(messages)}")
    _count_blocks(body.get("system"), messages)
    system = system_text(body.get("system"))
    texts = [] if system is None else [system]
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        for msg in _message(m, i, i == len(messages) - 1):
            if msg["role"] == "system":  # Claude Code's mid-conversation system messages (a beta of theirs)
                texts.append(msg["content"] if isinstance(msg["content"], str) else
                             "\n".join(p["text"] for p in msg["content"]))
            else:
                out.append(msg)
    if texts:  # most chat templates take a system message only first: they join the system prompt, in order
        out.insert(0, {"role": "system", "content": "\n".join(texts)})
    if len(out) > MAX_MESSAGES:
        raise bad_request(f"Field 'messages': at most {MAX_MESSAGES} messages, got {len(out)} (each tool_result "
                          "block is a message of its own, and so is the system prompt)")
    return out


def _count_blocks(system: Any, messages: list[Any]) -> None:
    """At most ``MAX_MESSAGES`` content blocks in all (the system's, the messages' and their tool_results'),
    counted before any is read: each ``tool_result`` block becomes a message of its own."""
    def blocks(content: Any) -> int:
        return len(content) if isinstance(content, list) else 0

    def refuse(n: int) -> APIError:
        return bad_request(f"Field 'messages': at most {MAX_MESSAGES} content blocks in all (the system's, the "
                           f"messages' and their tool_results'), got {n}")

    n = blocks(system) + sum(blocks(m.get("content")) for m in messages if isinstance(m, Mapping))
    if n > MAX_MESSAGES:
        raise refuse(n)
    n += sum(blocks(b.get("content")) for m in messages if isinstance(m, Mapping) and isinstance(m.get("content"), list)
             for b in m["content"] if isinstance(b, Mapping))
    if n > MAX_MESSAGES:
        raise refuse(n)


def _tools(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """Custom tools as OpenAI function tools; Anthropic's server and client tools (``bash_20250124``,
    ``web_search_*``, ...) are left out, their types named in one log line per request (``skipped_types``;
    llama.cpp turns every tool into a function)."""
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request("tools: must be an array")
    out = []
    skipped: list[str] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise bad_request(f"tools.{i}: a tool must be an object")
        kind = tool.get("type", "custom")
        if kind is None:
            kind = "custom"
        if not isinstance(kind, str):
            raise bad_request(f"tools.{i}: 'type' must be a string")
        if kind != "custom":
            skipped.append(kind)
            continue
        schema = tool.get("input_schema", {})
        if not isinstance(schema, Mapping):
            raise bad_request(f"tools.{i}: 'input_schema' must be a JSON schema object")
        out.append({"type": "function", "function": {"name": tool.get("name"), "description": tool.get("description"),
                                                      "parameters": schema}})
    if skipped:
        log.warning("anthropic: %d tools of Anthropic's own types left out (this server runs custom tools only): %s",
                    len(skipped), skipped_types(skipped))
    return out


def tool_request(body: Mapping[str, Any]) -> ToolRequest | None:
    """``tools`` and ``tool_choice`` as a ``ToolRequest``: ``auto``, ``any`` (required), ``tool`` (that one,
    required; llama.cpp makes it ``required`` over every tool) and ``none``; ``disable_parallel_tool_use`` turns
    parallel calls off. ``any`` and ``tool`` without a custom tool to call are a 400, as Anthropic answers them."""
    oai: dict[str, Any] = {"tools": _tools(body)}
    choice = body.get("tool_choice")
    if choice is not None:
        if not isinstance(choice, Mapping) or choice.get("type") not in ("auto", "any", "tool", "none"):
            raise bad_request("tool_choice: must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}")
        kind = choice["type"]
        if kind in ("any", "tool") and not oai["tools"]:
            raise bad_request(f"tool_choice: {{\"type\": \"{kind}\"}} needs at least one tool in 'tools' (this "
                              "server calls custom tools only)")
        if kind == "tool":
            if not isinstance(choice.get("name"), str):
                raise bad_request("tool_choice: {\"type\": \"tool\"} needs the tool's 'name'")
            oai["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        else:
            oai["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
        disable = choice.get("disable_parallel_tool_use")
        if disable is not None:
            if not isinstance(disable, bool):
                raise bad_request("tool_choice.disable_parallel_tool_use: must be true or false")
            oai["parallel_tool_calls"] = not disable
    return pr.tool_request(oai)


def _thinking(body: Mapping[str, Any], fields: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """``thinking``: ``enabled`` turns the template's thinking on with a reasoning budget of ``budget_tokens``
    (llama.cpp's ``thinking_budget_tokens``, 10000 when absent), ``disabled`` turns it off, ``adaptive`` and
    ``between_tools`` turn it on without a budget."""
    thinking = body.get("thinking")
    if thinking is None:
        return
    kinds = ("enabled", "disabled", "adaptive", "between_tools")
    if not isinstance(thinking, Mapping) or thinking.get("type") not in kinds:
        raise bad_request("thinking: must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}")
    kwargs["enable_thinking"] = thinking["type"] != "disabled"
    if thinking["type"] == "enabled":
        budget = thinking.get("budget_tokens", 10000)
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise bad_request("thinking.budget_tokens: must be a non-negative integer")
        fields["thinking_budget_tokens"] = budget


def max_tokens(body: Mapping[str, Any]) -> int:
    """``max_tokens``: required and at least 1, as Anthropic has it (llama.cpp makes it 4096 when absent)."""
    value = body.get("max_tokens")
    if value is None:
        raise bad_request("max_tokens: Field required")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_request(f"max_tokens: must be an integer of at least 1, got {json.dumps(value)}")
    return value


def translate(body: Mapping[str, Any], reasoning_format: str, count: bool = False) -> Translated:
    """A Messages request body as the chat layer's inputs. Every field this module does not translate passes
    through as a llama-server field (``min_p``, ``samplers``, ``grammar``, ``chat_template_kwargs``, ...), as on
    the chat route; ``count``: a ``count_tokens`` body, without ``max_tokens``."""
    limit = None if count else max_tokens(body)
    fields = {k: v for k, v in body.items() if k not in _ANTHROPIC_FIELDS}
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise bad_request("stop_sequences: must be an array of strings")
        fields["stop"] = list(stops)
    if limit is not None:
        fields["n_predict"] = limit
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise bad_request("'chat_template_kwargs' must be an object")
    kwargs = dict(kwargs)
    _thinking(body, fields, kwargs)
    messages = chat_messages(body)
    request = tool_request(body)
    if request is not None and request.choice != "none" and body.get("grammar") is not None:
        raise bad_request("Cannot use custom grammar constraints with tools.")
    options = pr.chat_options({**fields, "chat_template_kwargs": kwargs}, None, reasoning_format)
    return Translated(fields, messages, request, options, tuple(stops or ()), limit)


# --- answer -> response -------------------------------------------------------------------------------------------


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the ``input`` object: the JSON object they hold, ``{}`` when they are not JSON
    (llama.cpp's ``to_json_anthropic``) or hold another value (llama.cpp would send that value; Anthropic's
    ``input`` is always an object)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def stop_reason(final: Final, tool_calls: bool, stops: tuple[str, ...]) -> tuple[str, str | None]:
    """``stop_reason`` and ``stop_sequence``: ``tool_use`` when the answer calls tools, ``stop_sequence`` for one
    of the request's stop sequences (llama.cpp says ``end_turn`` and names any stop string, the chat format's
    included), ``end_turn`` at the end of generation, else ``max_tokens``."""
    if final.stop_type not in ("eos", "word"):
        return "max_tokens", None
    if tool_calls:
        return "tool_use", None
    if final.stop_type == "word" and final.stopping_word in stops:
        return "stop_sequence", final.stopping_word
    return "end_turn", None


def usage(final: Final) -> dict[str, int]:
    """Tokens in and out; ``input_tokens`` leaves out the prompt's cached prefix (llama.cpp's usage)."""
    return {"cache_read_input_tokens": final.n_cached, "input_tokens": final.n_prompt - final.n_cached,
            "output_tokens": final.n_decoded}


def message(final: Final, syntax: ChatSyntax, mid: str, model: str, stops: tuple[str, ...]) -> dict[str, Any]:
    """The whole answer: a thinking block first, then the text, then each tool call (``to_json_anthropic``)."""
    msg = parse(final.content, syntax)
    blocks: list[dict[str, Any]] = []
    if msg.reasoning_content:
        blocks.append({"type": "thinking", "thinking": msg.reasoning_content, "signature": ""})
    if msg.content:
        blocks.append({"type": "text", "text": msg.content})
    for call in msg.tool_calls:
        blocks.append({"type": "tool_use", "id": call.id or tool_use_id(), "name": call.name,
                       "input": tool_input(call.arguments)})
    reason, sequence = stop_reason(final, bool(msg.tool_calls), stops)
    return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": blocks,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage(final)}


def event(name: str, data: dict[str, Any]) -> bytes:
    """One server-sent event with its name (llama.cpp's ``format_anthropic_sse``)."""
    return b"event: " + name.encode() + b"\ndata: " + json_bytes(data) + b"\n\n"


PING = event("ping", {"type": "ping"})


def error_event(e: APIError) -> bytes:
    """An error in the middle of a stream, in Anthropic's error shape."""
    return event("error", error_body("/v1/messages", e))


class EventWriter:
    """A streamed answer's events: ``message_start`` (and a ``ping``), then each content block in order (started,
    its deltas, stopped before the next starts; a thinking block closes with an empty ``signature_delta``), then
    ``message_delta`` and ``message_stop``. llama.cpp keeps every block open to the end and numbers them from the
    whole answer; here they are numbered as they start."""

    def __init__(self, mid: str, model: str, syntax: ChatSyntax, stops: tuple[str, ...]) -> None:
        self.mid, self.model, self.syntax, self.stops = mid, model, syntax, stops
        self.stream = MessageStream(syntax)
        self.n_blocks = 0
        self.open: tuple[str, int] | None = None  # the open block's kind and index
        self.tools: dict[int, int] = {}  # a call's index -> its block's index
        self.objects: dict[int, bool] = {}  # a call's index -> whether its arguments are a JSON object

    def start(self, n_prompt: int, n_cached: int) -> bytes:
        """``message_start``, with the prompt's tokens (``input_tokens`` without the cached prefix), and a ping."""
        head = {"id": self.mid, "type": "message", "role": "assistant", "model": self.model, "content": [],
                "stop_reason": None, "stop_sequence": None,
                "usage": {"cache_read_input_tokens": n_cached, "input_tokens": n_prompt - n_cached,
                          "output_tokens": 0}}
        return event("message_start", {"type": "message_start", "message": head}) + PING

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        kind, index = self.open
        self.open = None
        out = b""
        if kind == "thinking":  # Anthropic's clients expect a signature before a thinking block closes
            out = event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                "delta": {"type": "signature_delta", "signature": ""}})
        return out + event("content_block_stop", {"type": "content_block_stop", "index": index})

    def _open(self, kind: str, block: dict[str, Any]) -> tuple[bytes, int]:
        out = self._close()
        index, self.n_blocks = self.n_blocks, self.n_blocks + 1
        self.open = (kind, index)
        return out + event("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": block}), index

    def _delta(self, index: int, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})

    def _tool_id(self, d: MessageDiff, final: bool) -> str:
        """A call's id: the model's, else ``toolu_`` + the one the stream made up (a partial parse says whether
        the model wrote one)."""
        given = parse_content(self.syntax, self.stream.content, partial=not final).tool_calls
        return d.tool_id if d.tool_index < len(given) and given[d.tool_index].id else "toolu_" + d.tool_id[:24]

    def diffs(self, diffs: list[MessageDiff], final: bool = False) -> bytes:
        """The events of the chat layer's differences: a block starts when the kind of text changes or a new call
        appears (llama.cpp's partial ``to_json_anthropic``)."""
        out = b""
        for d in diffs:
            if d.reasoning:
                if self.open is None or self.open[0] != "thinking":
                    b, _ = self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                    out += b
                out += self._delta(self.open[1], {"type": "thinking_delta", "thinking": d.reasoning})
            elif d.content:
                if self.open is None or self.open[0] != "text":
                    b, _ = self._open("text", {"type": "text", "text": ""})
                    out += b
                out += self._delta(self.open[1], {"type": "text_delta", "text": d.content})
            elif d.tool_index >= 0:
                if d.tool_index not in self.tools:
                    b, self.tools[d.tool_index] = self._open("tool_use", {
                        "type": "tool_use", "id": self._tool_id(d, final), "name": d.tool_name, "input": {}})
                    out += b
                partial = self._object_json(d.tool_index, d.tool_arguments)
                if partial:
                    out += self._delta(self.tools[d.tool_index], {"type": "input_json_delta", "partial_json": partial})
        return out

    def _object_json(self, index: int, text: str) -> str:
        """A call's argument text as ``input_json_delta`` sends it: all of it when the arguments start an object,
        none when they start another value (the block's ``input`` stays ``{}``, as ``tool_input`` makes it), and
        leading whitespace dropped until their first character says which."""
        is_object = self.objects.get(index)
        if is_object is None:
            text = text.lstrip()
            if not text:
                return ""
            is_object = self.objects[index] = text[0] == "{"
        return text if is_object else ""

    def token(self, text: str) -> bytes:
        """The events of a token's text (none while the chat layer holds it back)."""
        return self.diffs(self.stream.update(text)) if text else b""

    def finish(self, final: Final) -> bytes:
        """The rest of the answer, the last block closed, ``message_delta`` (stop reason, usage) and
        ``message_stop``."""
        out = self.diffs(self.stream.update("", final=True), final=True) + self._close()
        msg: ChatMessage = self.stream.msg
        reason, sequence = stop_reason(final, bool(msg.tool_calls), self.stops)
        out += event("message_delta", {"type": "message_delta",
                                       "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                       "usage": usage(final)})
        return out + event("message_stop", {"type": "message_stop"})
