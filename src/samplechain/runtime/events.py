"""What decoding a sequence reports, typed: ``Token`` and ``Final`` from a ``Decoder``; ``Begin``, ``Progress`` and
``Error`` from the server's scheduler. The server formats them into llama-server's and OpenAI's bodies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Begin:
    """A task took a slot."""

    id_slot: int


@dataclass(frozen=True)
class Progress:
    """Prompt processing: ``processed`` of ``total`` prompt tokens in the cache (``cache`` of them reused)."""

    id_slot: int
    n_prompt: int
    total: int
    cache: int
    processed: int
    time_ms: float


@dataclass(frozen=True)
class Token:
    """A sampled token and the text it releases (empty while UTF-8 or a possible stop string is held back)."""

    token: int
    text: str
    probs: dict[str, Any] | None
    n_decoded: int
    n_prompt: int
    id_slot: int
    timings: dict[str, Any]


@dataclass(frozen=True)
class Final:
    """The end of a generation: its whole text, tokens, why it stopped and its timings."""

    content: str
    tokens: list[int]
    stop_type: str  # "eos", "word" (a stop string), "limit" (a length or time limit, a full context), "none"
    stopping_word: str
    truncated: bool
    has_new_line: bool
    n_prompt: int
    n_decoded: int
    n_cached: int
    timings: dict[str, Any]
    probs: list[dict[str, Any]]
    id_slot: int


@dataclass(frozen=True)
class Error:
    """A task ended with an error (HTTP ``code``); a shutdown's cut carries the task's final event too."""

    code: int
    message: str
    error_type: str
    final: Final | None = None


Event = Begin | Progress | Token | Final | Error
