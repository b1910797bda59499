"""The server's settings and its state: the model and the engine, once loaded."""

from __future__ import annotations

import contextlib
import copy
import gc
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from samplechain.server.config import ServerConfig
from samplechain.server.engine import Engine
from samplechain.server.metrics import Metrics
from samplechain.server.request import release_memory
from samplechain.server.responses_wire import ResponseStore
from samplechain.server.sleep import Sleeper


class ServerState:
    """The model and engine once loaded (the listener answers 503 until then). With ``sleep_idle_seconds``, the
    engine thread releases them when idle and loads them again for the next request that needs them
    (``sleep.Sleeper``; ``model`` and ``engine`` are None meanwhile)."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.model: Any = None
        self.engine: Engine | None = None
        self.error: str | None = None
        self.ready = threading.Event()
        self.failed = threading.Event()
        self.started = time.time()
        self.responses = ResponseStore(config.responses_store)  # /v1/responses kept for previous_response_id
        self.sleeper: Sleeper | None = None
        if config.sleep_idle_seconds > 0:
            self.sleeper = Sleeper(config.sleep_idle_seconds, config.timeout, self._on_sleep, self._on_wake,
                                   self._poke)
        self.snapshots: dict[str, Any] = {}  # what /props and /models answer while the model sleeps
        self.metrics: Metrics | None = None  # the counters, kept across sleeps
        self.sleep_metrics: Metrics | None = None  # the counters on entering sleep (what /metrics shows then)
        self.scraped_asleep = False  # /metrics reported the sleep snapshot's window: the engine's is not again
        self._model_name = ""
        self._thread: threading.Thread | None = None

    def start(self, model: Any = None, on_error: Callable[[], None] | None = None) -> threading.Thread:
        """Start the engine thread: it loads the model (unless given), then runs the engine. The model is only ever
        run on that thread: with OpenMP, a second thread driving the compiled forward makes libgomp throttle its
        spinning and every step about 3x slower on a small machine. ``ready`` is set once loaded; on failure the
        error is kept (503 bodies, /health) and ``on_error`` is called. A sleeping server reloads on that thread
        too (a ``model`` given here is the caller's: sleeping releases the engine and its caches, not it)."""

        def run() -> None:
            try:
                self._load(model)
            except Exception as e:
                self.error = f"{type(e).__name__}: {e}"
                self.failed.set()
                if on_error is not None:
                    on_error()
                return
            if self.sleeper is not None:
                self.sleeper.t_idle = time.monotonic()  # idle from now
            self.ready.set()
            while True:
                engine = self.running_engine
                engine.run()
                if not engine.asleep or self.sleeper is None:
                    return  # stopped
                del engine
                if not self._sleep(model):
                    return

        thread = threading.Thread(target=run, name="samplechain-engine", daemon=True)
        self._thread = thread
        thread.start()
        return thread

    def _load(self, model: Any) -> None:
        """Load the model (unless given) and make its engine: at startup and on waking."""
        loaded = model
        c = self.config
        if loaded is None:
            from samplechain.runtime import load_model

            loaded = load_model(c.model, **c.load_options())
        draft = None
        if c.model_draft is not None:
            from samplechain.runtime import load_model

            draft = load_model(c.model_draft, **c.load_options())
        from samplechain.runtime.embeddings import model_pooling

        served = served_model(loaded, c)
        engine = Engine(served, c.n_slots, c.n_ctx, c.n_batch, c.context_shift, c.special, c.speculation,
                        kv_unified=c.kv_unified, pooling=c.pooling or model_pooling(loaded.gguf), draft=draft,
                        draft_params=c.draft_params, slot_prompt_similarity=c.slot_prompt_similarity)
        if self.metrics is None:
            self.metrics = engine.metrics
        engine.metrics = self.metrics
        if self.sleeper is not None:
            engine.idle_timer = self.sleeper.idle_timer
        self._model_name = os.path.basename(served.path)
        self.model, self.engine = served, engine

    def _sleep(self, model: Any) -> bool:
        """The engine has stopped to sleep: release the model, its engine and caches; wait for a request that needs
        them and load them again (a failed load: its waiters get a 503, the next request tries again). False: the
        server stops."""
        sleeper = self.sleeper
        assert sleeper is not None
        self.model = self.engine = None
        _release()
        sleeper.slept()
        while sleeper.wait_for_wake():
            try:
                self._load(model)
            except Exception as e:
                self.model = self.engine = None
                _release()
                sleeper.woke(f"Model failed to load: {type(e).__name__}: {e}")
                continue
            if sleeper.woke(None):
                return True
            self.model = self.engine = None  # stopped while loading
            break
        return False

    def _on_sleep(self) -> None:
        """Entering sleep (the engine thread, the model still loaded): the read-only routes' snapshots; the sleep
        is counted after the metrics' snapshot (which is what the last scrape awake saw)."""
        from samplechain.server.describe import models_body, props_body

        self.snapshots = {"props": props_body(self, True), "models": models_body(self)}
        assert self.metrics is not None
        self.sleep_metrics = self.metrics.snapshot()
        self.scraped_asleep = False
        self.metrics.n_sleeps += 1

    def _on_wake(self) -> None:
        """Awake again: a scrape during sleep has reported the throughput window, which is not reported again."""
        if self.scraped_asleep and self.metrics is not None:
            self.metrics.reset_window()
        self.scraped_asleep = False

    def _poke(self) -> None:
        engine = self.engine
        if engine is not None:
            engine.poke()

    def loaded(self) -> contextlib.AbstractContextManager[bool]:
        """For a read-only route: ``with state.loaded() as awake``: True, the model and engine are there until the
        block ends; False, the model sleeps: answer from ``snapshots`` (a short block, without ``await``)."""
        if self.sleeper is None:
            return contextlib.nullcontext(True)
        return self.sleeper.pinned()

    @property
    def sleeping(self) -> bool:
        return self.sleeper is not None and self.sleeper.sleeping

    def wait(self, timeout: float | None = None) -> None:
        """Until the model is loaded; raises RuntimeError with the load error."""
        deadline = None if timeout is None else time.time() + timeout
        while not self.ready.is_set():
            if self.failed.wait(0.05):
                raise RuntimeError(f"the model failed to load: {self.error}")
            if deadline is not None and time.time() > deadline:
                raise RuntimeError("the model did not load in time")

    @property
    def running_engine(self) -> Engine:
        """The engine of a loaded server (a route has it: the ``Gate`` answers 503 until then, and wakes a sleeping
        model first)."""
        assert self.engine is not None
        return self.engine

    @property
    def model_id(self) -> str:
        if self.config.alias:
            return sorted(self.config.alias)[0]
        return self._model_name

    def drain(self, grace: float) -> None:
        """Shut down gracefully (``Engine.drain``); a sleeping model stays asleep (its waiters get a 503)."""
        if self.sleeper is not None:
            self.sleeper.stop()
        engine = self.engine
        if engine is not None:
            engine.drain(grace)

    def close(self) -> None:
        if self.sleeper is not None:
            self.sleeper.stop()
        engine = self.engine
        if engine is not None:
            engine.stop()
        elif self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)  # sleeping (it ends at once), or loading


def _release() -> None:
    """Give the released model's memory back: collected now (its cycles too), the heap trimmed."""
    gc.collect()
    release_memory()


def chat_template(gguf_template: str | None, override: str | None, use_jinja: bool) -> str | None:
    """The chat template a server renders, as llama-server picks it: ``override`` (``--chat-template``: a built-in
    name, or jinja source) over the GGUF's. With jinja, the source is rendered as is (checked here: it must parse);
    without (``--no-jinja``), it stands for the built-in template llama.cpp detects from it, and one it cannot
    detect is refused. None: the GGUF has none (the runtime's built-in one for its turn markers). ValueError with
    llama-server's message when the template cannot be used."""
    from samplechain.chat.builtin import BUILTINS, detect_builtin
    from samplechain.chat.template import template_caps

    source = override if override else gguf_template
    if not source:
        return None
    if source.strip() in BUILTINS:
        return source.strip()
    if use_jinja:
        try:
            template_caps(source)
        except ValueError as e:
            raise ValueError(f"the supplied chat template is not supported: {e}") from None
        return source
    name = detect_builtin(source)
    if name not in BUILTINS:
        shown = source if len(source) <= 80 else source[:77] + "..."
        raise ValueError(f"the supplied chat template is not supported: {shown!r} (without --jinja only llama.cpp's "
                         f"built-in templates are: {', '.join(sorted(BUILTINS))})")
    return name


def served_model(model: Any, config: ServerConfig) -> Any:
    """The model as this server renders chats: its chat template as ``chat_template`` resolves it, and the
    ``--reasoning`` default for ``enable_thinking`` (under a request's ``chat_template_kwargs``, as llama-server's
    default template kwargs). A shallow copy when anything differs: the loaded model itself is never changed (tests
    share one between servers)."""
    template = chat_template(model.vocab.chat_template, config.chat_template, config.use_jinja)
    if template == model.vocab.chat_template and config.enable_thinking is None:
        return model
    served = copy.copy(model)
    served.vocab = copy.copy(model.vocab)
    served.vocab.chat_template = template
    served.enable_thinking = config.enable_thinking  # the chat layer's default (``prompts.chat_apply``)
    return served
