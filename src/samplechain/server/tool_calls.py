"""Tool calls on the chat routes, as llama.cpp's chat formats do them (``common/chat.cpp``, its classic handlers):
the format a template implies, the prompt with the tools in it, the (lazy) grammar that makes every call's arguments
valid JSON for its tool's schema, and the parse of the output into OpenAI ``tool_calls``, whole or as stream deltas.

Formats, chosen from the template's source as ``common_chat_templates_apply_jinja`` chooses them:

- **Hermes 2 Pro** (Hermes 2/3, Qwen 2.5, Qwen 3: the template writes ``<tool_call>``):
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, several when parallel calls are allowed;
- **Llama 3.x** (the template has an ``ipython`` turn): ``{"name": ..., "parameters": {...}}`` at the start of
  the answer, and with ``<|python_tag|>`` in the template the built-in tools (``<|python_tag|>name.call(k=v)``);
- **Mistral Nemo** (``[TOOL_CALLS]``): ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "<9 alnum>"}]``;
- **Generic**, any other template: the system prompt asks for JSON, and the grammar (not lazy) allows only
  ``{"tool_call": {...}}`` (``{"tool_calls": [...]}`` with parallel calls) or ``{"response": "..."}``.

A template that does not render tools, tool calls or tool results gets minja's polyfills (what llama.cpp's template
engine did for the classic formats): the tools described in the system prompt with an example call, past calls and
results written as JSON messages. ``tool_choice``: ``auto`` (lazy grammar: free text until a trigger), ``required``
(the grammar from the first token), ``none`` (tools rendered, no grammar, no parsing), or a named function (only
that tool, required: OpenAI's meaning; llama-server reads it as ``auto``). ``parallel_tool_calls`` defaults to
whether the template renders several calls. Arguments are returned as generated (llama-server's current parser):
the raw JSON text of the arguments object.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from samplechain.grammar.json_schema import GrammarBuilder
from samplechain.params.checks import TRIGGER_PATTERN, TRIGGER_PATTERN_FULL, TRIGGER_WORD
from samplechain.server.limits import APIError, bad_request, check_schema

MAX_TOOLS = 64  # each tool adds grammar rules and trigger patterns that are searched after every token

CONTENT_ONLY = "Content-only"
GENERIC = "Generic"
MISTRAL_NEMO = "Mistral Nemo"
LLAMA_3_X = "Llama 3.x"
LLAMA_3_X_BUILTIN = "Llama 3.x with builtin tools"
HERMES_2_PRO = "Hermes 2 Pro"

GENERIC_SYSTEM = ("Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` reply "
                  "to the user's request")
_ALNUM = string.ascii_letters + string.digits


# --- the request ----------------------------------------------------------------------------------------------


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
        raise bad_request("Field 'tool_choice': must be \"auto\", \"none\", \"required\" or "
                          "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    if isinstance(choice, str) and choice not in ("auto", "none", "required"):
        raise bad_request(f"Invalid tool_choice: {choice}")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("Field 'parallel_tool_calls': must be true or false")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise bad_request("Expected 'tools' to be an array")
    if len(tools) > MAX_TOOLS:
        raise bad_request(f"Field 'tools': at most {MAX_TOOLS} tools, got {len(tools)} (limit MAX_TOOLS)")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(tool.get("function"),
                                                                                            Mapping):
            raise bad_request(f"tools[{i}]: Unsupported tool type: a tool is "
                              "{\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": {...}}}")
        fn = tool["function"]
        name, description, parameters = fn.get("name"), fn.get("description"), fn.get("parameters")
        if not isinstance(name, str) or not name:
            raise bad_request(f"tools[{i}]: function.name must be a non-empty string")
        if description is not None and not isinstance(description, str):
            raise bad_request(f"tools[{i}] ({name}): function.description must be a string")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise bad_request(f"tools[{i}] ({name}): function.parameters must be a JSON schema object")
        out.append({"type": "function", "function": {"name": name, "description": description or "",
                                                     "parameters": dict(parameters or {})}})
    try:
        check_schema([t["function"]["parameters"] for t in out])
    except APIError as e:
        raise bad_request(str(e.message).replace("Field 'json_schema': the schema", "Field 'tools': the schemas"),
                          ) from None
    if isinstance(choice, Mapping):
        fn = choice.get("function")
        wanted = fn.get("name") if isinstance(fn, Mapping) else None
        if choice.get("type") != "function" or not isinstance(wanted, str):
            raise bad_request("Field 'tool_choice': a named choice is "
                              "{\"type\": \"function\", \"function\": {\"name\": ...}}")
        out = [t for t in out if t["function"]["name"] == wanted]
        if not out:
            raise bad_request(f"Field 'tool_choice': the function {wanted!r} is not one of the tools")
        choice = "required"
    return ToolRequest(tuple(out), choice or "auto", parallel)


def tool_parameters(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A tool's parameter schema; none or ``{}`` is an object without properties (``common_chat_tool_parameters``)."""
    params = tool["function"].get("parameters")
    return dict(params) if params else {"type": "object", "properties": {}}


# --- what a template renders ------------------------------------------------------------------------------------

Render = Callable[[list[dict[str, Any]], bool, "list[dict[str, Any]] | None", "dict[str, Any]"], str]


@dataclass(frozen=True)
class ToolCaps:
    """What a template does with tools (minja's ``chat_template_caps``, found by rendering probes), and the example
    call the tools polyfill shows when it does not render tools itself."""

    tools: bool = False
    tool_calls: bool = False
    tool_responses: bool = False
    parallel_tool_calls: bool = False
    object_arguments: bool = False  # renders calls only with object arguments (Llama 3.1)
    example: str = ""


_CAPS: dict[tuple[str, str, str], ToolCaps] = {}


def _call(name: str, arguments: Any) -> dict[str, Any]:
    return {"id": "call_1___", "type": "function", "function": {"arguments": arguments, "name": name}}


def _calls_message(calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": calls}


def tool_caps(render: Render, key: tuple[str, str, str]) -> ToolCaps:
    """The template's ``ToolCaps`` (cached by ``key``: its source, BOS and EOS texts); ``render(messages,
    add_generation_prompt, tools, extra)`` renders it without polyfills."""
    if key in _CAPS:
        return _CAPS[key]

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
        return '"argument_needle":' in out or "'argument_needle':" in out

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
    caps = ToolCaps(supports_tools, calls, responses, parallel, obj_args)
    if not supports_tools:
        caps = ToolCaps(supports_tools, calls, responses, parallel, obj_args, _example(render, caps, key[2]))
    _CAPS[key] = caps
    return caps


def _example(render: Render, caps: ToolCaps, eos: str) -> str:
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


def _dump2(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def polyfill(messages: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
             caps: ToolCaps) -> list[dict[str, Any]]:
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
                              + _dump2(list(tools or ())) + (f"\n\nExample tool call syntax:\n\n{caps.example}\n\n"
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
            m["content"] = _dump2(obj)
            del m["tool_calls"]
        if fill_results and m["role"] == "tool":
            response: dict[str, Any] = {}
            if "name" in m:
                response["tool"] = m.pop("name")
            response["content"] = m["content"]
            if "tool_call_id" in m:
                response["tool_call_id"] = m["tool_call_id"]
            m["role"], m["content"] = "user", _dump2({"tool_response": response})
        out.append(m)
    return out


def _object_arguments(tc: Mapping[str, Any]) -> dict[str, Any]:
    fn = tc["function"]
    args = fn["arguments"]
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass
    return {**tc, "function": {**fn, "arguments": args}}


# --- formats: prompt, grammar, triggers -------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatFormat:
    """What a chat format adds to a request: its grammar (lazy or not) with triggers and preserved tokens, extra
    stop strings, and whether the output is parsed for tool calls (``common_chat_params``)."""

    name: str = CONTENT_ONLY
    parse_tools: bool = False
    grammar: str = ""
    grammar_lazy: bool = False
    triggers: tuple[tuple[int, str], ...] = ()  # (TRIGGER_*, value)
    preserved_tokens: tuple[str, ...] = ()
    stops: tuple[str, ...] = ()


def detect_format(source: str, request: ToolRequest | None, json_schema: Any) -> str:
    """The chat format for a template's source, in ``common_chat_templates_apply_jinja``'s order."""
    if "<tool_call>" in source and json_schema is None:
        return HERMES_2_PRO
    if request is not None and json_schema is not None:
        return GENERIC  # tools mixed with a response schema
    if "<|start_header_id|>ipython<|end_header_id|>" in source:
        return LLAMA_3_X_BUILTIN if "<|python_tag|>" in source else LLAMA_3_X
    if request is None or request.choice == "none":
        return CONTENT_ONLY
    if "[TOOL_CALLS]" in source:
        return MISTRAL_NEMO
    return GENERIC


@dataclass
class ChatPrompt:
    """A chat request's rendered prompt, the generation prompt it ends with, and its format."""

    prompt: str
    generation_prompt: str
    format: ChatFormat


def render_chat(render: Render, source: str, caps: ToolCaps, messages: list[dict[str, Any]],
                request: ToolRequest | None, add_generation_prompt: bool, *, enable_thinking: bool | None = None,
                json_schema: Any = None) -> ChatPrompt:
    """The prompt (through ``render(messages, add_generation_prompt, tools, extra_variables)``) and the format of a
    chat request, with its tools: the format's handler of ``common_chat_templates_apply_jinja``."""
    name = detect_format(source, request, json_schema)
    tools = list(request.tools) if request is not None else None
    active = request is not None and request.choice != "none"
    parallel = request.parallel if request is not None and request.parallel is not None else caps.parallel_tool_calls
    extra: dict[str, Any] = {}
    fmt = ChatFormat(name if active else CONTENT_ONLY)
    if name == GENERIC and active:
        messages = add_system(messages, GENERIC_SYSTEM)
    msgs = polyfill(messages, tools, caps)
    builtin: list[str] = []
    if active and request is not None:
        required = request.choice == "required"
        if name == GENERIC:
            fmt = _generic(request.tools, required, parallel, json_schema)
        elif name == MISTRAL_NEMO:
            fmt = _mistral_nemo(request.tools, required, parallel)
        elif name in (LLAMA_3_X, LLAMA_3_X_BUILTIN):
            fmt, builtin = _llama_3_x(request.tools, required, name == LLAMA_3_X_BUILTIN)
    if name in (LLAMA_3_X, LLAMA_3_X_BUILTIN) and tools:
        extra = {"tools_in_user_message": False, **({"builtin_tools": builtin} if builtin else {})}

    def text(add: bool) -> str:
        return render(msgs, add, tools, extra)

    prompt, without = text(add_generation_prompt), text(False)
    generation = prompt[len(without):] if prompt.startswith(without) else ""
    if name == HERMES_2_PRO:
        forced_open = False
        if prompt.endswith("<think>\n"):
            if enable_thinking is False:
                prompt += "</think>"
            else:
                forced_open = True
        if active and request is not None:
            fmt = _hermes_2_pro(request.tools, request.choice == "required", parallel, forced_open)
    return ChatPrompt(prompt, generation, fmt)


def _tool_names(tools: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(t["function"]["name"], tool_parameters(t)) for t in tools]


def _generic(tools: Sequence[Mapping[str, Any]], required: bool, parallel: bool, json_schema: Any) -> ChatFormat:
    """``{"tool_call": {...}}`` / ``{"tool_calls": [...]}`` or ``{"response": ...}``: the whole answer is JSON."""
    schemas = []
    for tool in tools:
        fn = tool["function"]
        schema: dict[str, Any] = {"type": "object", "properties": {
            "name": {"type": "string", "const": fn["name"]}, "arguments": tool_parameters(tool)},
            "required": ["name", "arguments"]}
        if "description" in fn:
            schema["description"] = fn["description"]
        if parallel:
            schema["properties"]["id"] = {"type": "string", "minLength": 4}
            schema["required"].append("id")
        schemas.append(schema)
    one = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    call = ({"type": "object", "properties": {"tool_calls": {"type": "array", "items": one, "minItems": 1}},
             "required": ["tool_calls"]} if parallel else
            {"type": "object", "properties": {"tool_call": one}, "required": ["tool_call"]})
    if not required:
        response = {"type": "string"} if json_schema is None else json_schema
        call = {"anyOf": [call, {"type": "object", "properties": {"response": response}, "required": ["response"]}]}
    b = GrammarBuilder()
    b.add_schema("root", call)
    return ChatFormat(GENERIC, True, b.text())


def _mistral_nemo(tools: Sequence[Mapping[str, Any]], required: bool, parallel: bool) -> ChatFormat:
    """``[TOOL_CALLS]`` then an array of calls with 9-character ids."""
    schemas = [{"type": "object", "properties": {
        "name": {"type": "string", "const": name}, "arguments": params,
        "id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}}, "required": ["name", "arguments", "id"]}
        for name, params in _tool_names(tools)]
    schema: dict[str, Any] = {"type": "array", "items": schemas[0] if len(schemas) == 1 else {"anyOf": schemas},
                              "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    b = GrammarBuilder()
    b.add_rule("root", f'{b.literal("[TOOL_CALLS]")} {b.add_schema("tool_calls", schema)}')
    return ChatFormat(MISTRAL_NEMO, True, b.text(), not required, ((TRIGGER_WORD, "[TOOL_CALLS]"),),
                      ("[TOOL_CALLS]",))


_BUILTIN_ARGS = {"wolfram_alpha": ("query",), "web_search": ("query",), "brave_search": ("query",),
                 "python": ("code",), "code_interpreter": ("code",)}


def _expect_parameters(name: str, params: Mapping[str, Any], expected: tuple[str, ...]) -> None:
    props, req = params.get("properties"), params.get("required")
    if params.get("type") != "object" or not isinstance(props, Mapping) or not isinstance(req, list):
        raise bad_request(f"Parameters of tool {name} must be an object w/ required properties")
    for prop in expected:
        if prop not in props:
            raise bad_request(f"Parameters of tool {name} is missing property: {prop}")
        if prop not in req:
            raise bad_request(f"Parameters of tool {name} must have property marked as required: {prop}")
    if len(props) != len(expected):
        raise bad_request(f"Parameters of tool {name} must only have these properties:{', '.join(expected)}")


def _llama_3_x(tools: Sequence[Mapping[str, Any]], required: bool, allow_builtin: bool,
               ) -> tuple[ChatFormat, list[str]]:
    """``{"name": ..., "parameters": {...}}`` (optionally ``"type": "function"`` first), and the built-in tools as
    ``<|python_tag|>name.call(key=value, ...)`` when the template has them."""
    b = GrammarBuilder()
    lit = b.literal
    rules, builtin = [], []
    for name, params in _tool_names(tools):
        if allow_builtin and name in _BUILTIN_ARGS:
            _expect_parameters(name, params, _BUILTIN_ARGS[name])
            kvs = [f"{lit(key + '=')} {b.add_schema(f'{name}-args-{key}', value, params)}"
                   for key, value in params["properties"].items()]
            rules.append(b.add_rule(f"{name}-call", f'{lit(f"<|python_tag|>{name}.call(")} '
                                    + f' {lit(", ")} '.join(kvs) + f' {lit(")")}'))
            builtin.append(name)
        args = b.add_schema(f"{name}-args", params, params)
        rules.append(b.add_rule(
            f"{name}-call",
            f'{lit("{")} space ( {lit(chr(34) + "type" + chr(34))} space {lit(":")} space '
            f'{lit(chr(34) + "function" + chr(34))} space {lit(",")} space )? '
            f'{lit(chr(34) + "name" + chr(34))} space {lit(":")} space {lit(json.dumps(name))} space {lit(",")} '
            f'space {lit(chr(34) + "parameters" + chr(34))} space {lit(":")} space {args} {lit("}")} space'))
    b.add_rule("root", " | ".join(rules))
    triggers = [(TRIGGER_PATTERN_FULL, r'(\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*")[\s\S]*')]
    preserved = []
    if builtin:
        triggers.append((TRIGGER_WORD, "<|python_tag|>"))
        preserved.append("<|python_tag|>")
    name = LLAMA_3_X_BUILTIN if builtin else LLAMA_3_X
    return ChatFormat(name, True, b.text(), not required, tuple(triggers), tuple(preserved), ("<|eom_id|>",)), builtin


_HERMES_TAGS = ("function_call", "response", "tools", "json", "xml", "JSON")
_HERMES_PRESERVED = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<function", "<tools>", "</tools>",
                     "<response>", "</response>", "<function_call>", "</function_call>", "<json>", "</json>", "<JSON>",
                     "</JSON>", "```", "```json", "```xml")


def _hermes_2_pro(tools: Sequence[Mapping[str, Any]], required: bool, parallel: bool,
                  forced_open: bool) -> ChatFormat:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, and the variants models write instead
    (``<function=name>``, other tags, fenced blocks)."""
    b = GrammarBuilder()
    lit = b.literal
    calls, alts, names, triggers = [], [], [], []
    for name, params in _tool_names(tools):
        calls.append(b.add_schema(f"{name}-call", {"type": "object", "properties": {
            "name": {"const": name}, "arguments": params}, "required": ["name", "arguments"]}, params))
        alts.append(b.add_rule(f"{name}-function-tag", f'{lit("<function")} ( {lit("=" + name)} | '
                               f'{lit(f" name={chr(34)}{name}{chr(34)}")} ) {lit(">")} space '
                               f'{b.add_schema(f"{name}-args", params, params)} {lit("</function>")} space'))
        triggers.append((TRIGGER_WORD, f"<function={name}>"))
        triggers.append((TRIGGER_PATTERN, r'<function\s+name\s*=\s*"' + re.escape(name) + '"'))
        names.append(re.escape(name))
    any_call = b.add_rule("any_tool_call", f"( {' | '.join(calls)} ) space")
    tagged = [any_call, f'{lit("<tool_call>")} space {any_call} {lit("</tool_call>")}',
              *(f'{lit(f"<{t}>")} space {any_call} {lit(f"</{t}>")}' for t in _HERMES_TAGS)]
    wrappable = b.add_rule("wrappable_tool_call", f"( {' | '.join(tagged)} ) space")
    alts.append(wrappable)
    alts.append(f'( {lit("```" + chr(10))} | {lit("```json" + chr(10))} | {lit("```xml" + chr(10))} ) space '
                f'{wrappable} space {lit("```")} space ')
    tool_call = b.add_rule("tool_call", " | ".join(alts))
    b.add_rule("root", (f'( {lit("</think>")} space )? ' if forced_open else "")
               + (f"({tool_call})+" if parallel else tool_call))
    think = r"[\s\S]*?(</think>\s*)" if forced_open else r"(?:<think>[\s\S]*?</think>\s*)?"
    triggers.append((TRIGGER_PATTERN_FULL, think + r"(\s*(?:<tool_call>|<function|(?:```(?:json|xml)?" + "\n"
                     + r'\s*)?(?:<function_call>|<tools>|<xml><json>|<response>)?\s*\{\s*"name"\s*:\s*"(?:'
                     + "|".join(names) + r')"))[\s\S]*'))
    return ChatFormat(HERMES_2_PRO, True, b.text(), not required, tuple(triggers), _HERMES_PRESERVED)


# --- parsing the output -----------------------------------------------------------------------------------------


@dataclass
class ToolCall:
    """One parsed call: ``arguments`` is the JSON text of the arguments as generated."""

    name: str
    arguments: str
    id: str = ""


@dataclass
class ParsedMessage:
    """An answer split into its text and its tool calls (``common_chat_msg``, without the reasoning)."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


class _Invalid(ValueError):
    """The output does not have the format's shape (a final parse then keeps it all as content)."""


_WS = " \t\n\r"
_SCALAR = re.compile(r"[-+0-9.eEa-zA-Z]+")


def _skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _string_end(s: str, i: int) -> int | None:
    j = i + 1
    while j < len(s):
        if s[j] == "\\":
            j += 2
        elif s[j] == '"':
            return j + 1
        else:
            j += 1
    return None


def _value_end(s: str, i: int, final: bool) -> int | None:
    """Where the JSON value at ``s[i]`` ends (None: the text ends inside it). It finds the end; validation is
    ``json.loads``'s, on complete values."""
    if i >= len(s):
        return None
    if s[i] == '"':
        return _string_end(s, i)
    if s[i] in "{[":
        depth, j = 0, i
        while j < len(s):
            c = s[j]
            if c == '"':
                end = _string_end(s, j)
                if end is None:
                    return None
                j = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return None
    m = _SCALAR.match(s, i)
    if m is None:
        raise _Invalid(f"not JSON at {s[i:i + 20]!r}")
    return m.end() if final or m.end() < len(s) else None


def _members(s: str, i: int, final: bool) -> tuple[list[tuple[str, int, int | None]], int | None]:
    """The members of the object at ``s[i]``, in order, as (key, value start, value end or None), and where the
    object ends (None: the text ends inside it)."""
    if s[i] != "{":
        raise _Invalid("expected a JSON object")
    out: list[tuple[str, int, int | None]] = []
    j = _skip_ws(s, i + 1)
    if j < len(s) and s[j] == "}":
        return out, j + 1
    while j < len(s):
        if s[j] != '"':
            raise _Invalid("expected a key")
        key_end = _string_end(s, j)
        if key_end is None:
            return out, None
        key = json.loads(s[j:key_end])
        j = _skip_ws(s, key_end)
        if j >= len(s):
            return out, None
        if s[j] != ":":
            raise _Invalid("expected ':'")
        start = _skip_ws(s, j + 1)
        end = _value_end(s, start, final)
        out.append((key, start, end))
        if end is None:
            return out, None
        j = _skip_ws(s, end)
        if j < len(s) and s[j] == "}":
            return out, j + 1
        if j < len(s) and s[j] != ",":
            raise _Invalid("expected ',' or '}'")
        j = _skip_ws(s, j + 1)
    return out, None


def _items(s: str, i: int, final: bool) -> tuple[list[tuple[int, int | None]], int | None]:
    """The items of the array at ``s[i]`` as (start, end or None), and where the array ends."""
    if s[i] != "[":
        raise _Invalid("expected a JSON array")
    out: list[tuple[int, int | None]] = []
    j = _skip_ws(s, i + 1)
    if j < len(s) and s[j] == "]":
        return out, j + 1
    while j < len(s):
        end = _value_end(s, j, final)
        out.append((j, end))
        if end is None:
            return out, None
        j = _skip_ws(s, end)
        if j < len(s) and s[j] == "]":
            return out, j + 1
        if j < len(s) and s[j] != ",":
            raise _Invalid("expected ',' or ']'")
        j = _skip_ws(s, j + 1)
    return out, None


def _string_member(s: str, members: dict[str, tuple[int, int | None]], key: str) -> str | None:
    if key not in members or members[key][1] is None:
        return None
    start, end = members[key]
    value = json.loads(s[start:end])
    if not isinstance(value, str):
        raise _Invalid(f"{key} must be a string")
    return value


def _raw(s: str, start: int, end: int | None) -> str:
    return s[start:end] if end is not None else s[start:].rstrip(_WS)


def _call_object(s: str, i: int, final: bool, args_key: str = "arguments") -> tuple[ToolCall | None, int | None]:
    """A call written as an object ``{"name": ..., "arguments": ..., "id": ...}`` at ``s[i]``: the call (None while
    its name is incomplete; its arguments as far as they go) and where the object ends."""
    members, end = _members(s, i, final)
    spans = {k: (a, b) for k, a, b in members}
    if end is not None:
        json.loads(s[i:end])  # the whole object is JSON
    name = _string_member(s, spans, "name")
    if name is None:
        if end is not None:
            raise _Invalid("a tool call needs a name")
        return None, end
    if args_key not in spans:
        if end is not None:
            raise _Invalid(f"a tool call needs {args_key}")
        return ToolCall(name, ""), end
    return ToolCall(name, _raw(s, *spans[args_key]), _string_member(s, spans, "id") or ""), end


def _held_back(text: str, openers: Sequence[str]) -> int:
    """Where a possible start of one of ``openers`` begins at the end of ``text`` (len(text): none); whitespace in
    the text is ignored, as the openers' patterns allow it."""
    for k in range(max(0, len(text) - 64), len(text)):
        rest = re.sub(r"\s+", "", text[k:])
        if rest and text[k] not in _WS and any(o.startswith(rest) for o in openers):
            return k
    return len(text)


_HERMES_OPEN = re.compile(
    r'(?:(```(?:xml|json)?\n\s*)?(<tool_call>|<function_call>|<tool>|<tools>|<response>|<json>|<xml>|<JSON>)?'
    r'(\s*\{\s*"name"))|<function=([^>]+)>|<function name="([^"]+)">')
_HERMES_OPENERS = (*(f'{fence}{tag}{{"name"' for fence in ("", "```", "```xml", "```json")
                      for tag in ("", "<tool_call>", "<function_call>", "<tool>", "<tools>", "<response>", "<json>",
                                  "<xml>", "<JSON>")), "<function=", '<functionname="')


def _parse_hermes(text: str, final: bool) -> ParsedMessage:
    msg = ParsedMessage()
    pos = 0
    while True:
        m = _HERMES_OPEN.search(text, pos)
        if m is None:
            break
        msg.content += text[pos:m.start()]
        fence = "```" if m.group(1) else ""
        if m.group(3) is not None:
            tag = m.group(2)
            close = f"</{tag[1:]}" if tag else ""
            call, end = _call_object(text, text.index("{", m.start(3)), final)
        else:
            close = "</function>"
            start = _skip_ws(text, m.end())
            if start >= len(text):
                end, call = None, ToolCall(m.group(4) or m.group(5), "")
            else:
                args_end = _value_end(text, start, final)
                if args_end is not None:
                    json.loads(text[start:args_end])
                call, end = ToolCall(m.group(4) or m.group(5), _raw(text, start, args_end)), args_end
        if call is not None:
            msg.tool_calls.append(call)
        if end is None:
            if final:
                raise _Invalid("incomplete tool call")
            return msg
        pos = _skip_ws(text, end)
        for literal in (close, fence):
            if not literal:
                continue
            if not text.startswith(literal, pos):
                if final or not literal.startswith(text[pos:]):
                    raise _Invalid(f"expected {literal!r}")
                return msg
            pos = _skip_ws(text, pos + len(literal))
    rest = text[pos:]
    msg.content += rest if final else rest[:_held_back(rest, _HERMES_OPENERS)]
    return msg


# llama.cpp's regex wants a space after "parameters": but its own grammar lets the model leave it out (then the call
# is lost as content): any whitespace here
_LLAMA_CALL = re.compile(r'\s*\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*"([^"]+)"\s*,\s*"parameters"\s*:\s*')
_LLAMA_BUILTIN_CALL = re.compile(r"\s*(\w+)\s*\.\s*call\(")
_LLAMA_ARG = re.compile(r"\s*(\w+)\s*=\s*")


def _parse_llama(text: str, final: bool, builtin: bool) -> ParsedMessage:
    if builtin:
        at = text.find("<|python_tag|>")
        if at >= 0:
            return _parse_python_tag(text, at, final)
    m = _LLAMA_CALL.match(text)
    if m is None:
        if not final and (not text.strip() or text.lstrip().startswith("{")):
            return ParsedMessage()  # maybe a call, still coming
        rest = text if final else text[:_held_back(text, ("<|python_tag|>",) if builtin else ())]
        return ParsedMessage(rest)
    start = _skip_ws(text, m.end())
    end = _value_end(text, start, final)
    if end is not None:
        json.loads(text[start:end])
    call = ToolCall(m.group(1), _raw(text, start, end) if start < len(text) else "")
    if end is None:
        if final:
            raise _Invalid("incomplete tool call")
        return ParsedMessage("", [call])
    close = re.compile(r"\}\s*").match(text, end)
    if close is None:
        if final or text[end:].strip():
            raise _Invalid("expected '}'")
        return ParsedMessage("", [call])
    return ParsedMessage(text[_skip_ws(text, close.end()):], [call])


def _parse_python_tag(text: str, at: int, final: bool) -> ParsedMessage:
    """``<|python_tag|>name.call(key=value, ...)``: arguments as a JSON object (a call is whole or not at all)."""
    msg = ParsedMessage(text[:at])
    pos = at + len("<|python_tag|>")
    try:
        m = _LLAMA_BUILTIN_CALL.match(text, pos)
        if m is None:
            raise _Invalid("expected name.call(")
        pos, args = m.end(), {}
        while (arg := _LLAMA_ARG.match(text, pos)) is not None:
            end = _value_end(text, arg.end(), True)
            if end is None:
                raise _Invalid("incomplete argument")
            args[arg.group(1)] = json.loads(text[arg.end():end])
            pos = _skip_ws(text, end)
            if not text.startswith(",", pos):
                break
            pos += 1
        if not text.startswith(")", pos):
            raise _Invalid("expected ')'")
    except (_Invalid, ValueError):
        if final:
            raise
        return msg
    msg.tool_calls.append(ToolCall(m.group(1), json.dumps(args, ensure_ascii=False, separators=(",", ":"))))
    return msg


def _parse_nemo(text: str, final: bool) -> ParsedMessage:
    at = text.find("[TOOL_CALLS]")
    if at < 0:
        return ParsedMessage(text if final else text[:_held_back(text, ("[TOOL_CALLS]",))])
    msg = ParsedMessage(text[:at])
    start = _skip_ws(text, at + len("[TOOL_CALLS]"))
    if start >= len(text):
        if final:
            raise _Invalid("expected an array of tool calls")
        return msg
    items, end = _items(text, start, final)
    for a, _ in items:
        call, _ = _call_object(text, a, final)
        if call is not None:
            msg.tool_calls.append(call)
    if end is None and final:
        raise _Invalid("incomplete tool calls")
    if end is not None:
        msg.content += text[_skip_ws(text, end):]
    return msg


def _partial_string(s: str, start: int, end: int | None) -> str:
    """A JSON string's text as far as it goes (a cut escape waits for the rest)."""
    if end is not None:
        return json.loads(s[start:end])
    raw = s[start:]
    for cut in range(len(raw), max(len(raw) - 6, 0), -1):
        try:
            return json.loads(raw[:cut] + '"')
        except ValueError:
            continue
    return ""


def _parse_generic(text: str, final: bool) -> ParsedMessage:
    start = _skip_ws(text, 0)
    if start >= len(text):
        if final:
            raise _Invalid("expected a JSON object")
        return ParsedMessage()
    members, end = _members(text, start, final)
    if end is not None:
        json.loads(text[start:end])
    elif final:
        raise _Invalid("incomplete JSON")
    msg = ParsedMessage()
    for key, a, b in members:
        if key == "tool_calls" and text[a:a + 1] == "[":
            items, _ = _items(text, a, final)
            for i, _ in items:
                call, _ = _call_object(text, i, final)
                if call is not None:
                    msg.tool_calls.append(call)
            return msg
        if key == "tool_call" and text[a:a + 1] == "{":
            call, _ = _call_object(text, a, final)
            if call is not None:
                msg.tool_calls.append(call)
            return msg
        if key == "response":
            if text[a:a + 1] == '"':
                msg.content = _partial_string(text, a, b)
            elif b is not None:
                msg.content = _dump2(json.loads(text[a:b]))
            return msg
    if final:
        raise _Invalid("expected 'tool_call', 'tool_calls' or 'response' in JSON")
    return msg


_PARSERS: dict[str, Callable[[str, bool], ParsedMessage]] = {
    GENERIC: _parse_generic,
    MISTRAL_NEMO: _parse_nemo,
    LLAMA_3_X: lambda text, final: _parse_llama(text, final, False),
    LLAMA_3_X_BUILTIN: lambda text, final: _parse_llama(text, final, True),
    HERMES_2_PRO: _parse_hermes,
}


def parse_message(fmt: str, text: str, partial: bool = False) -> ParsedMessage:
    """``text`` (the answer, its reasoning already split off) as content and tool calls in format ``fmt``.

    ``partial``: the text so far of a streamed answer; text that may still become a call is held back. A final
    text that does not have the format's shape is all content, without calls (``common_chat_parse``)."""
    parser = _PARSERS.get(fmt)
    if parser is None:
        return ParsedMessage(text)
    try:
        return parser(text, not partial)
    except ValueError:  # _Invalid, or JSON that does not decode
        return ParsedMessage() if partial else ParsedMessage(text)


def tool_call_id() -> str:
    """A tool call's id when the model gives none: 32 random alphanumerics (llama-server's ``gen_tool_call_id``)."""
    return "".join(secrets.choice(_ALNUM) for _ in range(32))


def message_json(msg: ParsedMessage) -> dict[str, Any]:
    """The parsed answer's ``content`` and ``tool_calls`` fields of an OpenAI message."""
    out: dict[str, Any] = {"content": msg.content}
    if msg.tool_calls:
        out["tool_calls"] = [{"type": "function", "function": {"name": tc.name, "arguments": tc.arguments},
                              "id": tc.id} for tc in msg.tool_calls]
    return out


class MessageStream:
    """One choice's answer as it streams: each update parses the text so far and gives the OpenAI deltas since the
    last one (``task_result_state::update_chat_msg`` and ``common_chat_msg_diff::compute_diffs``): content, then
    each call with its id, type and name first and its arguments as they grow. Ids are fixed when a call first
    appears (the model's, else a random one), so the stream's ids are the final message's."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self.text = ""
        self.msg = ParsedMessage()
        self.ids: list[str] = []

    def update(self, text: str, final: bool = False) -> list[dict[str, Any]]:
        """The deltas after ``text`` more of the answer (``final``: the answer is complete)."""
        self.text += text
        new = parse_message(self.fmt, self.text, partial=not final)
        prev = self.msg
        if not final and (not new.content.startswith(prev.content) or len(new.tool_calls) < len(prev.tool_calls)):
            return []  # undecided: wait for more text
        for i, tc in enumerate(new.tool_calls):
            if i == len(self.ids):
                self.ids.append(tc.id or tool_call_id())
            tc.id = self.ids[i]
        self.msg = new
        deltas: list[dict[str, Any]] = []
        if new.content != prev.content and new.content.startswith(prev.content):
            deltas.append({"content": new.content[len(prev.content):]})
        if prev.tool_calls and len(new.tool_calls) >= len(prev.tool_calls):
            i = len(prev.tool_calls) - 1
            a, b = prev.tool_calls[i], new.tool_calls[i]
            grown = b.arguments[len(a.arguments):] if b.arguments.startswith(a.arguments) else ""
            if grown or a.name != b.name:
                deltas.append(_call_delta(i, b, grown, header=a.name != b.name))
        for i in range(len(prev.tool_calls), len(new.tool_calls)):
            deltas.append(_call_delta(i, new.tool_calls[i], new.tool_calls[i].arguments, header=True))
        return deltas


def _call_delta(index: int, call: ToolCall, arguments: str, header: bool) -> dict[str, Any]:
    """A ``tool_calls`` delta (``server_chat_msg_diff_to_json_oaicompat``)."""
    entry: dict[str, Any] = {"index": index}
    if header:
        entry["id"], entry["type"] = call.id, "function"
    fn: dict[str, Any] = {}
    if header:
        fn["name"] = call.name
    if arguments:
        fn["arguments"] = arguments
    if fn:
        entry["function"] = fn
    return {"tool_calls": [entry]}
