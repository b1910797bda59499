"""Chat messages: what a template is given (``normalize_messages``) and what a parse gives back (``ChatMessage``:
reasoning, content and tool calls; llama.cpp's ``common_chat_msg``)."""

from __future__ import annotations

import secrets
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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


_ALNUM = string.ascii_letters + string.digits


def random_id(n: int, prefix: str = "") -> str:
    """``prefix`` + ``n`` random alphanumerics: every id the chat layer and the server make."""
    return prefix + "".join(secrets.choice(_ALNUM) for _ in range(n))


def tool_call_id() -> str:
    """A tool call's id when the model gives none: 32 random alphanumerics (llama-server's ``gen_tool_call_id``)."""
    return random_id(32)


@dataclass
class ToolCall:
    """One parsed call: ``arguments`` is the JSON text of the arguments as generated."""

    name: str
    arguments: str
    id: str = ""


@dataclass
class ChatMessage:
    """An answer split into its reasoning, its text and its tool calls (``common_chat_msg``)."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning_content: str = ""
