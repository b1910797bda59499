"""A decoding task's events, in the order it sends them: ``Begin``, ``Progress`` (prompt reading, when asked),
``Token`` per sampled token, then ``Final`` or ``Error``; an embedding task sends ``Begin``, then
``Embeddings`` or ``Error``.

They cross from the thread that runs the model to whoever reads them (the server's handlers format them as
llama-server's and OpenAI's JSON in ``samplechain.server.responses``); frozen, so a reader cannot change what
another holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Begin:
    """The task has a slot: its prompt is read from here on."""

    id_slot: int


@dataclass(frozen=True, slots=True)
class Progress:
    """Prompt reading (``prompt_progress``): once before the prompt, then after each prompt batch."""

    id_slot: int
    n_prompt: int
    total: int  # prompt tokens in all
    cache: int  # of them reused from the slot's cache
    processed: int  # of them in the cache now
    time_ms: float  # since the task began


@dataclass(frozen=True, slots=True)
class Token:
    """A sampled token and the text it releases (``text`` may be empty: held back for UTF-8 or a stop string)."""

    token: int
    text: str
    probs: dict[str, Any] | None  # a ``completion_probabilities`` entry, with n_probs
    n_decoded: int
    n_prompt: int
    id_slot: int
    timings: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Final:
    """The task's end: its whole text and tokens, why it stopped and its timings."""

    content: str
    tokens: list[int]
    stop_type: str  # "eos", "word" (a stop string: ``stopping_word``) or "limit"
    stopping_word: str
    truncated: bool
    has_new_line: bool
    n_prompt: int
    n_decoded: int
    n_cached: int
    timings: dict[str, Any]
    probs: list[dict[str, Any]]
    id_slot: int


@dataclass(frozen=True, slots=True)
class Embeddings:
    """An embedding task's result: its pooled vector (normalized as asked), or with pooling ``none`` each prompt
    token's vector (not normalized), as rows of ``vectors`` [1 or n_prompt, n_embd] float32 (not to be written)."""

    vectors: Any
    n_prompt: int
    id_slot: int


@dataclass(frozen=True, slots=True)
class Error:
    """The task failed (``code`` an HTTP status, ``error_type`` llama-server's error type). A task cut short (the
    server shutting down) carries the ``final`` it had reached."""

    code: int
    message: str
    error_type: str
    final: Final | None = None


Event = Begin | Progress | Token | Final | Embeddings | Error
