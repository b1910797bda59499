"""Traces of sampling steps: the candidates after every stage of a ``CommonSampler``'s chain.

:func:`trace_step` samples one token with :meth:`CommonSampler.sample` itself, observing it, and records, after
each stage, the number of candidates, the top ``n_top`` of them (id, logit, probability) and the token a selector
chose. It changes nothing about the result: the stages are ``CommonSampler.stages`` (the reasoning budget, the
grammar when it is applied first, the chain's members), observed one member at a time; ``Chain.apply`` fuses runs
such as top-k -> top-p -> min-p -> temp -> dist into one step that is bitwise the members applied one by one
(tests/test_fused_chain.py), so the candidates, probabilities, random draws, the selected token
and the sampler's state afterwards are those of an unobserved ``sample``. When the grammar refuses the token
(rejection), it is recorded as ``rejected`` and the stages are those of the second pass, from fresh candidates with
the grammar applied first.

Snapshots only read ``ids`` and ``logits``: samplers never write into candidate arrays (they install new ones), so
a stage keeps references and nothing is copied until the rows are built. A stage's probabilities are the softmax
of its candidates' logits (the distribution a draw after it would use), computed by the trace.

What a stage did is compared with its input (the previous stage's candidates): ``removed`` (live candidates it
removed or masked), ``changed`` (kept candidates whose logit it changed), ``rows`` (its input's top ``n_top``, the
neighbourhood of its cut, the changed candidates with the largest logits and the selected token, each before and
after: bounded, never the whole vocabulary) and ``cut`` (top-k's k-th candidate, top-p's threshold and running
sums, min-p's threshold relative to the top candidate, the temperature's entropies before and after). ``about``
is the first sentence of the sampler's docstring.

:func:`trace` runs several steps on a model, each appending the selected token; :class:`TraceContext` is a context
of its own that reuses the common prefix of the previous trace's tokens.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np

from samplechain._numeric import logf, running_sum_f32
from samplechain.candidates import Candidates
from samplechain.params import CommonSampler, SamplingParams
from samplechain.samplers import (
    DRY,
    DynamicTemperature,
    LogitBias,
    MinP,
    Penalties,
    Temperature,
    TopK,
    TopNSigma,
    TopP,
)
from samplechain.samplers._ops import softmax_values
from samplechain.samplers.base import Sampler
from samplechain.validate import check_int

if TYPE_CHECKING:  # the runtime sits above this module's own dependencies; only its types are needed here
    from samplechain.runtime.context import Context
    from samplechain.runtime.generation import Model
    from samplechain.vocab import Vocab

_NEG_INF = np.float32(-np.inf)
NEIGHBOURS = 3  # input candidates shown on each side of a stage's cut
LOGITS_ABOUT = "The model's raw score (logit) for every token of the vocabulary; their softmax is the distribution."
# stages that work on logits (their cards show logits); the others work on probabilities
_ON_LOGITS = (Penalties, DRY, LogitBias, TopK, TopNSigma)


def _fields_dict(row: Any, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """A row dataclass's fields by name, in declaration order; those named in ``optional`` are left out while None.
    Shallow, unlike ``dataclasses.asdict``: the values are numbers, text and None."""
    out = {}
    for f in fields(row):
        value = getattr(row, f.name)
        if value is not None or f.name not in optional:
            out[f.name] = value
    return out


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
        return _fields_dict(self)


@dataclass
class Row:
    """An input candidate of a stage, before and after it: ``rank`` its place in the stage's input (descending
    logit, ties by position); ``logit``/``prob`` after the stage (None / 0.0 when it removed or masked the
    candidate); ``cum`` (top-p only): the running sum of the input's probabilities down to this candidate, in
    binary32 as top-p sums them."""

    id: int
    piece: str | None
    rank: int
    logit_before: float | None
    prob_before: float
    logit: float | None
    prob: float
    kept: bool
    cum: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return _fields_dict(self, optional=("cum",))


@dataclass
class Stage:
    """The candidates after one stage: ``name`` is ``logits`` for the input, else the sampler's display name;
    ``selected`` the token a selector chose here (None before the selector); ``chosen`` the step's selected token
    as this stage left it (None once a stage removed it); ``top`` its top candidates. Compared with its input:
    ``n_before`` live (finite) input candidates, ``removed`` of them removed or masked, ``changed`` kept ones with
    another logit, ``rows`` the input candidates shown (see :class:`Row`), ``cut`` the stage-specific values;
    ``scale`` is ``logit`` where the stage works on logits, else ``prob``; ``about`` says what the sampler does."""

    name: str
    effect: str | None
    params: dict[str, Any]
    size: int
    n_masked: int
    top: list[TokenRow]
    selected: int | None = None
    chosen: TokenRow | None = None
    about: str = ""
    scale: str = "prob"
    n_before: int = 0
    removed: int = 0
    changed: int = 0
    rows: list[Row] = field(default_factory=list)
    cut: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "effect": self.effect, "about": self.about, "scale": self.scale,
                "params": self.params, "size": self.size, "n_masked": self.n_masked, "n_before": self.n_before,
                "removed": self.removed, "changed": self.changed, "cut": self.cut, "selected": self.selected,
                "top": [r.to_dict() for r in self.top], "rows": [r.to_dict() for r in self.rows],
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

    __slots__ = ("_probs", "effect", "ids", "logits", "name", "params", "sampler", "selected", "sorted")

    def __init__(self, name: str, sampler: Sampler | None, c: Candidates) -> None:
        self.name = name
        self.sampler = sampler
        self.effect = None if sampler is None else type(sampler).effect
        self.params = {} if sampler is None else _jsonable(sampler.params())
        self.ids, self.logits, self.sorted = c.ids, c.logits, c.sorted
        self.selected = int(c.ids[c.selected]) if sampler is not None and 0 <= c.selected < len(c) else None
        self._probs: np.ndarray | None = None

    @property
    def probs(self) -> np.ndarray:
        if self._probs is None:
            self._probs = _softmax(self.logits)
        return self._probs


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
    snaps = passes[-1]
    stages = [_stage(snaps[max(i - 1, 0)], s, token, n_top, vocab) for i, s in enumerate(snaps)]
    return StepTrace(token, stages, _piece(vocab, token), rejected)


def _stage(before: _Snapshot, snap: _Snapshot, token: int, n_top: int, vocab: Vocab | None) -> Stage:
    """``snap``'s stage, compared with its input ``before`` (``snap`` itself for the logits)."""
    x, probs = snap.logits, snap.probs

    def row(i: int, rank: int) -> TokenRow:
        t = int(snap.ids[i])
        return TokenRow(t, _finite(x[i]), float(probs[i]), rank, _piece(vocab, t))

    top = [row(int(i), r) for r, i in enumerate(_ranked(x, 0, n_top)) if x[i] > _NEG_INF]
    chosen = None
    hit = np.flatnonzero(snap.ids == token)
    if hit.size:
        chosen = row(int(hit[0]), _rank_at(x, int(hit[0])))

    # the input's logit of every candidate (a stage never adds candidates, only removes, masks or changes them)
    xb = before.logits
    x_in = xb[_positions(before.ids, snap.ids)]
    live = x > _NEG_INF
    n_before, n_after = int(np.count_nonzero(xb > _NEG_INF)), int(np.count_nonzero(live))
    changed = np.flatnonzero(live & (x != x_in))
    removed = n_before - n_after
    # the input candidates shown: the top n_top, the cut's neighbourhood, the changed ones with the largest logits
    # after the stage, and the selected token
    shown = {int(i): r for r, i in enumerate(_ranked(xb, 0, min(n_top, n_before)))}
    if removed:
        lo = max(0, n_after - NEIGHBOURS)
        shown.update((int(i), lo + r) for r, i in enumerate(_ranked(xb, lo, min(n_before, n_after + NEIGHBOURS))))
    extra = changed[np.argsort(-x[changed], kind="stable")[:n_top]] if len(changed) else changed
    if hit.size:
        extra = np.append(extra, hit[0])
    for i in _positions(before.ids, snap.ids[extra]):
        shown.setdefault(int(i), _rank_at(xb, int(i)))
    order = sorted(shown, key=shown.__getitem__)
    after = _positions(snap.ids, before.ids[order]) if order else np.zeros(0, dtype=np.int64)
    rows = []
    for i, j in zip(order, after.tolist(), strict=True):
        kept = j >= 0 and bool(live[j])
        t = int(before.ids[i])
        rows.append(Row(t, _piece(vocab, t), shown[i], _finite(xb[i]), float(before.probs[i]),
                        _finite(x[j]) if kept else None, float(probs[j]) if kept else 0.0, kept))
    sampler = snap.sampler
    cut = _cut(sampler, before, snap, rows, n_after, removed) if sampler is not None and n_before else {}
    return Stage(snap.name, snap.effect, snap.params, len(x), len(x) - n_after, top, snap.selected, chosen,
                 _about(type(sampler)) if sampler is not None else LOGITS_ABOUT,
                 "logit" if sampler is None or isinstance(sampler, _ON_LOGITS) else "prob",
                 n_before, removed, len(changed), rows, cut)


def _cut(sampler: Sampler, before: _Snapshot, snap: _Snapshot, rows: list[Row], n_after: int,
         removed: int) -> dict[str, Any]:
    """What decided the stage's cut, for the samplers whose cut the page draws (``rows`` gain top-p's sums)."""
    xb = before.logits
    top = int(np.argmax(xb))  # the first largest input logit
    if isinstance(sampler, TopK) and removed:  # it kept its k largest, all live: the k-th is the last kept
        kth = rows[[r.rank for r in rows].index(n_after - 1)]
        return {"kind": "top-k", "k": sampler.k, "kth_rank": kth.rank, "kth_id": kth.id, "kth_logit": kth.logit}
    if isinstance(sampler, TopP):
        # top-p's own arithmetic: the softmax summed in the input's order, then running sums in descending order
        p_in = softmax_values(xb, xb[0] if before.sorted else xb[top])
        # over the rows shown and every kept one (with an infinite logit, NaN probabilities keep more than the rows)
        run = running_sum_f32(p_in[_ranked(xb, 0, max(max(r.rank for r in rows) + 1, n_after))])
        for r in rows:
            r.cum = float(run[r.rank])
        return {"kind": "top-p", "p": float(sampler.p), "min_keep": sampler.min_keep, "kept": n_after,
                "cum_kept": float(run[n_after - 1]), "cum_before_last": float(run[n_after - 2]) if n_after > 1 else 0.0}
    if isinstance(sampler, MinP):
        p_top = float(before.probs[top])
        return {"kind": "min-p", "p": float(sampler.p), "top_id": int(before.ids[top]), "top_prob": p_top,
                "top_logit": float(xb[top]), "threshold_logit": float(xb[top] + logf(sampler.p)),
                "threshold_prob": p_top * float(sampler.p)}
    if isinstance(sampler, (Temperature, DynamicTemperature)):
        out = {"kind": "temperature", "t": float(sampler.t)}
        if isinstance(sampler, DynamicTemperature):
            out["delta"] = float(sampler.delta)
        return {**out, "entropy_before": _entropy(before.probs), "entropy_after": _entropy(snap.probs)}
    return {}


@cache
def _about(kind: type) -> str:
    """The first sentence of a sampler class's docstring, without reStructuredText markup."""
    text = " ".join((kind.__doc__ or "").strip().split("\n\n")[0].split()).replace("``", "")
    m = re.match(r"(.+?[.!?])(\s|$)", text)
    return m.group(1) if m else text


def _entropy(p: np.ndarray) -> float:
    """Shannon entropy in nats of the probabilities ``p`` (binary64)."""
    q = p[p > 0].astype(np.float64)
    return float(-(q * np.log(q)).sum())


def _finite(v: np.floating) -> float | None:
    f = float(v)
    return f if math.isfinite(f) else None


def _ranked(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Positions of the entries of ranks ``lo <= rank < hi`` in descending order, ties by position."""
    hi = min(hi, len(x))
    if lo >= hi:
        return np.zeros(0, dtype=np.int64)
    if hi * 16 > len(x):
        return np.argsort(-x, kind="stable")[lo:hi]
    part = np.partition(-x, [lo, hi - 1])  # the values at ranks lo and hi - 1
    v_lo, v_hi = -part[lo], -part[hi - 1]
    cand = np.flatnonzero((x <= v_lo) & (x >= v_hi))  # ascending: a stable sort orders ties by position
    above = int(np.count_nonzero(x > v_lo))
    return cand[np.argsort(-x[cand], kind="stable")][lo - above:hi - above]


def _rank_at(x: np.ndarray, i: int) -> int:
    """The rank of position ``i`` in the descending, position-stable order."""
    v = x[i]
    return int(np.count_nonzero(x > v)) + int(np.count_nonzero(x[:i] == v))


def _positions(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The position in ``ids`` of each of ``wanted`` (-1 where absent); direct for the untouched vocabulary."""
    wanted = np.asarray(wanted, dtype=np.int64)
    n = len(ids)
    if n and ids[0] == 0 and ids[-1] == n - 1 and np.array_equal(ids, np.arange(n)):
        return np.where((wanted >= 0) & (wanted < n), wanted, -1)
    order = np.argsort(ids, kind="stable")
    k = np.minimum(np.searchsorted(ids[order], wanted), max(n - 1, 0))
    return np.where(ids[order[k]] == wanted, order[k], -1) if n else np.full(len(wanted), -1)


def _softmax(x: np.ndarray) -> np.ndarray:
    """A stage's distribution: the softmax of its candidates' logits (binary64, rounded once). Not the
    candidates' ``probs``, which a truncating sampler leaves unnormalized: this is what a draw right after the
    stage would draw from (after the selector, what it drew from)."""
    if len(x) == 0:
        return np.zeros(0, dtype=np.float32)
    m = x.max()
    if m == _NEG_INF:
        return np.zeros(len(x), dtype=np.float32)
    with np.errstate(invalid="ignore"):  # an infinite logit: NaN probabilities, shown as such
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
          sampler: CommonSampler | None = None, last_only: bool = False) -> Trace:
    """Trace ``steps`` sampling steps after the prompt ``tokens``: each selected token is appended and decoded
    before the next step, as a generation does; it stops early at an end-of-generation token.

    The sampler is set up as the server's slots set theirs up (the prompt accepted as history, not generated),
    so a trace of N steps selects the tokens a generation of N tokens with the same parameters selects.
    ``generated``: tokens already chosen after the prompt (e.g. by earlier traces), accepted as generated (the
    grammar, the reasoning budget and the penalties see them; random draws start again from the seed).
    ``sampler``: a fresh ``CommonSampler`` of ``params``, already built (the server builds it off the engine
    thread, with the grammar compiled within its budget).
    ``last_only``: record the stages of the last step only; the earlier steps are sampled unobserved (bitwise
    the same tokens and state), so a page can show step N + 1 of one random stream at the cost of one trace.
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
    for n in range(steps):
        if last_only and n < steps - 1:
            token = sampler.sample(ctx.logits(seq))
            step = StepTrace(token, [], _piece(sampler.vocab, token))
        else:
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
            extra += f", {stage.removed} removed" if stage.removed else ""
            extra += f", {stage.changed} changed" if stage.changed else ""
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
