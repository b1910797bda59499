"""The server's engine: slots over one KV cache, continuously batched on one thread (llama-server's
``update_slots``, tools/server/server-context.cpp).

Each slot runs one task (one completion choice) at a time in its own sequence of the cache: a ``Sequence`` and,
while the task runs, a ``Decoder`` (runtime/decoding.py) that owns everything about the generation itself. The
engine only schedules: which slots step, one batch of every generating slot's ``Decoder.feed()`` plus chunks of the
prompts still being read, one forward, and each output block back to its slot's decoder. By default the cache is
not unified: every slot has its own stream of ``n_ctx / n_slots`` cells, so a sequence's cells, and with the
batch-invariant forward its logits, do not depend on what the other slots do; each task samples with its own
``CommonSampler`` (its own seed). Same seed, same text, whatever else runs. With ``kv_unified`` (llama-server's
``--kv-unified``) the slots share one pool of ``n_ctx`` cells, each may use all of it, and a step that finds the pool
full first empties idle slots, then fails the running tasks ("Context size has been exceeded.").

An embedding task (``Task.embedding``) reads its prompt in a slot too, in forwards of its own (llama-server never
batches embeddings with completions): the prompt whole in one forward, or in chunks with pooling ``last``; its
result is one ``Embeddings`` event. With a draft model, each slot has a sequence of one draft context and a
``DraftModel`` drafting over it, added to each of its tasks' ``Speculation``.

HTTP handlers only submit tasks and read events; everything that touches the model runs on the engine thread.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from samplechain.params import CommonSampler
from samplechain.runtime.decoding import Decoder
from samplechain.runtime.embeddings import POOLING, normalize, pool
from samplechain.runtime.events import Begin, Embeddings, Error, Final, Progress, Token
from samplechain.runtime.generation import Model
from samplechain.runtime.kv_cache import KVCacheFull
from samplechain.runtime.sequence import Sequence as CacheSequence
from samplechain.server.metrics import Metrics
from samplechain.server.slot import Slot, Task
from samplechain.speculative.config import SpeculationConfig

SHUTTING_DOWN = Error(503, "the server is shutting down", "unavailable_error")


class Engine:
    """Runs tasks on ``n_slots`` slots of ``model``; ``submit`` from any thread, events come back via ``Task.emit``."""

    def __init__(self, model: Model, n_slots: int = 4, n_ctx: int = 0, n_batch: int = 512,
                 context_shift: bool = False, special: bool = False,
                 speculation: SpeculationConfig | None = None, kv_unified: bool = False, pooling: str = "none",
                 draft: Model | None = None, draft_params: Mapping[str, Any] | None = None,
                 slot_prompt_similarity: float = 0.10) -> None:
        """``speculation``: how every task drafts (each its own ``Speculation``: drafters and policy); ``pooling``: how
        embedding tasks pool (runtime/embeddings.py); ``draft``: a draft model, drafting in every slot after the
        n-gram drafters (``DraftModel``'s ``draft_params``: n_max, n_min, p_min, sample, seed)."""
        if n_slots < 1:
            raise ValueError(f"the number of slots must be positive, got {n_slots}")
        n_ctx = n_ctx or model.config.n_ctx_train
        if n_ctx // n_slots < 8:
            raise ValueError(f"a context of {n_ctx} cells is too small for {n_slots} slots")
        self.model, self.vocab = model, model.vocab
        self.kv_unified = kv_unified
        self.n_ctx_slot = n_ctx if kv_unified else n_ctx // n_slots
        self.n_batch, self.context_shift, self.special = n_batch, context_shift, special
        self.speculation = speculation
        self.slot_prompt_similarity = slot_prompt_similarity  # ServerConfig.slot_prompt_similarity
        self._batch_samplers: dict[tuple[int, ...], Any] = {}
        self.ctx = model.new_context(n_ctx if kv_unified else self.n_ctx_slot * n_slots, n_seq_max=n_slots,
                                     n_batch=n_batch, kv_unified=kv_unified)
        self.slots = [Slot(i, CacheSequence(self.ctx, i, self.n_ctx_slot)) for i in range(n_slots)]
        if pooling not in POOLING:
            raise ValueError(f"unknown pooling type {pooling!r} (one of {', '.join(POOLING)})")
        self.pooling = pooling
        self.n_scores = 1  # pooling "rank": the scores per prompt (llama.cpp's n_cls_out)
        if pooling == "rank":
            from samplechain.runtime.embeddings import n_cls_out

            self.n_scores = n_cls_out(model.gguf)
        self.draft_ctx = None
        self.trace_context: Any = None  # /sampling/trace's context, made on the engine thread at the first trace
        if draft is not None:
            from samplechain.speculative.draft_model import DraftModel

            # one stream of n_ctx_slot cells per slot (with a unified target cache too): a slot's draft never waits
            # for another's, and never finds its cache full
            self.draft_ctx = draft.new_context(self.n_ctx_slot * n_slots, n_seq_max=n_slots, n_batch=n_batch,
                                               kv_unified=False)
            for s in self.slots:
                s.drafter = DraftModel(draft, self.vocab, seq=CacheSequence(self.draft_ctx, s.id, self.n_ctx_slot),
                                       **(draft_params or {}))
        self._inbox: queue.Queue[Task | Callable[[], None] | None] = queue.Queue()
        self._deferred: deque[Task] = deque()
        self._slot_calls: deque[tuple[Slot, Callable[[Slot], Any], Future]] = deque()  # waiting for their slot
        self._next_id = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._drain_deadline: float | None = None  # shutting down: running tasks are cut at this time
        self.metrics = Metrics()
        self.step_hook: Callable[[], None] | None = None  # called before each forward (tests slow steps down)
        # a server that sleeps (server/sleep.py): asked when the engine is idle, the seconds it may wait for work
        # before it asks again (math.inf: until work comes); 0 or less: the engine sleeps (``run`` returns)
        self.idle_timer: Callable[[], float] | None = None
        self.asleep = False  # ``run`` returned to sleep (not stopped)

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

    def poke(self) -> None:
        """Wake the loop, to look again at what it waits for (the idle timer)."""
        self._inbox.put(None)

    def drain(self, grace: float) -> None:
        """Shut down gracefully: queued and new tasks end at once with a 503; running tasks may finish within
        ``grace`` seconds, then each is cut (``_finish(cut=True)``)."""
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
                self._finish(s, cut=True)

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

    def call_on_slot(self, id_slot: int, fn: Callable[[Slot], Any]) -> Future:
        """Run ``fn(slot)`` on the engine thread between two steps, once slot ``id_slot`` is idle (a busy slot
        defers it, as llama-server defers a slot action): saving, restoring or erasing the slot's cells."""
        future: Future = Future()
        slot = self.slots[id_slot]
        self.call(lambda: self._slot_calls.append((slot, fn, future)))
        return future

    def _run_slot_calls(self) -> None:
        waiting: deque[tuple[Slot, Callable[[Slot], Any], Future]] = deque()
        for slot, fn, future in self._slot_calls:
            if slot.busy:
                waiting.append((slot, fn, future))
            elif future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(slot))
                except BaseException as e:
                    future.set_exception(e)
        self._slot_calls = waiting

    @property
    def n_deferred(self) -> int:
        return len(self._deferred)

    # --- the engine thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping:
            block = not self._deferred and not any(s.busy for s in self.slots)
            timeout = None
            if block and self.idle_timer is not None and self._drain_deadline is None and self._inbox.empty():
                wait = self.idle_timer()
                if wait <= 0:
                    self.asleep = True
                    return
                timeout = None if wait == math.inf else wait
            try:
                while True:
                    item = self._inbox.get(block=block, timeout=timeout)
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
        """Cancelled tasks leave; slot actions waiting for their slot run; deferred tasks take idle slots, in order
        (llama-server's ``get_available_slot``)."""
        for s in self.slots:
            if s.busy and s.task.cancelled.is_set():
                self._release(s)
        if self._slot_calls:
            self._run_slot_calls()
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
        best, best_sim = None, self.slot_prompt_similarity
        for s in idle if self.slot_prompt_similarity > 0 else ():
            if s.seq.tokens and task.tokens:
                sim = s.seq.common_prefix(task.tokens) / len(task.tokens)
                if sim > best_sim:
                    best, best_sim = s, sim
        return best or min(idle, key=lambda s: s.t_used)

    def _launch(self, slot: Slot, task: Task) -> None:
        """The task takes the slot: its sampler (the prompt accepted), the cached prefix it reuses, its rules."""
        if task.embedding:  # stateless, as llama-server's: nothing of the slot's cache is reused
            slot.seq.truncate(0)
            slot.running = (task, None)
            task.emit(Begin(slot.id))
            return
        try:
            # drafting (n-gram drafters, the slot's draft model), verified by sample-and-compare: the same tokens
            # as without (not with n_probs, whose entries need each position's own sampling step)
            spec = self.speculation.build() if self.speculation is not None and task.params.n_probs == 0 else None
            if spec is not None and slot.drafter is not None:
                spec.add(slot.drafter)
            if spec is not None and spec.synth:
                spec.seed_synth(task.params.seed)  # llama-server seeds each task's synthetic acceptance
            sampler = task.sampler or CommonSampler(task.params, self.vocab, n_vocab=self.model.config.n_vocab)
            task.sampler = None  # the slot owns it now
            for tok in task.tokens:
                sampler.accept(tok, is_generated=False)
        except ValueError as e:
            task.emit(Error(400, str(e), "invalid_request_error"))
            return
        n_cached = slot.seq.reuse(task.tokens) if task.cache_prompt else 0  # >= 1 token is decoded again
        slot.seq.truncate(n_cached)  # (without cache_prompt: nothing kept)
        asked = task.rules
        n_keep = asked.n_keep if 0 <= asked.n_keep <= len(task.tokens) else len(task.tokens)
        rules = replace(asked, n_predict=max(asked.n_predict, 1) if asked.n_predict >= 0 else -1,
                        n_keep=min(slot.n_ctx - 4, n_keep + int(self.vocab.add_bos)),
                        context_shift=self.context_shift, server=True, special=self.special,
                        preserved=self._preserved(task.params.preserved_tokens), probs=task.params.n_probs > 0)
        d = Decoder(slot.seq, sampler, self.vocab, rules, n_prompt=len(task.tokens), speculation=spec)
        d.timings.n_reused, d.timings.n_prompt = n_cached, len(task.tokens) - n_cached
        slot.running = (task, d)
        self.metrics.n_cached += n_cached
        task.emit(Begin(slot.id))
        self._progress(slot)

    def _preserved(self, texts: tuple[str, ...]) -> frozenset[int]:
        """The token ids of a chat format's preserved tokens (texts that are one token): llama-server shows their
        text in the output even without ``--special`` (a tool-call tag must reach the parser)."""
        ids = (self.vocab.tokenize(t, add_special=False, parse_special=True) for t in texts)
        return frozenset(t[0] for t in ids if len(t) == 1)

    def _progress(self, s: Slot) -> None:
        """``prompt_progress`` (as llama-server sends it): once before the prompt, then after each prompt batch."""
        if s.task.return_progress:
            t = s.decoder.timings
            s.task.emit(Progress(s.id, len(s.task.tokens), len(s.task.tokens), t.n_reused, s.seq.n_past,
                                 (time.perf_counter() - t.t_start) * 1e3))

    def _step(self) -> None:
        """One forward: each generating slot's ``Decoder.feed``, then prompt chunks up to ``n_batch`` tokens; then
        each output block back to its slot's decoder. Embedding tasks first, in a forward of their own."""
        if any(s.embedding for s in self.slots):
            self._embed_step()
        tokens: list[int] = []
        positions: list[int] = []
        seqs: list[int] = []
        outputs: list[bool] = []
        blocks: list[tuple[Slot, int]] = []  # per output block: the slot and its number of rows
        stepping: list[tuple[Slot, list[int]]] = []
        for s in self.slots:
            if not s.busy or s.reading or s.embedding:
                continue
            batch = s.decoder.feed()  # the last sampled token (not in the cache yet) and its draft
            if batch is None:  # no room left
                self._finish(s)
                continue
            stepping.append((s, batch))
            blocks.append((s, len(batch)))
        budget = self.n_batch
        for s, batch in stepping:
            tokens += batch
            positions += s.seq.positions(len(batch))
            seqs += [s.id] * len(batch)
            outputs += [True] * len(batch)
            budget -= len(batch)
        chunks: list[tuple[Slot, list[int]]] = []
        for s in sorted((s for s in self.slots if s.busy and s.reading), key=lambda s: s.task.id):
            if budget <= 0:
                break
            todo = s.task.tokens[s.seq.n_past:]
            chunk = todo[:budget]
            budget -= len(chunk)
            done = len(chunk) == len(todo)
            tokens += chunk
            positions += s.seq.positions(len(chunk))
            seqs += [s.id] * len(chunk)
            outputs += [False] * (len(chunk) - 1) + [done]
            chunks.append((s, chunk))
            if done:
                blocks.append((s, 1))
        if not tokens:
            return
        self._before_forward(len(tokens))
        t0 = time.perf_counter()
        try:
            logits = self.ctx.decode(tokens, positions=positions, seq_ids=seqs, outputs=outputs)
        except KVCacheFull:  # only with a unified cache: the slots together outgrew the pool
            for s in self.slots:
                if s.busy:
                    self._fail(s, "Context size has been exceeded.")
                    s.seq.clear()  # what this step wrote of it is not known: nothing of it is kept
            return
        elapsed = time.perf_counter() - t0
        self.metrics.add_decode(len(tokens), sum(1 for s in self.slots if s.busy))
        for s, batch in stepping:  # in the cache now (rejected drafts leave it after verification)
            s.seq.appended(batch)
        for s, chunk in chunks:
            s.seq.appended(chunk)
            self._progress(s)
        starts, i = [], 0
        for _, n in blocks:
            starts.append(i)
            i += n
        on_device = [(s, i) for (s, n), i in zip(blocks, starts, strict=True)
                     if n == 1 and s.decoder.spec is None and s.task.params.backend_sampling]
        device_tokens = self._sample_on_device(on_device, logits)
        logits_np = logits.float().cpu().numpy()
        for (s, n), i in zip(blocks, starts, strict=True):
            if s.task is None:  # failed (and released) while sampling on the device
                continue
            try:
                events = s.decoder.step(logits_np[i:i + n], token=device_tokens.get(s), elapsed=elapsed)
            except ValueError as e:  # its own sampling chain cannot go on
                self._fail(s, str(e), 400)
                continue
            self._emit(s, events)

    def _before_forward(self, n: int) -> None:
        """Before a forward of ``n`` tokens: the test hook (slow steps), and room in a unified cache."""
        if self.step_hook is not None:
            self.step_hook()
        if self.kv_unified:
            self._make_room(n)

    def _make_room(self, n: int) -> None:
        """A unified cache with fewer than ``n`` free cells: idle slots give theirs up, one by one in slot order
        (llama-server's ``try_clear_idle_slots``)."""
        for s in [s for s in self.slots if not s.busy and s.seq.tokens]:
            if self.ctx.kv.n_free() >= n:
                return
            s.seq.clear()

    def _embed_step(self) -> None:
        """One forward of the embedding tasks' prompts, oldest first, up to ``n_batch`` tokens: each prompt whole
        (its pooling reads every token: the route has checked it fits), or with pooling ``last`` as much of it as
        fits. A prompt read to its end sends its pooled vector (``send_embedding``) and frees its slot."""
        tokens: list[int] = []
        positions: list[int] = []
        seqs: list[int] = []
        parts: list[tuple[Slot, list[int], bool]] = []
        budget = self.n_batch
        for s in sorted((s for s in self.slots if s.embedding), key=lambda s: s.task.id):
            todo = s.task.tokens[s.seq.n_past:]
            if budget <= 0 or (len(todo) > budget and self.pooling != "last"):
                continue
            chunk = todo[:budget]
            budget -= len(chunk)
            tokens += chunk
            positions += s.seq.positions(len(chunk))
            seqs += [s.id] * len(chunk)
            parts.append((s, chunk, len(chunk) == len(todo)))
        if not tokens:
            return
        self._before_forward(len(tokens))
        try:
            hidden = self.ctx.embed(tokens, positions=positions, seq_ids=seqs).float().cpu().numpy()
        except KVCacheFull:  # only with a unified cache: the slots together outgrew the pool
            for s, _, _ in parts:
                self._fail(s, "Context size has been exceeded.")
                s.seq.clear()
            return
        self.metrics.add_decode(len(tokens), sum(1 for s in self.slots if s.busy))
        i = 0
        for s, chunk, done in parts:
            s.seq.appended(chunk)
            rows, i = hidden[i:i + len(chunk)], i + len(chunk)
            if not done:
                continue
            task = s.task
            vectors = pool(rows, self.pooling, self.n_scores)
            if self.pooling != "none":  # llama-server normalizes pooled vectors only
                vectors = normalize(vectors[0], task.embd_normalize)[None, :]
            self._release(s)
            task.emit(Embeddings(vectors, len(task.tokens), s.id))

    def _emit(self, s: Slot, events: list[Token | Final]) -> None:
        d, task = s.decoder, s.task
        if d.round is not None:
            self.metrics.add_draft(*d.round)
        for ev in events:
            if isinstance(ev, Token):
                if ev.n_decoded == 1:
                    self.metrics.add_prompt(d.timings.n_prompt, d.timings.t_first - d.timings.t_start)
                task.emit(ev)
            else:
                self._finish(s)

    def _sample_on_device(self, rows: list[tuple[Slot, int]], logits: Any) -> dict[Slot, int]:
        """Backend sampling (``backend_sampling``): these rows' chains run their device prefixes together, batched on
        the logits where the forward left them (``BatchSampler``); the same tokens as each chain on the CPU."""
        if not rows:
            return {}
        from samplechain.device import BatchSampler

        key = tuple(id(s.decoder.sampler) for s, _ in rows)
        bs = self._batch_samplers.pop(key, None)
        if bs is None:
            bs = BatchSampler([s.decoder.sampler for s, _ in rows], logits.device,
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

    def _finish(self, s: Slot, cut: bool = False) -> None:
        """The task ends with its decoder's final event. ``cut``: shutdown past the grace period ends it where it is
        (finish reason "length") and sends the final inside a 503 error, so that a stream has its finish reason and
        its client knows why."""
        running = s.running
        if running is None:
            return
        task, d = running
        if d is None:  # an embedding task has no partial result
            self._release(s)
            task.emit(SHUTTING_DOWN)
            return
        final = d.finish("limit")  # the final it has, else one made here
        self.metrics.add_predicted(len(d.generated), d.timings.t_last - d.timings.t_first)
        self._release(s)  # first: a client that has its answer sees the slot idle
        task.emit(replace(SHUTTING_DOWN, final=final) if cut else final)

    def _fail(self, s: Slot, message: str, code: int = 500) -> None:
        """The task ends with an error: 500 for a failed step, 400 where its own sampling chain cannot go on (a
        grammar or a bias that leaves no token, a trigger that opens a grammar the text cannot follow)."""
        task = s.task
        self._release(s)
        if task is not None:
            task.emit(Error(code, message, "server_error" if code >= 500 else "invalid_request_error"))

    def _release(self, s: Slot) -> None:
        running, info = s.info()
        if running:
            s.last_task = info
        s.running = None
        s.t_used = time.perf_counter()
        s.n_served += 1

