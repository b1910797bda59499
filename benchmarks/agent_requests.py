"""Requests shaped like the ones real agent clients send, for replaying against ``samplechain serve``.

The shapes were captured from Claude Code 2.1.328 (``claude -p "Say hi"`` against a stand-in endpoint) and Codex CLI
0.169.0 (``codex exec`` with ``wire_api = "responses"``); the texts here are written for this file (not the
clients' own prompts) at the captured sizes: Claude Code's body is ~87 KB with a ~29k-character system prompt in
text blocks and 12 tools with large ``input_schema``s; Codex's is ~39 KB with developer and user messages of
``input_text`` parts, 7 function tools (``strict: false``), one ``namespace`` tool and one ``web_search`` tool.
Every field either client sends is here, so a server that answers these answers the clients.
"""

from __future__ import annotations

import json
from typing import Any

_GUIDELINES = (
    "Read the files you change before you change them, and keep edits as small as the task allows.",
    "Prefer the dedicated tools over shell commands for reading, searching and editing files.",
    "When a command may take long, say so before you run it, and never start a command that waits for input.",
    "Cite file paths with line numbers when you refer to code, so the user can open them.",
    "Do not invent APIs: search the repository for how a function is used before you call it.",
    "Run the project's tests after a change, and report what passed and what did not, plainly.",
    "Keep answers short: lead with the result, then the reasoning a reader needs to trust it.",
    "Never commit, push or delete anything unless the user asked for it in this conversation.",
)


def _prose(n_chars: int, topic: str) -> str:
    """Deterministic instruction-like text of about ``n_chars`` characters."""
    lines, k = [f"# {topic}"], 0
    while sum(len(line) + 1 for line in lines) < n_chars:
        lines.append(f"- ({k + 1}) {_GUIDELINES[k % len(_GUIDELINES)]}")
        k += 1
    return "\n".join(lines)


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#"}


def _s(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


CLAUDE_CODE_TOOLS: list[tuple[str, dict[str, Any], list[str]]] = [
    ("Bash", {"command": _s("The command to execute"), "timeout": {"type": "number", "description": "Timeout in ms"},
              "description": _s("What the command does, in 5-10 words"),
              "run_in_background": {"type": "boolean", "description": "Run the command in the background"}},
     ["command"]),
    ("Glob", {"pattern": _s("The glob pattern to match files against"), "path": _s("The directory to search in")},
     ["pattern"]),
    ("Grep", {"pattern": _s("The regular expression to search for"), "path": _s("File or directory to search in"),
              "glob": _s("Glob to filter files"), "output_mode": _s("Output mode", enum=["content",
                                                                                      "files_with_matches", "count"]),
              "-i": {"type": "boolean", "description": "Case insensitive search"},
              "-n": {"type": "boolean", "description": "Show line numbers"},
              "head_limit": {"type": "number", "description": "Limit output to the first N entries"},
              "multiline": {"type": "boolean", "description": "Let patterns span lines"}}, ["pattern"]),
    ("Read", {"file_path": _s("The absolute path to the file to read"),
              "offset": {"type": "number", "description": "The line number to start reading from"},
              "limit": {"type": "number", "description": "The number of lines to read"}}, ["file_path"]),
    ("Edit", {"file_path": _s("The absolute path to the file to modify"), "old_string": _s("The text to replace"),
              "new_string": _s("The text to replace it with"),
              "replace_all": {"type": "boolean", "default": False, "description": "Replace every occurrence"}},
     ["file_path", "old_string", "new_string"]),
    ("Write", {"file_path": _s("The absolute path to the file to write"), "content": _s("The content to write")},
     ["file_path", "content"]),
    ("NotebookEdit", {"notebook_path": _s("The absolute path to the notebook"), "cell_id": _s("The cell's id"),
                      "new_source": _s("The new source for the cell"),
                      "cell_type": _s("The cell's type", enum=["code", "markdown"]),
                      "edit_mode": _s("The edit to make", enum=["replace", "insert", "delete"])},
     ["notebook_path", "new_source"]),
    ("WebFetch", {"url": _s("The URL to fetch content from", format="uri"),
                  "prompt": _s("What to extract from the page")}, ["url", "prompt"]),
    ("WebSearch", {"query": _s("The search query to use", minLength=2),
                   "allowed_domains": {"type": "array", "items": {"type": "string"}},
                   "blocked_domains": {"type": "array", "items": {"type": "string"}}}, ["query"]),
    ("TodoWrite", {"todos": {"type": "array", "description": "The updated todo list", "items": {
        "type": "object", "properties": {"content": _s("The task", minLength=1),
                                         "status": _s("Its state", enum=["pending", "in_progress", "completed"]),
                                         "activeForm": _s("The task in the present continuous", minLength=1)},
        "required": ["content", "status", "activeForm"], "additionalProperties": False}}}, ["todos"]),
    ("Agent", {"description": _s("A short (3-5 word) description of the task"),
               "prompt": _s("The task for the agent to perform"),
               "subagent_type": _s("The type of specialized agent to use")},
     ["description", "prompt", "subagent_type"]),
    ("ExitPlanMode", {"plan": _s("The plan to present to the user for approval")}, ["plan"]),
]


def claude_code_body(model: str = "claude-sonnet-4-5-20250929", stream: bool = True) -> dict[str, Any]:
    """A ``POST /v1/messages?beta=true`` body as Claude Code sends it (headers: ``claude_code_headers``)."""
    system = [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
              {"type": "text", "text": _prose(16000, "How to work in this repository"),
               "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": _prose(13000, "Tone, safety and tool use"),
               "cache_control": {"type": "ephemeral"}}]
    tools = [{"name": name, "description": _prose(4200, f"{name}: when and how to use it"),
              "input_schema": _schema(props, required)} for name, props, required in CLAUDE_CODE_TOOLS]
    reminder = "<system-reminder>\nThe user's working directory is /work/app. Today's date is 2026-11-28.\n" \
               "</system-reminder>"
    return {"model": model, "max_tokens": 32000, "stream": stream, "system": system, "tools": tools,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": reminder},
                {"type": "text", "text": "Say hi", "cache_control": {"type": "ephemeral"}}]}],
            "thinking": {"type": "enabled", "budget_tokens": 31999, "display": "omitted"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "metadata": {"user_id": "user_0f3c_account_5d1e_session_9a7b"}}


def claude_code_headers() -> dict[str, str]:
    return {"anthropic-version": "2023-06-01", "x-app": "cli", "anthropic-dangerous-direct-browser-access": "true",
            "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,"
                              "fine-grained-tool-streaming-2025-05-14"}


CODEX_TOOLS: list[tuple[str, dict[str, Any], list[str]]] = [
    ("shell", {"command": {"type": "array", "items": {"type": "string"}, "description": "The command to execute"},
               "workdir": _s("The working directory"), "timeout_ms": {"type": "number", "description": "Timeout"},
               "with_escalated_permissions": {"type": "boolean", "description": "Run outside the sandbox"},
               "justification": _s("Why escalation is needed")}, ["command"]),
    ("update_plan", {"explanation": _s("What changed in the plan"), "plan": {"type": "array", "items": {
        "type": "object", "properties": {"step": {"type": "string"}, "status": {
            "type": "string", "enum": ["pending", "in_progress", "completed"]}},
        "required": ["step", "status"], "additionalProperties": False}}}, ["plan"]),
    ("apply_patch", {"input": _s("The entire contents of the apply_patch command")}, ["input"]),
    ("view_image", {"path": _s("Local filesystem path to an image file")}, ["path"]),
    ("list_mcp_resources", {"server": _s("The MCP server's name"), "cursor": _s("A pagination cursor")}, []),
    ("list_mcp_resource_templates", {"server": _s("The MCP server's name"), "cursor": _s("A pagination cursor")}, []),
    ("read_mcp_resource", {"server": _s("The MCP server's name"), "uri": _s("The resource's URI")},
     ["server", "uri"]),
]


def codex_body(model: str = "gpt-5-codex", stream: bool = True) -> dict[str, Any]:
    """A ``POST /v1/responses`` body as Codex CLI sends it."""
    tools: list[dict[str, Any]] = [
        {"type": "function", "name": name, "description": _prose(1800, f"{name}: when and how to use it"),
         "strict": False, "parameters": {"type": "object", "properties": props, "required": required,
                                         "additionalProperties": False}}
        for name, props, required in CODEX_TOOLS]
    tools.append({"type": "namespace", "name": "mcp__docs", "description": "Tools of the docs MCP server",
                  "tools": [{"type": "function", "name": "search", "parameters": {"type": "object", "properties": {
                      "query": {"type": "string"}}, "required": ["query"]}}]})
    tools.append({"type": "web_search", "external_web_access": False})
    developer = _prose(9000, "Permissions: the sandbox is workspace-write; network access is restricted")
    environment = ("<environment_context>\n  <cwd>/work/app</cwd>\n  <approval_policy>never</approval_policy>\n"
                   "  <sandbox_mode>workspace-write</sandbox_mode>\n  <network_access>restricted</network_access>\n"
                   "  <shell>bash</shell>\n</environment_context>")
    return {"model": model, "instructions": _prose(12000, "You are a coding agent running in the Codex CLI"),
            "input": [{"type": "message", "role": "developer", "content": [{"type": "input_text",
                                                                            "text": developer}]},
                      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": environment}]},
                      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hi"}]}],
            "tools": tools, "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"},
            "store": False, "stream": stream, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "3f2b6c1e-9d4a-4f5e-8b7c-2a1d0e9f8c7b",
            "client_metadata": {"originator": "codex_exec"}}


if __name__ == "__main__":
    for name, body in (("claude_code", claude_code_body()), ("codex", codex_body())):
        print(f"{name}: {len(json.dumps(body)) / 1024:.0f} KB, {len(body['tools'])} tools")
