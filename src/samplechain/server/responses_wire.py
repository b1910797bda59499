"""OpenAI's Responses API on the wire: a request's input items, tools and settings as the chat layer's messages,
tool request and sampling fields (llama.cpp's ``server_chat_convert_responses_to_chatcmpl``, server-chat.cpp), the
answer as Responses output items (``server_task_result_cmpl_final::to_json_oaicompat_resp``, server-task.cpp), and
the bounded store of recent responses behind ``previous_response_id`` (llama.cpp has none)."""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from samplechain.chat import ChatMessage
from samplechain.chat.messages import random_id
from samplechain.runtime.events import Final
from samplechain.server.anthropic_wire import skipped_types
from samplechain.server.limits import MAX_MESSAGES, APIError, bad_request, check_schema

log = logging.getLogger(__name__)


# the request's own fields: translated here, never passed to the sampler as llama.cpp extras
RESPONSES_KEYS = frozenset({
    "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens", "text", "reasoning",
    "store", "previous_response_id", "include", "prompt_cache_key", "prompt_cache_retention", "client_metadata",
    "metadata", "truncation", "service_tier", "user", "safety_identifier", "background", "stream_options", "model",
    "conversation", "prompt", "max_tool_calls", "top_logprobs", "context_management",
    # chat-completions fields that have a Responses equivalent (or none): one answer per response
    "messages", "response_format", "n", "n_cmpl", "max_tokens", "max_completion_tokens", "logprobs",
    "chat_template_kwargs", "reasoning_format", "reasoning_effort", "add_generation_prompt", "continue_final_message",
})
UNSUPPORTED_PARTS = {"input_image": "images need a vision model, and this one reads text only",
                     "input_file": "files are not supported: send their text as input_text",
                     "input_audio": "audio needs an audio model, and this one reads text only"}


def new_id(prefix: str) -> str:
    """``prefix`` + 48 random alphanumerics (OpenAI's ids are of this shape: ``resp_...``, ``msg_...``)."""
    return random_id(48, prefix)


# --- the store: recent responses, for previous_response_id, item_reference and GET ---------------------------------


@dataclass
class Stored:
    """A kept response: its object, the conversation up to and including its answer (chat messages, without the
    instructions: OpenAI does not carry them over) and its items by id (input and output)."""

    response: dict[str, Any]
    history: list[dict[str, Any]]
    items: dict[str, dict[str, Any]] = field(default_factory=dict)


class ResponseStore:
    """The last ``size`` stored responses, least recently used out first (thread-safe: requests are translated
    off the event loop)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.lock = threading.Lock()
        self.entries: OrderedDict[str, Stored] = OrderedDict()

    def put(self, rid: str, entry: Stored) -> None:
        if self.size <= 0:
            return
        with self.lock:
            self.entries[rid] = entry
            self.entries.move_to_end(rid)
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)

    def get(self, rid: str) -> Stored | None:
        with self.lock:
            entry = self.entries.get(rid)
            if entry is not None:
                self.entries.move_to_end(rid)
            return entry

    def delete(self, rid: str) -> bool:
        with self.lock:
            return self.entries.pop(rid, None) is not None

    def item(self, item_id: str) -> dict[str, Any] | None:
        """An item of any stored response by its id (``item_reference``), most recent first."""
        with self.lock:
            for entry in reversed(self.entries.values()):
                if item_id in entry.items:
                    return entry.items[item_id]
        return None


def not_found(rid: str, param: str | None = None) -> APIError:
    """OpenAI's 404 for an unknown response id."""
    return APIError(404, f"Response with id '{rid}' not found.", "invalid_request_error", param=param)


# --- the request: input items -> chat messages ---------------------------------------------------------------------


def _text(value: Any, where: str, key: str = "text") -> str:
    if not isinstance(value, str):
        raise bad_request(f"{where}: '{key}' must be a string")
    return value


def content_parts(content: Any, where: str) -> list[dict[str, str]]:
    """A message's content (a string, or parts ``input_text`` / ``output_text`` / ``refusal``) as chat text parts;
    images, files and audio are a 400 (this server runs text models)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where}: 'content' must be a string or an array of content parts")
    out = []
    for k, part in enumerate(content):
        at = f"{where}.content[{k}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            out.append({"type": "text", "text": _text(part.get("text"), at)})
        elif kind == "refusal":
            out.append({"type": "text", "text": _text(part.get("refusal"), at, "refusal")})
        elif kind in UNSUPPORTED_PARTS:
            raise bad_request(f"{at}: '{kind}' is not supported: {UNSUPPORTED_PARTS[kind]}")
        else:
            raise bad_request(f"{at}: a content part's 'type' must be one of 'input_text', 'output_text' or "
                              f"'refusal', got {str(kind)[:64]!r}")
    return out


def _assistant(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message items merge into: the last message when it is the assistant's (llama.cpp's
    ``merge_prev``), else a new one."""
    if messages and messages[-1]["role"] == "assistant":
        return messages[-1]
    msg: dict[str, Any] = {"role": "assistant", "content": []}
    messages.append(msg)
    return msg


def _add_content(msg: dict[str, Any], parts: list[dict[str, str]]) -> None:
    if isinstance(msg.get("content"), str):
        msg["content"] = [{"type": "text", "text": msg["content"]}] if msg["content"] else []
    msg["content"] = [*(msg.get("content") or []), *parts]


def add_item(messages: list[dict[str, Any]], item: Any, where: str, store: ResponseStore | None) -> None:
    """One input item appended to ``messages`` as chat messages (``server_chat_convert_responses_to_chatcmpl``):
    messages (role user / system / developer / assistant), ``function_call`` (the assistant's tool call, merged into
    its message), ``function_call_output`` (a tool message), ``reasoning`` (the assistant's reasoning; dropped when
    it has only a summary or encrypted content) and ``item_reference`` (an item of a stored response)."""
    if not isinstance(item, Mapping):
        raise bad_request(f"{where}: an input item must be an object")
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "item_reference":
        ref = item.get("id")
        found = store.item(ref) if store is not None and isinstance(ref, str) else None
        if found is None:
            raise bad_request(f"{where}: item_reference: no stored item with id {str(ref)[:80]!r}")
        add_item(messages, found, where, None)
    elif kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise bad_request(f"{where}: a message's 'role' must be one of 'user', 'assistant', 'system' or "
                              f"'developer', got {str(role)[:64]!r}")
        parts = content_parts(item.get("content"), where)
        if role == "assistant":
            _add_content(_assistant(messages), parts)
        else:
            messages.append({"role": "system" if role == "developer" else role, "content": parts})
    elif kind == "function_call":
        name, args, call_id = item.get("name"), item.get("arguments"), item.get("call_id")
        if not isinstance(name, str) or not name or not isinstance(args, str) or not isinstance(call_id, str):
            raise bad_request(f"{where}: a function_call needs string 'call_id', 'name' and 'arguments'")
        msg = _assistant(messages)
        msg.setdefault("tool_calls", []).append({"id": call_id, "type": "function",
                                                 "function": {"name": name, "arguments": args}})
    elif kind == "function_call_output":
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str):
            raise bad_request(f"{where}: a function_call_output needs a string 'call_id'")
        if isinstance(output, list):
            output = "\n".join(p["text"] for p in content_parts(output, f"{where}.output"))
        if not isinstance(output, str):
            raise bad_request(f"{where}: a function_call_output's 'output' must be a string or an array of "
                              "input_text parts")
        messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
    elif kind == "reasoning":
        content = item.get("content")
        if content is not None and not isinstance(content, list):
            raise bad_request(f"{where}: a reasoning item's 'content' must be an array")
        text = "".join(p["text"] for p in content_parts(content or [], where))
        if text:  # a summary is not the reasoning, and encrypted content means nothing here: dropped
            msg = _assistant(messages)
            msg["reasoning_content"] = msg.get("reasoning_content", "") + text
    else:
        raise bad_request(f"{where}: unsupported input item type {str(kind)[:64]!r} (this server takes messages, "
                          "function_call, function_call_output, reasoning and item_reference items)")


def _count_parts(items: list[Any]) -> None:
    """At most ``MAX_MESSAGES`` content parts in all over the input items (a message's ``content``, a
    function_call_output's ``output``, a reasoning item's ``content``), counted before any is read."""
    n = sum(len(part) for item in items if isinstance(item, Mapping)
            for part in (item.get("content"), item.get("output")) if isinstance(part, list))
    if n > MAX_MESSAGES:
        raise bad_request(f"Field 'input': at most {MAX_MESSAGES} content parts in all, got {n}")


def input_messages(body: Mapping[str, Any], history: list[dict[str, Any]],
                   store: ResponseStore | None) -> list[dict[str, Any]]:
    """``input`` (a string: one user message; or an array of items) after ``history`` (the previous response's
    conversation), as chat messages with text-part contents: at most ``MAX_MESSAGES`` of them, the history's
    included. A follow-up of a previous response needs new input (its conversation ends with the answer: the chat
    layer would continue that answer, as a prefill)."""
    value = body.get("input")
    if history and (value is None or value == []):
        raise bad_request("Field 'input': a request with 'previous_response_id' needs new input (the previous "
                          "response's conversation ends with its answer)")
    messages = copy.deepcopy(history)  # items merge into its last message: the stored one stays as it was
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
    elif isinstance(value, list):
        if len(value) > MAX_MESSAGES:
            raise bad_request(f"Field 'input': at most {MAX_MESSAGES} items, got {len(value)}")
        _count_parts(value)
        for i, item in enumerate(value):
            add_item(messages, item, f"input[{i}]", store)
    elif value is None:
        raise bad_request("'input' is required")
    else:
        raise bad_request("'input' must be a string or an array of input items")
    if not messages:
        raise bad_request("'input' has no items")
    if len(messages) > MAX_MESSAGES:
        raise bad_request(f"Field 'input': at most {MAX_MESSAGES} messages, got {len(messages)} (the items as chat "
                          "messages, after the previous response's conversation)")
    return messages


# --- the request: tools, text.format, reasoning, sampling fields -------------------------------------------------


def function_tools(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``tools``: the function tools (flat: ``{type, name, description, parameters, strict}``); other types (hosted
    tools: web search, file search, computer use, MCP, shell, namespaces...) are skipped, as llama.cpp skips them,
    their types named in one log line per request (``skipped_types``)."""
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad_request("'tools' must be an array of objects")
    out = []
    skipped: list[str] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise bad_request(f"tools[{i}]: a tool must be an object")
        kind = tool.get("type")
        if kind != "function":
            skipped.append(str(kind)[:64])
            continue
        name, params, desc = tool.get("name"), tool.get("parameters"), tool.get("description")
        if not isinstance(name, str) or not name:
            raise bad_request(f"tools[{i}]: a function tool needs a non-empty string 'name'")
        if params is not None and not isinstance(params, Mapping):
            raise bad_request(f"tools[{i}] ({name}): 'parameters' must be a JSON schema object")
        if desc is not None and not isinstance(desc, str):
            raise bad_request(f"tools[{i}] ({name}): 'description' must be a string")
        out.append({"type": "function", "name": name, "description": desc, "parameters": dict(params or {}),
                    "strict": tool.get("strict", True)})
    if skipped:
        log.info("responses: %d tools skipped (only function tools run here), of types %s", len(skipped),
                 skipped_types(skipped))
    return out


def tool_body(body: Mapping[str, Any], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The tools, ``tool_choice`` and ``parallel_tool_calls`` in chat completions' shapes (for ``tool_request``):
    a choice is auto / none / required, ``{type: function, name}`` or ``{type: allowed_tools, mode, tools}``
    (its function entries name function tools; the others, hosted tools, are skipped). A choice that requires a
    call with no function tool to call is a 400."""
    choice = body.get("tool_choice")
    chat_tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"] or "",
                                                    "parameters": t["parameters"]}} for t in tools]
    if isinstance(choice, Mapping):
        kind = choice.get("type")
        if kind == "function":
            if not isinstance(choice.get("name"), str):
                raise bad_request("Field 'tool_choice': a function choice is {\"type\": \"function\", \"name\": ...}")
            choice = {"type": "function", "function": {"name": choice["name"]}}
        elif kind == "allowed_tools":
            allowed = choice.get("tools")
            mode = choice.get("mode", "auto")
            if not isinstance(allowed, list) or mode not in ("auto", "required"):
                raise bad_request("Field 'tool_choice': allowed_tools needs 'mode' auto or required and 'tools'")
            names = allowed_names(allowed)
            chat_tools = [t for t in chat_tools if t["function"]["name"] in names]
            if mode == "required" and not chat_tools:
                raise bad_request("Field 'tool_choice': allowed_tools with mode 'required' allows none of the "
                                  "request's function tools")
            choice = mode
        else:
            raise bad_request(f"Field 'tool_choice': {str(kind)[:64]!r} tools do not run here (only function tools)")
    elif choice is not None and choice not in ("auto", "none", "required"):
        raise bad_request(f"Field 'tool_choice': must be \"auto\", \"none\", \"required\" or an object, got "
                          f"{str(choice)[:64]!r}")
    if not chat_tools:
        if choice == "required" or isinstance(choice, Mapping):
            raise bad_request("Field 'tool_choice': a required or named tool choice needs at least one function "
                              "tool in 'tools'")
        choice = None  # nothing to call: the choice says nothing
    out: dict[str, Any] = {"tools": chat_tools, "tool_choice": choice}
    if body.get("parallel_tool_calls") is not None:
        out["parallel_tool_calls"] = body["parallel_tool_calls"]
    return out


def allowed_names(allowed: list[Any]) -> set[str]:
    """The names of ``allowed_tools``' function entries (``{"type": "function", "name": ...}``), checked."""
    names = set()
    for k, t in enumerate(allowed):
        if not isinstance(t, Mapping):
            raise bad_request(f"Field 'tool_choice': allowed_tools.tools[{k}] must be an object")
        if t.get("type") != "function":
            continue
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request(f"Field 'tool_choice': allowed_tools.tools[{k}] needs a non-empty string 'name'")
        names.add(name)
    return names


def text_schema(body: Mapping[str, Any]) -> Any:
    """``text.format``'s response schema: None for text, any object for ``json_object``, the schema of
    ``json_schema`` (a 400 without one)."""
    text = body.get("text")
    if text is None:
        return None
    if not isinstance(text, Mapping):
        raise bad_request("'text' must be an object")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, Mapping):
            raise bad_request("text.format: a json_schema format needs its 'schema' (an object)")
        check_schema(schema)
        return dict(schema)
    raise bad_request(f"text.format: 'type' must be one of 'text', 'json_object' or 'json_schema', got "
                      f"{str(kind)[:64]!r}")


def thinking_options(body: Mapping[str, Any]) -> dict[str, Any]:
    """``reasoning`` and the llama.cpp extras as ``chat_options``' body: effort ``none`` / ``minimal`` turns
    thinking off, another effort on (``enable_thinking``); ``summary`` is accepted (no summaries are made)."""
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, Mapping):
        raise bad_request("'reasoning' must be an object")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise bad_request("'chat_template_kwargs' must be an object")
    kwargs = dict(kwargs)
    effort = (reasoning or {}).get("effort")
    if effort is not None:
        if effort not in ("none", "minimal", "low", "medium", "high", "xhigh"):
            raise bad_request(f"reasoning.effort: must be one of none, minimal, low, medium, high or xhigh, got "
                              f"{str(effort)[:64]!r}")
        kwargs.setdefault("enable_thinking", effort not in ("none", "minimal"))
    out: dict[str, Any] = {"chat_template_kwargs": kwargs}
    if body.get("reasoning_format") is not None:
        out["reasoning_format"] = body["reasoning_format"]
    return out


def sampling_fields(body: Mapping[str, Any], n_ctx: int, schema: Any) -> dict[str, Any]:
    """llama-server's sampling fields: the request's llama.cpp extras (``top_k``, ``min_p``, ``seed``,
    ``samplers``...), ``temperature`` / ``top_p``, ``stream``, and ``max_output_tokens`` as ``n_predict`` (capped
    to a slot's context, not refused: Codex probes with 1)."""
    fields = {k: v for k, v in body.items() if k not in RESPONSES_KEYS}
    limit = body.get("max_output_tokens")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise bad_request(f"Field 'max_output_tokens': must be a positive integer, got {str(limit)[:32]}")
        fields["n_predict"] = min(limit, n_ctx)
    if schema is not None:
        if fields.get("grammar") is not None:
            raise bad_request("Cannot use both text.format json_schema and grammar")
        fields["json_schema"] = schema
    return fields


def validate_settings(body: Mapping[str, Any]) -> None:
    """The tolerated fields Codex and the Agents SDK send, checked for their types only (their meaning is
    OpenAI's hosting: caching keys, tiers, metadata)."""
    for key in ("store", "background", "parallel_tool_calls", "stream"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise bad_request(f"Field '{key}': must be true or false")
    if body.get("background"):
        raise bad_request("Field 'background': background responses are not supported")
    for key in ("metadata", "client_metadata", "stream_options"):
        if body.get(key) is not None and not isinstance(body[key], Mapping):
            raise bad_request(f"Field '{key}': must be an object")
    if body.get("include") is not None and not isinstance(body["include"], list):
        raise bad_request("Field 'include': must be an array of strings")
    if body.get("instructions") is not None and not isinstance(body["instructions"], str):
        raise bad_request("Field 'instructions': must be a string")
    if body.get("previous_response_id") is not None and not isinstance(body["previous_response_id"], str):
        raise bad_request("Field 'previous_response_id': must be a string")


# --- the answer: output items, usage, the response object ------------------------------------------------------


def reasoning_item(rid: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"id": rid, "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}],
            "encrypted_content": None, "status": status}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(mid: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"id": mid, "type": "message", "role": "assistant", "status": status, "content": [text_part(text)]}


def call_item(fid: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"id": fid, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def call_ids(tool_id: str) -> tuple[str, str]:
    """A tool call's item id and ``call_id`` (``fc_`` / ``call_`` + the call's id, as llama.cpp names them)."""
    return "fc_" + tool_id, tool_id if tool_id.startswith("call_") else "call_" + tool_id


def output_items(msg: ChatMessage, incomplete: bool) -> list[dict[str, Any]]:
    """A whole answer as output items: its reasoning, its text, its calls (``to_json_oaicompat_resp``)."""
    out = []
    if msg.reasoning_content:
        out.append(reasoning_item(new_id("rs_"), msg.reasoning_content))
    if msg.content:
        out.append(message_item(new_id("msg_"), msg.content, "incomplete" if incomplete else "completed"))
    for tc in msg.tool_calls:
        out.append(call_item(*call_ids(tc.id), tc.name, tc.arguments))
    return out


def usage(final: Final | None, reasoning_tokens: int = 0) -> dict[str, Any]:
    n_in = final.n_prompt if final else 0
    n_out = final.n_decoded if final else 0
    return {"input_tokens": n_in,
            "input_tokens_details": {"cached_tokens": final.n_cached if final else 0, "cache_write_tokens": 0},
            "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, n_out)},
            "total_tokens": n_in + n_out}


def assistant_message(output: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The output items as the assistant's chat message (for the stored conversation), or None when empty."""
    msg: dict[str, Any] = {"role": "assistant", "content": ""}
    for item in output:
        if item["type"] == "reasoning":
            msg["reasoning_content"] = item["content"][0]["text"]
        elif item["type"] == "message":
            msg["content"] += "".join(p["text"] for p in item["content"])
        else:
            msg.setdefault("tool_calls", []).append({"id": item["call_id"], "type": "function",
                                                     "function": {"name": item["name"],
                                                                  "arguments": item["arguments"]}})
    return msg if msg["content"] or len(msg) > 2 else None


def answered(history: list[dict[str, Any]], answer: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The conversation to store: ``history`` and the ``answer`` (``assistant_message``). When the history ends
    with the assistant's message, the answer continued it (a prefill): the two are stored as one message, the
    prefill's text first (its parts joined as the chat layer joined them), so a follow-up's conversation never
    ends with two assistant messages."""
    if answer is None:
        return list(history)
    if not history or history[-1]["role"] != "assistant":
        return [*history, answer]
    head = dict(history[-1])
    text = head.get("content") or ""
    text = text if isinstance(text, str) else "\n\n".join(p["text"] for p in text)
    head["content"] = text + answer["content"]
    if answer.get("reasoning_content"):
        head["reasoning_content"] = head.get("reasoning_content", "") + answer["reasoning_content"]
    if answer.get("tool_calls"):
        head["tool_calls"] = [*head.get("tool_calls", []), *answer["tool_calls"]]
    return [*history[:-1], head]


@dataclass
class Settings:
    """What a response echoes of its request (the SDK's ``Response`` reads them back)."""

    model: str
    tools: list[dict[str, Any]]
    body: Mapping[str, Any]
    temperature: float
    top_p: float

    def response(self, rid: str, created: int, status: str, output: list[dict[str, Any]],
                 use: dict[str, Any] | None) -> dict[str, Any]:
        """The response object (``status``: in_progress, completed, incomplete or failed)."""
        b = self.body
        text = b.get("text") if isinstance(b.get("text"), Mapping) else {}
        reasoning = b.get("reasoning") if isinstance(b.get("reasoning"), Mapping) else {}
        return {
            "id": rid, "object": "response", "created_at": created, "status": status,
            "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
            "background": False, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": b.get("instructions"), "max_output_tokens": b.get("max_output_tokens"),
            "max_tool_calls": None, "metadata": b.get("metadata") or {}, "model": self.model, "output": output,
            "parallel_tool_calls": b.get("parallel_tool_calls", True) is not False,
            "previous_response_id": b.get("previous_response_id"), "prompt_cache_key": b.get("prompt_cache_key"),
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "safety_identifier": b.get("safety_identifier"), "service_tier": "default",
            "store": b.get("store", True) is not False, "temperature": self.temperature,
            "text": {"format": (text or {}).get("format") or {"type": "text"}},
            "tool_choice": b.get("tool_choice") or "auto", "tools": self.tools, "top_logprobs": 0,
            "top_p": self.top_p, "truncation": b.get("truncation") or "disabled", "usage": use,
            "user": b.get("user"),
        }
