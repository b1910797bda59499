"""The server's engine: slots over one KV cache, continuously batched on one thread (spec/server.md §6-7).

Each slot runs one task (one completion choice) at a time in its own sequence of the cache. The cache is not
unified: every slot has its own stream of ``n_ctx / n_slots`` cells, so a sequence's cells, and with the
batch-invariant forward its logits, do not depend on what the other slots do. Every step is one forward over the
last sampled token of each generating slot plus chunks of the prompts still being read, then one sampling step per
output row with the task's own ``CommonSampler`` (its own seed). Same seed, same text, whatever else runs.

HTTP handlers only submit tasks and read events; everything that touches the model runs on the engine thread.
"""

from __future__ import annotations

import codecs
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from samplechain.params import CommonSampler, SamplingParams
from samplechain.runtime.events import Begin, Error, Event, Final, Progress, Token
from samplechain.runtime.generation import Model

LOGPROB_MIN = -3.4028234663852886e38  # log(0) is reported as the most negative float (spec/server.md §2.3)
SLOT_PROMPT_SIMILARITY = 0.10
SHUTTING_DOWN = Error(503, "the server is shutting down", "unavailable_error")


@dataclass
class Task:
    """One completion choice as the engine runs it; ``emit`` receives its events (from the engine thread)."""

    tokens: list[int]
    params: SamplingParams
    emit: Callable[[Event], None]
    n_predict: int = -1
    n_keep: int = 0
    n_discard: int = 0
    stop: tuple[str, ...] = ()
    cache_prompt: bool = True
    id_slot: int = -1
    n_indent: int = 0
    t_max_predict_ms: float = -1.0
    return_progress: bool = False
    sampler: CommonSampler | None = None  # built (grammar compiled) off the engine thread; else built at launch
    id: int = 0
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass
class Timings:
    cache_n: int = 0
    prompt_n: int = 0
    t_start: float = 0.0
    t_first: float = 0.0
    t_last: float = 0.0
    predicted_n: int = 0
    draft_n: int | None = None  # with speculative decoding: tokens drafted, and accepted
    draft_n_accepted: int = 0

    def to_dict(self) -> dict[str, float | int]:
        """llama-server's ``timings``: the first token's cost is in the prompt phase; the rate is over n - 1."""
        prompt_ms = (self.t_first - self.t_start) * 1e3 if self.t_first else 0.0
        predicted_ms = (self.t_last - self.t_first) * 1e3 if self.t_first else 0.0
        n_rate = max(self.predicted_n - 1, 0)
        return {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / self.prompt_n if self.prompt_n else 0.0,
            "prompt_per_second": 1e3 * self.prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
            "predicted_n": self.predicted_n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / n_rate if n_rate else 0.0,
            "predicted_per_second": 1e3 * n_rate / predicted_ms if n_rate and predicted_ms > 0 else 0.0,
            **({} if self.draft_n is None else {"draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted}),
        }


class Slot:
    """One sequence of the cache and the task running in it."""

    def __init__(self, sid: int, n_ctx: int) -> None:
        self.id, self.n_ctx = sid, n_ctx
        self.cache: list[int] = []  # the tokens in this slot's cells, position by position
        self.task: Task | None = None
        self.t_used = 0.0
        self.n_served = 0
        self.last_task: dict[str, Any] | None = None  # /slots: what the slot ran last

    @property
    def busy(self) -> bool:
        return self.task is not None

    def start(self, task: Task, model: Model, speculation: Callable[[], Any] | None = None) -> None:
        self.task = task
        # n-gram drafting, verified by sample-and-compare: the same tokens as without (not with n_probs, whose
        # entries need each position's own sampling step)
        self.spec = speculation() if speculation is not None and task.params.n_probs == 0 else None
        self.draft: list[int] = []
        self.sampler = task.sampler or CommonSampler(task.params, model.vocab, n_vocab=model.config.n_vocab)
        task.sampler = None  # the slot owns it now
        for tok in task.tokens:
            self.sampler.accept(tok, is_generated=False)
        self.prompt_pos = 0  # next prompt token to decode
        self.last: int | None = None  # sampled, not yet in the cache
        self.generated: list[int] = []
        self.probs: list[dict[str, Any]] = []
        self.text = ""
        self.n_sent = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stop_type, self.stopping_word, self.truncated = "none", "", False
        self.has_new_line = False
        self.last_nl = 0  # where the current line starts (n_indent)
        self.timings = Timings(t_start=time.perf_counter())

    @property
    def n_past(self) -> int:
        return len(self.cache)


class Engine:
    """Runs tasks on ``n_slots`` slots of ``model``; ``submit`` from any thread, events come back via ``Task.emit``."""

    def __init__(self, model: Model, n_slots: int = 4, n_ctx: int = 0, n_batch: int = 512,
                 context_shift: bool = False, special: bool = False,
                 speculation: Callable[[], Any] | None = None) -> None:
        if n_slots < 1:
            raise ValueError(f"the number of slots must be positive, got {n_slots}")
        n_ctx = n_ctx or model.config.n_ctx_train
        if n_ctx // n_slots < 8:
            raise ValueError(f"a context of {n_ctx} cells is too small for {n_slots} slots")
        self.model, self.vocab = model, model.vocab
        self.n_ctx_slot = n_ctx // n_slots
        self.n_batch, self.context_shift, self.special = n_batch, context_shift, special
        self.speculation = speculation
        self._batch_samplers: dict[tuple[int, ...], Any] = {}
        self.ctx = model.new_context(self.n_ctx_slot * n_slots, n_seq_max=n_slots, n_batch=n_batch, kv_unified=False)
        self.slots = [Slot(i, self.n_ctx_slot) for i in range(n_slots)]
        self._inbox: queue.Queue[Task | Callable[[], None] | None] = queue.Queue()
        self._deferred: deque[Task] = deque()
        self._next_id = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._drain_deadline: float | None = None  # shutting down: running tasks are cut at this time
        self.metrics = Metrics()
        self.step_hook: Callable[[], None] | None = None  # called before each forward (tests slow steps down)

    # --- the HTTP side ---------------------------------------------------------------------------

    def start(self) -> None:
        """Run the engine on a thread of its own (see ``run``)."""
        self._thread = threading.Thread(target=self.run, name="samplechain-engine", daemon=True)
        self._thread.start()

    def run(self) -> None:
        """The engine loop, on the calling thread, until ``stop``: the thread that should run the model."""
        self._thread = self._thread or threading.current_thread()
        self._loop()

    def stop(self) -> None:
        self._stopping = True
        self._inbox.put(None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def drain(self, grace: float) -> None:
        """Shut down gracefully: queued and new tasks end at once with a 503; running tasks may finish within
        ``grace`` seconds, then each is cut (``_cut``)."""
        deadline = time.perf_counter() + grace  # from now: the engine may be inside a long step

        def begin() -> None:
            self._drain_deadline = deadline
            while self._deferred:
                self._deferred.popleft().emit(SHUTTING_DOWN)
            self._check_drain()

        self.call(begin)

    def _check_drain(self) -> None:
        if self._drain_deadline is not None and time.perf_counter() >= self._drain_deadline:
            for s in self.slots:
                self._cut(s)

    def submit(self, task: Task) -> Task:
        with self._lock:
            task.id = self._next_id
            self._next_id += 1
        self._inbox.put(task)
        return task

    def cancel(self, task: Task) -> None:
        task.cancelled.set()
        self._inbox.put(None)  # wake the loop

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn`` on the engine thread between two steps, for work that uses the model outside the slots (a
        sampling trace): it never runs beside a step. Its result or exception comes back through the future."""
        future: Future = Future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as e:
                    future.set_exception(e)

        self._inbox.put(run)
        return future

    @property
    def n_deferred(self) -> int:
        return len(self._deferred)

    # --- the engine thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping:
            block = not self._deferred and not any(s.busy for s in self.slots)
            try:
                while True:
                    item = self._inbox.get(block=block, timeout=None)
                    block = False
                    if isinstance(item, Task):
                        if self._drain_deadline is None:
                            self._deferred.append(item)
                        elif not item.cancelled.is_set():
                            item.emit(SHUTTING_DOWN)
                    elif item is not None:  # a call (see call())
                        item()
            except queue.Empty:
                pass
            if self._stopping:
                break
            try:
                self._schedule()
                if any(s.busy for s in self.slots):
                    self._step()
            except Exception as e:  # a failed step fails its tasks, never the server
                for s in self.slots:
                    if s.busy:
                        self._fail(s, f"{type(e).__name__}: {e}")
            self._check_drain()

    def _schedule(self) -> None:
        """Cancelled tasks leave; deferred tasks take idle slots, in order (spec/server.md §7.1)."""
        for s in self.slots:
            if s.busy and s.task.cancelled.is_set():
                self._release(s)
        kept: deque[Task] = deque()
        while self._deferred:
            task = self._deferred.popleft()
            if task.cancelled.is_set():
                continue
            slot = self._choose_slot(task)
            if slot is None:
                kept.append(task)
                continue
            self._launch(slot, task)
        self._deferred = kept
        self.metrics.requests_deferred = len(kept)

    def _choose_slot(self, task: Task) -> Slot | None:
        if task.id_slot >= 0:
            slot = self.slots[task.id_slot % len(self.slots)]
            return None if slot.busy else slot
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            return None
        best, best_sim = None, SLOT_PROMPT_SIMILARITY
        for s in idle:
            if s.cache and task.tokens:
                sim = common_prefix(s.cache, task.tokens) / len(task.tokens)
                if sim > best_sim:
                    best, best_sim = s, sim
        return best or min(idle, key=lambda s: s.t_used)

    def _launch(self, slot: Slot, task: Task) -> None:
        try:
            slot.start(task, self.model, self.speculation)
        except ValueError as e:
            slot.task = None
            task.emit(Error(400, str(e), "invalid_request_error"))
            return
        n_keep = 0
        if task.cache_prompt:
            n_keep = min(common_prefix(slot.cache, task.tokens), len(task.tokens) - 1)  # >= 1 token re-evaluated
        self.ctx.seq_rm(slot.id, n_keep, -1)
        del slot.cache[n_keep:]
        slot.prompt_pos = n_keep
        slot.timings.cache_n = n_keep
        slot.timings.prompt_n = len(task.tokens) - n_keep
        if slot.spec is not None:
            slot.timings.draft_n = 0
        self.metrics.n_cached += n_keep
        task.emit(Begin(slot.id))
        self._progress(slot)

    def _progress(self, s: Slot) -> None:
        """``prompt_progress`` (spec/server.md §5.6): once before the prompt, then after each prompt batch."""
        if s.task.return_progress:
            s.task.emit(Progress(id_slot=s.id, n_prompt=len(s.task.tokens), total=len(s.task.tokens),
                                 cache=s.timings.cache_n, processed=s.prompt_pos,
                                 time_ms=(time.perf_counter() - s.timings.t_start) * 1e3))

    def _step(self) -> None:
        """One forward: each generating slot's last token, then prompt chunks up to ``n_batch`` tokens."""
        tokens: list[int] = []
        positions: list[int] = []
        seqs: list[int] = []
        outputs: list[bool] = []
        # the last sampled token of every generating slot (it is not in the cache yet)
        rows: list[tuple[Slot, list[int]]] = []  # per output block: the slot and the draft it verifies
        stepping = [s for s in self.slots if s.busy and s.last is not None and self._make_room(s)]
        for s in stepping:
            s.draft = self._propose(s)
            batch = [s.last, *s.draft]
            tokens += batch
            positions += range(s.n_past, s.n_past + len(batch))
            seqs += [s.id] * len(batch)
            outputs += [True] * len(batch)
            rows.append((s, s.draft))
        budget = max(self.n_batch - len(tokens), 0)
        chunks: list[tuple[Slot, list[int]]] = []
        for s in sorted((s for s in self.slots if s.busy and s.last is None), key=lambda s: s.task.id):
            if budget == 0:
                break
            todo = s.task.tokens[s.prompt_pos:]
            chunk = todo[:budget]
            budget -= len(chunk)
            done = len(chunk) == len(todo)
            tokens += chunk
            positions += range(s.prompt_pos, s.prompt_pos + len(chunk))
            seqs += [s.id] * len(chunk)
            outputs += [False] * (len(chunk) - 1) + [done]
            chunks.append((s, chunk))
            if done:
                rows.append((s, []))
        if not tokens:
            return
        if self.step_hook is not None:
            self.step_hook()
        t0 = time.perf_counter()
        logits = self.ctx.decode(tokens, positions=positions, seq_ids=seqs, outputs=outputs)
        elapsed = time.perf_counter() - t0
        self.metrics.add_decode(len(tokens), sum(1 for s in self.slots if s.busy))
        for s in stepping:  # the batch is in the cache now (rejected drafts leave it after verification)
            s.cache += [s.last, *s.draft]
            s.last = None
        for s, chunk in chunks:
            s.cache += chunk
            s.prompt_pos += len(chunk)
            self._progress(s)
        starts = np.cumsum([0] + [1 + len(d) for _, d in rows])[:-1].tolist()
        on_device = [(s, i) for (s, draft), i in zip(rows, starts, strict=True)
                     if not draft and s.spec is None and s.task.params.backend_sampling]
        device_tokens = self._sample_on_device(on_device, logits)
        logits_np = logits.float().cpu().numpy()
        for (s, draft), i in zip(rows, starts, strict=True):
            if s.task is None:  # failed (and released) while sampling on the device
                continue
            if s in device_tokens:
                self._first_token(s)
                self._sampled(s, device_tokens[s], logits_np[i])
            elif s.spec is not None and s in stepping:
                self._verify(s, logits_np[i:i + 1 + len(draft)], draft, elapsed)
            else:
                self._sample(s, logits_np[i])

    def _sample_on_device(self, rows: list[tuple[Slot, int]], logits: Any) -> dict[Slot, int]:
        """Backend sampling (``backend_sampling``): these rows' chains run their device prefixes together, batched on
        the logits where the forward left them (``BatchSampler``); the same tokens as each chain on the CPU."""
        if not rows:
            return {}
        from samplechain.device import BatchSampler

        key = tuple(id(s.sampler) for s, _ in rows)
        bs = self._batch_samplers.pop(key, None)
        if bs is None:
            bs = BatchSampler([s.sampler for s, _ in rows], logits.device,
                              select_on_device=all(s.task.params.backend_dist for s, _ in rows))
        self._batch_samplers[key] = bs  # most recent last; a composition lives as long as its tasks
        while len(self._batch_samplers) > 8:
            self._batch_samplers.pop(next(iter(self._batch_samplers)))
        try:
            tokens = bs.sample(logits[[i for _, i in rows]])
        except ValueError as e:
            for s, _ in rows:
                self._fail(s, str(e), 400)
            return {}
        return {s: t for (s, _), t in zip(rows, tokens, strict=True)}

    def _propose(self, s: Slot) -> list[int]:
        """The slot's draft for this step (none without speculation or room)."""
        if s.spec is None:
            return []
        limit = s.n_ctx - s.n_past - 2
        if s.task.n_predict >= 0:  # the accepted drafts and the target's own token stay within n_predict
            limit = min(limit, s.task.n_predict - len(s.generated) - 1)
        return s.spec.propose(s.cache, s.last, limit) if limit > 0 else []

    def _verify(self, s: Slot, block: np.ndarray, draft: list[int], elapsed: float) -> None:
        """Sample-and-compare over ``[last, *draft]``'s rows: every emitted token is the target's own sample."""
        spec = s.spec
        spec.record_time(1 + len(draft), elapsed)
        try:
            accepted = spec.verify_round(s.sampler, list(block), draft)
        except ValueError as e:
            self._fail(s, str(e), 400)
            return
        n_acc = len(accepted) - 1
        if draft:
            spec.accept(len(draft), n_acc)
            s.timings.draft_n += len(draft)
            s.timings.draft_n_accepted += n_acc
            self.metrics.add_draft(len(draft), n_acc)
        keep = len(s.cache) - len(draft) + n_acc
        if keep < len(s.cache):  # the rejected drafts' cells
            self.ctx.seq_rm(s.id, keep, -1)
            del s.cache[keep:]
        for token in accepted:
            self._sampled(s, token, None)
            if s.task is None:  # finished: a stop string, a limit or end of generation
                break

    def _make_room(self, s: Slot) -> bool:
        """Room for the slot's next token: a context shift when enabled, else the slot was already stopped."""
        if s.n_past + 1 < s.n_ctx:
            return True
        if not self.context_shift:
            self._finish(s, "limit", truncated=True)
            return False
        n_keep = s.task.n_keep
        if n_keep < 0 or n_keep > len(s.task.tokens):
            n_keep = len(s.task.tokens)
        n_keep = min(s.n_ctx - 4, n_keep + int(self.vocab.add_bos))
        n_left = s.n_past - n_keep
        n_discard = s.task.n_discard if s.task.n_discard > 0 else n_left // 2
        n_discard = min(n_discard, n_left)
        if n_discard <= 0:
            self._finish(s, "limit", truncated=True)
            return False
        self.ctx.seq_rm(s.id, n_keep, n_keep + n_discard)
        self.ctx.seq_add(s.id, n_keep + n_discard, s.n_past, -n_discard)
        del s.cache[n_keep:n_keep + n_discard]
        s.truncated = True
        return True

    def _sample(self, s: Slot, row: np.ndarray) -> None:
        try:
            token = s.sampler.sample(row)
        except ValueError as e:
            self._fail(s, str(e), 400)
            return
        self._first_token(s)
        self._sampled(s, token, row)

    def _first_token(self, s: Slot) -> None:
        if s.spec is not None and not s.generated:  # the prompt is in: index it for the drafters
            s.spec.begin(s.task.tokens)

    def _sampled(self, s: Slot, token: int, row: np.ndarray | None) -> None:
        """A token the slot's sampler chose (and accepted): timings, probabilities, text and limits."""
        now = time.perf_counter()
        if not s.generated:
            s.timings.t_first = now
            self.metrics.add_prompt(s.timings.prompt_n, now - s.timings.t_start)
        s.generated.append(token)
        s.timings.t_last = now
        s.timings.predicted_n = len(s.generated)
        probs = None
        if s.task.params.n_probs > 0 and row is not None:
            probs = self._probs(s, token, row)
            s.probs.append(probs)
        s.last = token
        self._process(s, token, probs)

    def _probs(self, s: Slot, token: int, row: np.ndarray) -> dict[str, Any]:
        """One ``completion_probabilities`` entry (spec/server.md §5.5)."""
        n = s.task.params.n_probs
        if s.task.params.post_sampling_probs:
            top = s.sampler.top_probs(n)
            c = s.sampler.candidates
            chosen = 0.0
            if c is not None and c.probs is not None:
                hit = np.flatnonzero(c.ids == token)
                chosen = float(c.probs[hit[0]]) if hit.size else 0.0
            entry = self._token_entry(token)
            entry["prob"] = chosen
            entry["top_probs"] = [{**self._token_entry(t), "prob": p} for t, p in top]
            return entry
        x = row.astype(np.float32)
        finite = np.isfinite(x)
        mx = x[finite].max() if finite.any() else 0.0
        logp = x - mx - np.float32(math.log(float(np.exp((x[finite] - mx).astype(np.float64)).sum())))
        k = min(n, x.size)
        top = np.argpartition(-x, k - 1)[:k]
        top = top[np.lexsort((top, -x[top]))]
        entry = self._token_entry(token)
        entry["logprob"] = _logprob(logp[token])
        entry["top_logprobs"] = [{**self._token_entry(int(t)), "logprob": _logprob(logp[t])} for t in top]
        return entry

    def _token_entry(self, token: int) -> dict[str, Any]:
        data = self.vocab.piece(token, self.special)
        return {"id": int(token), "token": _complete_utf8(data), "bytes": list(data)}

    def _process(self, s: Slot, token: int, probs: dict[str, Any] | None) -> None:
        """After sampling ``token``: text, UTF-8 and stop-string hold-back, limits (spec/server.md §6.1)."""
        task = s.task
        eog = self.vocab.is_eog(token)
        piece = self.vocab.piece(token, self.special)
        new = s.decoder.decode(piece)
        s.text += new
        incomplete = bool(s.decoder.getstate()[0])
        send = ""
        if not incomplete:
            unsent = s.text[s.n_sent:]
            hit = find_stop(unsent, task.stop, len(new))
            if hit is not None:
                pos, word = hit
                s.text = s.text[:s.n_sent + pos]
                s.stop_type, s.stopping_word = "word", word
            elif not eog and partial_stop(unsent, task.stop):
                unsent = None
            if unsent is not None:
                send = s.text[s.n_sent:]
                s.n_sent = len(s.text)
            if "\n" in new:
                s.has_new_line = True
        n = len(s.generated)
        if s.stop_type == "none":
            if s.n_past + 1 >= s.n_ctx and not self.context_shift:
                s.stop_type, s.truncated = "limit", True
            elif task.n_predict >= 0 and n >= max(task.n_predict, 1):
                s.stop_type = "limit"
            elif task.n_indent > 0 and self._dedented(s):
                s.stop_type = "limit"
            elif (task.t_max_predict_ms > 0 and s.has_new_line
                  and (time.perf_counter() - s.timings.t_first) * 1e3 > task.t_max_predict_ms):
                s.stop_type = "limit"
            elif eog:
                s.stop_type = "eos"
        done = s.stop_type != "none"
        if done and s.n_sent < len(s.text):  # text held back for a stop string that never came
            send += s.text[s.n_sent:]
            s.n_sent = len(s.text)
        task.emit(Token(token=token, text=send, probs=probs, n_decoded=n, n_prompt=len(task.tokens), id_slot=s.id,
                        timings=s.timings.to_dict()))
        if done:
            self._finish(s, s.stop_type, truncated=s.truncated)

    def _dedented(self, s: Slot) -> bool:
        """``n_indent``: a new line indented less than ``n_indent`` ends the generation, cut before it (FIM)."""
        if s.last_nl > 0:
            pos = s.last_nl
            while pos < len(s.text) and s.text[pos] in " \t":
                pos += 1
            if pos < len(s.text) and pos - s.last_nl < s.task.n_indent:
                s.text = s.text[:s.last_nl]
                s.n_sent = min(s.n_sent, len(s.text))
                return True
        nl = s.text.find("\n", s.last_nl)
        if nl >= 0:
            s.last_nl = nl + 1
        return False

    def _finish(self, s: Slot, stop_type: str, truncated: bool = False) -> None:
        task = s.task
        if task is None:
            return
        final = self._final(s, stop_type, truncated)
        self._release(s)  # first: a client that has its answer sees the slot idle
        task.emit(final)

    def _final(self, s: Slot, stop_type: str, truncated: bool = False) -> Final:
        """The task's final event: its text, tokens, why it stopped and its timings."""
        task = s.task
        tail = s.decoder.decode(b"", final=True)
        content = s.text + (tail if stop_type != "word" else "")
        probs = s.probs
        if stop_type == "word" and probs:
            n_stop = len(self.vocab.tokenize(s.stopping_word, add_special=False))
            probs = probs[:max(len(probs) - n_stop, 0)]
        self.metrics.add_predicted(len(s.generated), s.timings.t_last - s.timings.t_first)
        return Final(content=content, tokens=list(s.generated), stop_type=stop_type, stopping_word=s.stopping_word,
                     truncated=truncated or s.truncated, has_new_line=s.has_new_line, n_prompt=len(task.tokens),
                     n_decoded=len(s.generated), n_cached=s.timings.cache_n, timings=s.timings.to_dict(),
                     probs=probs, id_slot=s.id)

    def _cut(self, s: Slot) -> None:
        """Shutdown past the grace period: the task ends where it is, with its final event (finish reason
        "length") and then a 503 error, so that a stream has its finish reason and its client knows why."""
        task = s.task
        if task is None:
            return
        final = self._final(s, "limit")
        self._release(s)
        task.emit(replace(SHUTTING_DOWN, final=final))

    def _fail(self, s: Slot, message: str, code: int = 500) -> None:
        """The task ends with an error: 500 for a failed step, 400 where its own sampling chain cannot go on (a
        grammar or a bias that leaves no token, a trigger that opens a grammar the text cannot follow)."""
        task = s.task
        self._release(s)
        if task is not None:
            task.emit(Error(code, message, "server_error" if code >= 500 else "invalid_request_error"))

    def _release(self, s: Slot) -> None:
        task = s.task
        if task is not None:
            s.last_task = {"id_task": task.id, "n_prompt_tokens": len(task.tokens),
                           "n_prompt_tokens_processed": s.timings.prompt_n,
                           "n_prompt_tokens_cache": s.timings.cache_n, "params": task.params,
                           "n_decoded": len(s.generated), "n_predict": task.n_predict}
        s.task = None
        s.last = None
        s.t_used = time.perf_counter()
        s.n_served += 1


class Metrics:
    """Counters for ``/metrics`` (llama-server's names, spec/server.md §3.13)."""

    def __init__(self) -> None:
        self.prompt_tokens_total = 0
        self.prompt_seconds_total = 0.0
        self.tokens_predicted_total = 0
        self.tokens_predicted_seconds_total = 0.0
        self.n_cached = 0
        self.n_decode_total = 0
        self.n_tokens_max = 0
        self.n_busy_slots_total = 0
        self.requests_deferred = 0
        # the window since the last scrape
        self.window_prompt = [0, 0.0]
        self.window_predicted = [0, 0.0]
        self.spec_drafts = 0
        self.spec_draft_tokens = 0
        self.spec_accepted_tokens = 0

    def add_draft(self, n_drafted: int, n_accepted: int) -> None:
        self.spec_drafts += 1
        self.spec_draft_tokens += n_drafted
        self.spec_accepted_tokens += n_accepted

    def add_decode(self, n_tokens: int, n_busy: int) -> None:
        self.n_decode_total += 1
        self.n_tokens_max = max(self.n_tokens_max, n_tokens)
        self.n_busy_slots_total += n_busy

    def add_prompt(self, n: int, seconds: float) -> None:
        self.prompt_tokens_total += n
        self.prompt_seconds_total += seconds
        self.window_prompt[0] += n
        self.window_prompt[1] += seconds

    def add_predicted(self, n: int, seconds: float) -> None:
        self.tokens_predicted_total += n
        self.tokens_predicted_seconds_total += seconds
        self.window_predicted[0] += n
        self.window_predicted[1] += seconds


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x, y = np.asarray(a[:n]), np.asarray(b[:n])
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


def find_stop(text: str, stops: Sequence[str], n_piece: int) -> tuple[int, str] | None:
    """The earliest full stop string in ``text``, searched from ``len(text) - len(word) - n_piece`` (llama.cpp)."""
    best: tuple[int, str] | None = None
    for word in stops:
        pos = text.find(word, max(len(text) - len(word) - n_piece, 0))
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, word)
    return best


def partial_stop(text: str, stops: Sequence[str]) -> bool:
    """Whether ``text`` ends with a proper prefix of a stop string."""
    for word in stops:
        for n in range(min(len(word) - 1, len(text)), 0, -1):
            if text.endswith(word[:n]):
                return True
    return False


def _complete_utf8(data: bytes) -> str:
    """The piece cut before an incomplete UTF-8 tail."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", errors="replace")


def _logprob(x: float) -> float:
    x = float(x)
    return x if math.isfinite(x) else LOGPROB_MIN
