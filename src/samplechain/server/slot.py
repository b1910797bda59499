"""A slot of the engine (``engine.Engine``): one sequence of the KV cache and the task running in it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from samplechain.params import CommonSampler, SamplingParams
from samplechain.runtime.decoding import Decoder, Rules
from samplechain.runtime.events import Event
from samplechain.runtime.sequence import Sequence as CacheSequence


@dataclass
class Task:
    """One completion choice as the engine runs it; ``emit`` receives its events (from the engine thread)."""

    tokens: list[int]
    params: SamplingParams
    emit: Callable[[Event], None]
    rules: Rules = field(default_factory=Rules)  # the request's stop and limits; the engine adds the slot's part
    cache_prompt: bool = True
    id_slot: int = -1
    return_progress: bool = False
    sampler: CommonSampler | None = None  # built (grammar compiled) off the engine thread; else built at launch
    id: int = 0
    cancelled: threading.Event = field(default_factory=threading.Event)
    embedding: bool = False  # an embedding task: its prompt's vector(s), pooled as the engine pools (no sampling)
    embd_normalize: int = 2  # how its pooled vector is normalized (common_embd_normalize: 2 = euclidean)



class Slot:
    """One sequence of the cache (a ``Sequence``) and, while a task runs in it, the task and its ``Decoder``."""

    def __init__(self, sid: int, seq: CacheSequence) -> None:
        self.id, self.seq, self.n_ctx = sid, seq, seq.n_ctx
        self.running: tuple[Task, Decoder] | None = None  # set and cleared whole: other threads read it
        self.t_used = 0.0
        self.n_served = 0
        self.last_task: dict[str, Any] | None = None  # /slots: what the slot ran last
        self.drafter: Any = None  # with a draft model: its DraftModel over this slot's draft sequence

    @property
    def task(self) -> Task | None:
        running = self.running
        return None if running is None else running[0]

    @property
    def decoder(self) -> Decoder | None:
        running = self.running
        return None if running is None else running[1]

    @property
    def busy(self) -> bool:
        return self.running is not None

    @property
    def reading(self) -> bool:
        """Its prompt is still being decoded (nothing sampled yet)."""
        return self.decoder is not None and self.decoder.last is None

    @property
    def embedding(self) -> bool:
        """It runs an embedding task (no decoder)."""
        running = self.running
        return running is not None and running[1] is None

    def info(self) -> tuple[bool, dict[str, Any] | None]:
        """For ``/slots``: whether a task runs, and what it does; idle, the last task's id and parameters with the
        counters reset, as llama-server's released slot shows them (its cells' tokens, nothing decoded, no budget).
        Safe from any thread."""
        running = self.running
        if running is None:
            last = self.last_task
            if last is None:
                return False, None
            return False, {**last, "n_prompt_tokens": len(self.seq.tokens), "n_prompt_tokens_processed": 0,
                           "n_prompt_tokens_cache": 0, "n_decoded": 0, "n_remain": -1, "has_new_line": False}
        task, d = running
        if d is None:  # an embedding task
            return True, {"id_task": task.id, "n_prompt_tokens": len(task.tokens),
                          "n_prompt_tokens_processed": len(task.tokens), "n_prompt_tokens_cache": 0,
                          "params": task.params, "n_decoded": 0, "n_predict": task.rules.n_predict, "n_remain": -1,
                          "has_new_line": False}
        return True, {"id_task": task.id, "n_prompt_tokens": len(task.tokens),
                      "n_prompt_tokens_processed": d.timings.n_prompt, "n_prompt_tokens_cache": d.timings.n_reused,
                      "params": task.params, "n_decoded": len(d.generated), "n_predict": task.rules.n_predict,
                      "n_remain": -1 if task.rules.n_predict < 0 else max(task.rules.n_predict - len(d.generated), 0),
                      "has_new_line": d.has_new_line}
