"""Tools in a chat: the request's tools (``ToolRequest``: OpenAI function tools, the chat layer's one shape; the
Anthropic and Responses routes translate theirs to it), what a template does with them (``probe_tools``, minja's
``chat_template_caps``), and minja's polyfills for what a template does not render."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_TOOLS = 64  # each tool adds grammar rules and trigger patterns that are searched after every token


@dataclass(frozen=True)
class ToolRequest:
    """A chat request's tools (normalised as llama.cpp passes them to templates), its choice and parallelism."""

    tools: tuple[dict[str, Any], ...]
    choice: str  # "auto" | "none" | "required"
    parallel: bool | None  # None: the template's default


def parse_tool_request(body: Mapping[str, Any]) -> ToolRequest | None:
    """``tools`` / ``tool_choice`` / ``parallel_tool_calls`` of a chat request (None: no tools). Malformed ones are a
    400 that says which field and why."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if choice is not None and not isinstance(choice, (str, Mapping)):
        raise ValueError("Field 'tool_choice': must be \"auto\", \"none\", \"required\" or "
                          "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    if isinstance(choice, str) and choice not in ("auto", "none", "required"):
        raise ValueError(f"Invalid tool_choice: {choice}")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ValueError("Field 'parallel_tool_calls': must be true or false")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise ValueError("Expected 'tools' to be an array")
    if len(tools) > MAX_TOOLS:
        raise ValueError(f"Field 'tools': at most {MAX_TOOLS} tools, got {len(tools)} (limit MAX_TOOLS)")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(tool.get("function"),
                                                                                            Mapping):
            raise ValueError(f"tools[{i}]: Unsupported tool type: a tool is "
                              "{\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": {...}}}")
        fn = tool["function"]
        name, description, parameters = fn.get("name"), fn.get("description"), fn.get("parameters")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tools[{i}]: function.name must be a non-empty string")
        if description is not None and not isinstance(description, str):
            raise ValueError(f"tools[{i}] ({name}): function.description must be a string")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise ValueError(f"tools[{i}] ({name}): function.parameters must be a JSON schema object")
        out.append({"type": "function", "function": {"name": name, "description": description or "",
                                                     "parameters": dict(parameters or {})}})
    if isinstance(choice, Mapping):
        fn = choice.get("function")
        wanted = fn.get("name") if isinstance(fn, Mapping) else None
        if choice.get("type") != "function" or not isinstance(wanted, str):
            raise ValueError("Field 'tool_choice': a named choice is "
                              "{\"type\": \"function\", \"function\": {\"name\": ...}}")
        out = [t for t in out if t["function"]["name"] == wanted]
        if not out:
            raise ValueError(f"Field 'tool_choice': the function {wanted!r} is not one of the tools")
        choice = "required"
    return ToolRequest(tuple(out), choice or "auto", parallel)


def tool_parameters(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A tool's parameter schema; none or ``{}`` is an object without properties (``common_chat_tool_parameters``)."""
    params = tool["function"].get("parameters")
    return dict(params) if params else {"type": "object", "properties": {}}


# --- what a template renders ------------------------------------------------------------------------------------

Render = Callable[[list[dict[str, Any]], bool, "list[dict[str, Any]] | None", "dict[str, Any]"], str]




@dataclass(frozen=True)
class ToolProbe:
    """What a template does with tools (minja's ``chat_template_caps``, found by rendering probes), and the example
    call the tools polyfill shows when it does not render tools itself."""

    tools: bool = False
    tool_calls: bool = False
    tool_responses: bool = False
    parallel_tool_calls: bool = False
    object_arguments: bool = False  # renders calls only with object arguments (Llama 3.1)
    example: str = ""




def _call(name: str, arguments: Any) -> dict[str, Any]:
    return {"id": "call_1___", "type": "function", "function": {"arguments": arguments, "name": name}}


def _calls_message(calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": calls}


def probe_tools(render: Render, eos: str) -> ToolProbe:
    """A template's ``ToolProbe``: ``render(messages, add_generation_prompt, tools, extra)`` renders it without
    polyfills; ``eos``: its EOS text (trimmed off the example call)."""

    def probe(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        try:
            return render(messages, False, tools, {})
        except ValueError:
            return ""

    user = {"role": "user", "content": "<User Needle>"}
    tool = {"name": "some_tool", "type": "function", "function": {
        "name": "some_tool", "description": "Some tool.", "parameters": {
            "type": "object", "properties": {"arg": {"type": "string", "description": "Some argument."}},
            "required": ["arg"]}}}
    supports_tools = "some_tool" in probe([user], [tool])
    args = {"argument_needle": "print('Hello, World!')"}

    def renders_args(arguments: Any) -> bool:
        out = probe([user, _calls_message([_call("ipython", arguments)])])
        return ('"argument_needle":' in out or "'argument_needle':" in out
                or "<parameter=argument_needle>" in out)  # minja's check for XML parameters (Qwen3-Coder)

    as_str, as_obj = renders_args(json.dumps(args)), renders_args(args)
    calls, obj_args = as_str or as_obj, not as_str and as_obj
    parallel = responses = False
    if calls:
        dummy = args if obj_args else json.dumps(args)
        tc1, tc2 = _call("test_tool1", dummy), _call("test_tool2", dummy)
        out = probe([user, _calls_message([tc1, tc2])])
        parallel = "test_tool1" in out and "test_tool2" in out
        out = probe([user, _calls_message([tc1]), {"role": "tool", "name": "test_tool1", "content": "Some response!",
                                                  "tool_call_id": "call_911_"}])
        responses = "Some response!" in out
    caps = ToolProbe(supports_tools, calls, responses, parallel, obj_args)
    if not supports_tools:
        caps = ToolProbe(supports_tools, calls, responses, parallel, obj_args, _example(render, caps, eos))
    return caps


def _example(render: Render, caps: ToolProbe, eos: str) -> str:
    """minja's example tool call: what the template (with the polyfills) writes for one call after a user turn."""
    user = {"role": "user", "content": "Hey"}
    args = {"arg1": "some_value"}
    call = _calls_message([_call("tool_name", args if caps.object_arguments else json.dumps(args))])
    try:
        prefix = render(polyfill([user], None, caps), True, None, {})
        full = render(polyfill([user, call], None, caps), False, None, {})
    except ValueError:
        return ""
    last = full.rfind(eos) if eos else -1
    if eos and last >= 0 and (last == len(prefix) - len(eos) or (full.endswith("\n") and
                                                                  last == len(full) - len(eos) - 1)):
        full = full[:last]
    n = 0
    for i in range(min(len(prefix), len(full))):
        if prefix[i] != full[i]:
            break
        if prefix[i] != "<":  # DeepSeek R1 diverges at a tag: the "<" stays in the example
            n = i + 1
    example = full[n:]
    return example if "tool_name" in example or "some_value" in example else ""


def add_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """``text`` appended to the system message (after a blank line), or as a new first system message."""
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def polyfill(messages: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
             caps: ToolProbe) -> list[dict[str, Any]]:
    """minja's polyfills for what the template does not render: the tools in the system prompt (with the example
    call), past calls as ``{"tool_calls": [...]}`` JSON content, results as user messages ``{"tool_response":
    ...}``, and string arguments parsed to objects for templates that render only objects."""
    has_calls = any(m.get("tool_calls") for m in messages)
    fill_tools = bool(tools) and not caps.tools
    fill_calls = has_calls and not caps.tool_calls
    fill_results = any(m["role"] == "tool" for m in messages) and not caps.tool_responses
    fill_args = has_calls and (caps.object_arguments or fill_calls)
    if fill_tools:
        messages = add_system(messages, "You can call any of the following tools to satisfy the user's requests: "
                              + dump2(list(tools or ())) + (f"\n\nExample tool call syntax:\n\n{caps.example}\n\n"
                                                             if caps.example else ""))
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls") and fill_args:
            m["tool_calls"] = [_object_arguments(tc) for tc in m["tool_calls"]]
        if m.get("tool_calls") and fill_calls:
            calls = []
            for tc in m["tool_calls"]:
                fn = tc["function"]
                calls.append({"name": fn["name"], "arguments": fn["arguments"], **({"id": tc["id"]} if "id" in tc
                                                                                  else {})})
            obj: dict[str, Any] = {"tool_calls": calls}
            if m.get("content"):
                obj["content"] = m["content"]
            m["content"] = dump2(obj)
            del m["tool_calls"]
        if fill_results and m["role"] == "tool":
            response: dict[str, Any] = {}
            if "name" in m:
                response["tool"] = m.pop("name")
            response["content"] = m["content"]
            if "tool_call_id" in m:
                response["tool_call_id"] = m["tool_call_id"]
            m["role"], m["content"] = "user", dump2({"tool_response": response})
        out.append(m)
    return out


def _object_arguments(tc: Mapping[str, Any]) -> dict[str, Any]:
    fn = tc["function"]
    args = fn["arguments"]
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):  # not JSON, or nested past Python's stack: rendered as the text
            pass
    return {**tc, "function": {**fn, "arguments": args}}


def tool_names(tools: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Each tool's name and parameter schema."""
    return [(t["function"]["name"], tool_parameters(t)) for t in tools]


def dump2(value: Any) -> str:
    """JSON with an indent of 2 and non-ASCII kept (minja's polyfills and llama.cpp's generic format write it)."""
    return json.dumps(value, indent=2, ensure_ascii=False)
