"""Traces of sampling steps: the candidates after every stage of a ``CommonSampler``'s chain (issue 16).

:func:`trace_step` samples one token with :meth:`CommonSampler.sample` itself, observing it, and records, after
each stage, the number of candidates, the top ``n_top`` of them (id, logit, probability) and the token a selector
chose. It changes nothing about the result: the stages are ``CommonSampler.stages`` (the reasoning budget, the
grammar when it is applied first, the chain's members), observed one member at a time; ``Chain.apply`` fuses runs
such as top-k -> top-p -> min-p -> temp -> dist into one step that is bitwise the members applied one by one
(spec/samplers §2.4, tests/test_fused_chain.py), so the candidates, probabilities, random draws, the selected token
and the sampler's state afterwards are those of an unobserved ``sample``. When the grammar refuses the token
(rejection), it is recorded as ``rejected`` and the stages are those of the second pass, from fresh candidates with
the grammar applied first.

Snapshots only read ``ids`` and ``logits``: samplers never write into candidate arrays (they install new ones), so
a stage keeps references and nothing is copied until the rows are built. A stage's probabilities are the softmax
of its candidates' logits (the distribution a draw after it would use), computed by the trace.

:func:`trace` runs several steps on a model, each appending the selected token; :class:`TraceContext` is a context
of its own that reuses the common prefix of the previous trace's tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from samplechain.candidates import Candidates
from samplechain.params import CommonSampler, SamplingParams
from samplechain.samplers._ops import check_int
from samplechain.samplers.base import Sampler

if TYPE_CHECKING:  # the runtime sits above this module's own dependencies; only its types are needed here
    from samplechain.runtime.context import Context
    from samplechain.runtime.generation import Model
    from samplechain.vocab import Vocab

_NEG_INF = np.float32(-np.inf)


@dataclass
class TokenRow:
    """One candidate as a stage left it: ``logit`` None for -inf; ``prob`` its share of the softmax over the
    stage's candidates; ``rank`` its place in descending logit order."""

    id: int
    logit: float | None
    prob: float
    rank: int
    piece: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "piece": self.piece, "logit": self.logit, "prob": self.prob, "rank": self.rank}


@dataclass
class Stage:
    """The candidates after one stage: ``name`` is ``logits`` for the input, else the sampler's display name;
    ``selected`` the token a selector chose here (None before the selector); ``chosen`` the step's selected token
    as this stage left it (None once a stage removed it)."""

    name: str
    effect: str | None
    params: dict[str, Any]
    size: int
    n_masked: int
    top: list[TokenRow]
    selected: int | None = None
    chosen: TokenRow | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "effect": self.effect, "params": self.params, "size": self.size,
                "n_masked": self.n_masked, "selected": self.selected, "top": [r.to_dict() for r in self.top],
                "chosen": None if self.chosen is None else self.chosen.to_dict()}


@dataclass
class StepTrace:
    """One sampling step: the selected ``token``, the stages, and the token the grammar refused (if it did)."""

    token: int
    stages: list[Stage]
    piece: str | None = None
    rejected: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"token": self.token, "piece": self.piece, "rejected": self.rejected,
                "stages": [s.to_dict() for s in self.stages]}


@dataclass
class Trace:
    """Several steps on a model: each step's token was appended before the next was traced."""

    chain: str
    n_prompt_tokens: int
    steps: list[StepTrace] = field(default_factory=list)
    stopped: bool = False  # the last token ends the generation

    @property
    def tokens(self) -> list[int]:
        return [s.token for s in self.steps]

    def to_dict(self) -> dict[str, Any]:
        return {"chain": self.chain, "n_prompt_tokens": self.n_prompt_tokens, "tokens": self.tokens,
                "stopped": self.stopped, "steps": [s.to_dict() for s in self.steps]}


# --- one step ---------------------------------------------------------------------------------------------------


class _Snapshot:
    """A stage's arrays, by reference (the candidates' arrays are never written in place)."""

    __slots__ = ("effect", "ids", "logits", "name", "params", "selected")

    def __init__(self, name: str, sampler: Sampler | None, c: Candidates) -> None:
        self.name = name
        self.effect = None if sampler is None else type(sampler).effect
        self.params = {} if sampler is None else _jsonable(sampler._params())
        self.ids, self.logits = c.ids, c.logits
        self.selected = int(c.ids[c.selected]) if sampler is not None and 0 <= c.selected < len(c) else None


def trace_step(sampler: CommonSampler, logits: object, *, n_top: int = 10, grammar_first: bool = False,
               vocab: Vocab | None = None) -> StepTrace:
    """Sample and accept one token with ``sampler.sample(logits, grammar_first)``, recording every stage.

    The token, the random draws and the sampler's state afterwards are exactly those of ``sample``; ``n_top``
    candidates (by descending logit) are kept per stage; ``vocab`` (default: the sampler's) names the pieces.
    """
    n_top = check_int("n_top", n_top, minimum=1)
    vocab = vocab if vocab is not None else sampler.vocab
    passes: list[list[_Snapshot]] = []  # a second pass: the grammar refused the first one's token

    def observe(name: str, s: Sampler | None, c: Candidates) -> None:
        if s is None:
            passes.append([])
        passes[-1].append(_Snapshot(name, s, c))

    token = sampler.sample(logits, grammar_first, observe=observe)
    rejected = passes[0][-1].selected if len(passes) > 1 else None  # the first pass's selected token
    stages = [_stage(s, token, n_top, vocab) for s in passes[-1]]
    return StepTrace(token, stages, _piece(vocab, token), rejected)


def _stage(snap: _Snapshot, token: int, n_top: int, vocab: Vocab | None) -> Stage:
    x = snap.logits
    probs = _softmax(x)
    order = _top(x, n_top)

    def row(i: int, rank: int) -> TokenRow:
        t = int(snap.ids[i])
        logit = float(x[i])
        return TokenRow(t, logit if math.isfinite(logit) else None, float(probs[i]), rank, _piece(vocab, t))

    top = [row(int(i), r) for r, i in enumerate(order)]
    chosen = None
    hit = np.flatnonzero(snap.ids == token)
    if hit.size:
        i = int(hit[0])
        v = x[i]
        # its place in the descending, position-stable order
        chosen = row(i, int(np.count_nonzero(x > v)) + int(np.count_nonzero(x[:i] == v)))
    return Stage(snap.name, snap.effect, snap.params, len(x), int(np.count_nonzero(x == _NEG_INF)), top,
                 snap.selected, chosen)


def _top(x: np.ndarray, n: int) -> np.ndarray:
    """Positions of the ``n`` largest finite logits, descending, ties in position order."""
    if n < len(x):
        v = x[np.argpartition(-x, n - 1)[n - 1]]  # the n-th largest value
        above = np.flatnonzero(x > v)
        ties = np.flatnonzero(x == v)[: n - len(above)]
        cand = np.concatenate([above, ties])
    else:
        cand = np.arange(len(x))
    order = cand[np.argsort(-x[cand], kind="stable")]
    return order[x[order] > _NEG_INF]


def _softmax(x: np.ndarray) -> np.ndarray:
    """A stage's distribution: the softmax of its candidates' logits (binary64, rounded once). Not the
    candidates' ``probs``, which a truncating sampler leaves unnormalized: this is what a draw right after the
    stage would draw from (after the selector, what it drew from)."""
    if len(x) == 0:
        return np.zeros(0, dtype=np.float32)
    m = x.max()
    if m == _NEG_INF:
        return np.zeros(len(x), dtype=np.float32)
    e = np.exp(x.astype(np.float64) - float(m))
    return (e / e.sum()).astype(np.float32)


def _piece(vocab: Vocab | None, token: int) -> str | None:
    return None if vocab is None else vocab.token_bytes(token).decode("utf-8", "replace")


def _jsonable(value: Any) -> Any:
    """Sampler parameters as JSON values: numbers as Python numbers, non-finite ones as None, keys as text."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else None
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return repr(value)


# --- several steps on a model ------------------------------------------------------------------------------------


class TraceContext:
    """A context of its own for traces (one sequence), reusing the common prefix of the previous tokens."""

    def __init__(self, model: Model, n_ctx: int, n_batch: int = 512) -> None:
        self.model = model
        self.ctx: Context = model.new_context(n_ctx, n_seq_max=1, n_batch=n_batch)
        from samplechain.runtime.sequence import Sequence as CacheSequence

        self.seq = CacheSequence(self.ctx)

    @property
    def cached(self) -> list[int]:
        """The tokens in the cache, position by position."""
        return self.seq.tokens

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """The logits after ``tokens`` (float32 [n_vocab]); at least the last token is decoded again."""
        tokens = list(tokens)
        if not tokens:
            raise ValueError("the prompt is empty")
        if len(tokens) > self.n_ctx:
            raise ValueError(f"{len(tokens)} tokens do not fit the trace context of {self.n_ctx}")
        todo = tokens[self.seq.reuse(tokens):]
        out = self.seq.decode(todo, outputs=[False] * (len(todo) - 1) + [True])
        return out[-1].float().cpu().numpy()


def trace(model: Model, tokens: Sequence[int], params: SamplingParams | None = None, *, n_top: int = 10,
          steps: int = 1, generated: Sequence[int] = (), context: TraceContext | None = None,
          sampler: CommonSampler | None = None) -> Trace:
    """Trace ``steps`` sampling steps after the prompt ``tokens``: each selected token is appended and decoded
    before the next step, as a generation does; it stops early at an end-of-generation token.

    The sampler is set up as the server's slots set theirs up (the prompt accepted as history, not generated),
    so a trace of N steps selects the tokens a generation of N tokens with the same parameters selects.
    ``generated``: tokens already chosen after the prompt (e.g. by earlier traces), accepted as generated (the
    grammar, the reasoning budget and the penalties see them; random draws start again from the seed).
    ``sampler``: a fresh ``CommonSampler`` of ``params``, already built (the server builds it off the engine
    thread, with the grammar compiled within its budget).
    """
    params = params or SamplingParams()
    steps = check_int("steps", steps, minimum=1)
    tokens = [int(t) for t in tokens]
    generated = [int(t) for t in generated]
    if not tokens:
        raise ValueError("the prompt is empty")
    n_vocab = model.config.n_vocab
    for t in (*tokens, *generated):
        if not 0 <= t < n_vocab:
            raise ValueError(f"token id {t} is not in [0, {n_vocab})")
    if sampler is None:
        sampler = CommonSampler(params, model.vocab, n_vocab=n_vocab)
    for t in tokens:
        sampler.accept(t, is_generated=False)
    for t in generated:
        sampler.accept(t, is_generated=True)
    seq = tokens + generated
    ctx = context if context is not None else TraceContext(model, max(8, len(seq) + steps))
    if len(seq) + steps - 1 > ctx.n_ctx:
        raise ValueError(f"{len(seq)} tokens and {steps} steps do not fit the context of {ctx.n_ctx} tokens")
    out = Trace(sampler.describe(), len(tokens))
    for _ in range(steps):
        step = trace_step(sampler, ctx.logits(seq), n_top=n_top)
        out.steps.append(step)
        seq.append(step.token)
        if model.vocab.is_eog(step.token):
            out.stopped = True
            break
    return out


def format_trace(t: Trace, *, width: int = 12) -> str:
    """The trace as text: one table per stage (rank, id, piece, logit, probability; * marks the selected token)."""
    lines = [f"chain: {t.chain}", f"prompt: {t.n_prompt_tokens} tokens"]
    for n, step in enumerate(t.steps):
        lines.append("")
        head = f"step {n + 1}: selected {step.token} {step.piece!r}"
        if step.rejected is not None:
            head += f" (the grammar refused {step.rejected} first; traced again with the grammar first)"
        lines.append(head)
        for stage in step.stages:
            params = ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in stage.params.items() if k not in ("grammar", "n_vocab"))
            what = f"{stage.name}" + (f" ({params})" if params else "")
            extra = f", {stage.n_masked} masked" if stage.n_masked else ""
            sel = f", selected {stage.selected}" if stage.selected is not None else ""
            lines.append(f"  {what}: {stage.size} candidates{extra}{sel}")
            lines.append(f"    {'rank':>4} {'id':>7}  {'piece':<{width}} {'logit':>10} {'prob':>8}")
            rows = list(stage.top)
            if stage.chosen is not None and all(r.id != stage.chosen.id for r in rows):
                rows.append(stage.chosen)
            for r in rows:
                mark = "*" if r.id == step.token else " "
                piece = repr(r.piece)[1:-1] if r.piece is not None else ""
                if len(piece) > width:
                    piece = piece[: width - 1] + "…"
                logit = "-inf" if r.logit is None else f"{r.logit:.4f}"
                lines.append(f"  {mark} {r.rank:>4} {r.id:>7}  {piece:<{width}} {logit:>10} {r.prob:>8.4f}")
    if t.stopped:
        lines.append("")
        lines.append("(end of generation)")
    return "\n".join(lines)
