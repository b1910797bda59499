"""llama.cpp's sampler chains inside vLLM (v1): a logits processor that picks each opted-in request's token.

``SamplechainLogitsProcessor`` is a vLLM v1 ``LogitsProcessor`` (``vllm.v1.sample.logits_processor``). A request
opts in by carrying llama-server's sampling fields at the top level of ``SamplingParams.extra_args`` (clients send
them as ``vllm_xargs``): ``samplers``, ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``dry_*``, ``xtc_*``,
``mirostat*``, ``typical_p``, ``top_n_sigma``, ``grammar``, ``json_schema``, ``grammar_lazy`` /
``grammar_triggers``, ``reasoning_budget``, ``seed``, ``n_probs``, ... (or ``"samplechain": true`` for
llama.cpp's defaults); missing fields take llama.cpp's defaults. Other requests pass through untouched.

Each opted-in request owns a :class:`~samplechain.params.CommonSampler` (prompt accepted as llama-server
accepts it, then every output token). A step runs the batch's chains through :class:`~samplechain.device.
BatchSampler` on vLLM's logits tensor and device (per-row parameters, per-request llama.cpp-exact generators, a
CPU tail only where a sampler needs it; grammar rows on the CPU) and returns each opted-in row one-hot: 0 at the
chosen token, -inf elsewhere, so vLLM emits exactly that token whatever its own temperature, penalties or top-k.
The token equals ``CommonSampler.sample`` on the same row with the same seed and history.

vLLM facts this relies on (vLLM 0.32):

* chunked prefill samples rows whose token is then thrown away: a step's draw is *pending* and is committed only
  when the token shows up in the request's output ids at the next step; otherwise the generators are rewound;
* preemption removes a request and adds it back later (same output-id list): state is keyed by that list, and
  removed requests are parked (up to ``MAX_PARKED``) rather than dropped;
* ``n > 1``: the children share ``extra_args``. Without vLLM's ``seed`` they share one ``SamplingParams`` object
  in the engine core, so the i-th child seen samples with ``seed + i``, as llama-server's choices do (vLLM's own
  ``seed`` is not needed, and on CPU it breaks chunked prefill: vLLM rewinds a CPU generator's offset); without
  a seed each child draws a random one. With vLLM's ``seed`` set and no ``extra_args["seed"]``, each child's
  vLLM seed (``seed + i``) is used;
* vLLM refuses custom logits processors with speculative decoding on, and so does this class;
* the logprobs vLLM reports are the raw model's. ``n_probs`` (post-chain probabilities, llama-server's
  ``post_sampling_probs``) cannot travel in vLLM's output: they are kept per request under
  ``extra_args["samplechain_id"]`` and read in-process with :func:`post_sampling_probs` (``LLM`` with
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0``); see docs/vllm.md.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from samplechain.device.batch import BatchSampler
from samplechain.param_specs import declarations
from samplechain.params import CommonSampler, SamplingParams

logger = logging.getLogger("samplechain.vllm")

MAX_PARKED = 1024  # removed requests kept for a possible resumption after preemption
OPT_IN = "samplechain"  # extra_args key that opts in with llama.cpp's defaults
PROBS_KEY = "samplechain_id"  # extra_args key naming a request's n_probs record
ALIASES = {"reasoning_budget": "reasoning_budget_tokens"}  # llama-server's name for the budget
FIELDS = frozenset({OPT_IN, *ALIASES, *(n for d in declarations(SamplingParams) for n in d.request_names)})
_DEFAULT_SEED = SamplingParams().seed

_POST_PROBS: OrderedDict[str, list[list[tuple[int, float]]]] = OrderedDict()
MAX_PROBS_RECORDS = 4096


def post_sampling_probs(request_tag: str) -> list[list[tuple[int, float]]]:
    """The ``n_probs`` record of the request whose ``extra_args["samplechain_id"]`` is ``request_tag``: per
    generated token, up to ``n_probs`` (token, probability) after the chain, highest first (llama-server's
    ``post_sampling_probs``). In-process only (the processor runs in vLLM's engine core)."""
    return list(_POST_PROBS.get(request_tag, []))


def wants_samplechain(extra_args: Mapping[str, Any] | None) -> bool:
    """Whether a request opts in: its ``extra_args`` carry a llama-server sampling field (or ``samplechain``)."""
    return bool(extra_args) and any(k in FIELDS for k in extra_args) and extra_args.get(OPT_IN, True) is not False


def request_params(extra_args: Mapping[str, Any], vllm_seed: int | None = None, choice: int = 0) -> SamplingParams:
    """The llama.cpp parameters of a request: llama-server's fields read from ``extra_args`` over llama.cpp's
    defaults (``json_schema`` as llama-server reads it: ``{}`` is any object). The seed: ``extra_args["seed"]``,
    else vLLM's ``seed``, else a random one; choice ``i`` of ``n`` gets ``seed + i`` (llama-server's rule)."""
    from samplechain.grammar import json_schema_to_gbnf
    from samplechain.server.config import Defaults
    from samplechain.server.limits import APIError
    from samplechain.server.request import parse_sampling

    body = {ALIASES.get(k, k): v for k, v in extra_args.items() if k in FIELDS and k not in (OPT_IN, PROBS_KEY)}
    try:  # the server's reading of the fields, with its limits (schema and grammar sizes, counts, texts)
        params = parse_sampling(body, Defaults())
    except APIError as e:
        raise ValueError(e.message) from None
    if params.json_schema is not None and not params.grammar:
        json_schema_to_gbnf(params.json_schema)  # an invalid schema is refused at admission
    if "seed" not in body and vllm_seed is not None:
        params = dataclasses.replace(params, seed=int(vllm_seed) & 0xFFFFFFFF)
    if choice and params.seed != _DEFAULT_SEED:
        params = dataclasses.replace(params, seed=(params.seed + choice) & 0xFFFFFFFF)
    return params


class _Request:
    """One opted-in request: its sampler, how many of its output ids the sampler has seen, the pending draw."""

    __slots__ = ("broken", "common", "n_probs", "out", "params", "pending", "row", "seen", "tag")

    def __init__(self, common: CommonSampler, out: list[int], params: Any, tag: str | None) -> None:
        self.common = common
        self.out = out  # vLLM's live output-id list (a strong reference: its id is our key)
        self.params = params
        self.seen = 0
        self.pending: tuple | None = None  # (token, snapshot, row logits or None)
        self.row = _RowProxy(self)
        self.broken: str | None = None
        self.tag = tag
        self.n_probs = common.params.n_probs


class _RowProxy:
    """A request's sampler as ``BatchSampler`` drives it, with the accept deferred: the token is only pending."""

    __slots__ = ("req",)

    def __init__(self, req: _Request) -> None:
        self.req = req

    @property
    def samplers(self):
        return self.req.common.samplers

    @property
    def cpu_only(self) -> bool:
        return self.req.common.cpu_only

    def sample(self, logits: np.ndarray) -> int:
        """``CommonSampler.sample`` without its accept (grammar checked after the chain, resampled with the mask
        when refused, as llama-server's ``grammar_first=false``)."""
        common = self.req.common
        has_grammar = common.grammar_applies()
        c, token = common.select(logits, False, None)
        if has_grammar and not common.grammar_allows(token):
            c, token = common.select(logits, True, None)
        common.record(c)
        self.req.pending = (token, *self.req.pending[1:])
        return token

    def accept(self, token: int, is_generated: bool = False) -> None:
        self.req.pending = (token, *self.req.pending[1:])

    def record(self, candidates: Any) -> None:
        self.req.common.record(candidates)


def _snapshot(common: CommonSampler) -> list:
    """What one sampling step may change before its token is accepted: generator positions, mirostat's mu,
    adaptive-p's pending pick."""
    snap = []
    for s in common.samplers:
        rng = getattr(s, "rng", None)
        if rng is not None:
            snap.append((rng, "rewind", rng.mark()))
        for attr in ("mu", "_pending", "_original"):
            if hasattr(s, attr):
                snap.append((s, attr, getattr(s, attr)))
    return snap


def _restore(snap: list) -> None:
    for obj, attr, value in snap:
        if attr == "rewind":
            obj.rewind(value)
        else:
            setattr(obj, attr, value)


class SamplechainLogitsProcessor(LogitsProcessor):
    """llama.cpp's ``common_sampler`` chain per request, batched on vLLM's logits (see the module's notes)."""

    instances: ClassVar[weakref.WeakSet] = weakref.WeakSet()  # for tests and in-process inspection

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Admission check: a bad field is a ``ValueError`` (HTTP 400 from ``vllm serve``)."""
        extra = sampling_params.extra_args
        if wants_samplechain(extra):
            request_params(extra)

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        if getattr(vllm_config, "speculative_config", None):
            raise ValueError("samplechain's logits processor cannot run with speculative decoding: it picks every "
                             "token itself; turn speculative decoding off")
        self.vllm_config = vllm_config
        self.device = device
        # loaded twice (the entry point and --logits-processors / logits_processors=[...]): the second is inert
        self.inert = any(p.vllm_config is vllm_config and not p.inert for p in list(self.instances))
        self.n_vocab = int(vllm_config.model_config.get_vocab_size())
        self._vocab = None
        self._rows: dict[int, _Request] = {}  # batch index -> request
        self._parked: OrderedDict[int, _Request] = OrderedDict()  # id(output list) -> removed request
        self._bs: BatchSampler | None = None
        self._bs_key: tuple = ()
        self._families: OrderedDict[int, list] = OrderedDict()  # id(params) -> [params, requests seen]
        self.trace: list | None = None  # tests: (tag, row logits, token) per committed step
        SamplechainLogitsProcessor.instances.add(self)

    def is_argmax_invariant(self) -> bool:
        return self.inert  # an inert duplicate changes nothing

    # --- batch bookkeeping ---------------------------------------------------------------------------------

    @property
    def vocab(self):
        if self._vocab is None:
            from samplechain.integrations.vllm_vocab import vocab_for

            self._vocab = vocab_for(self.vllm_config.model_config, self.n_vocab)
        return self._vocab

    def _new_request(self, params: Any, prompt: list[int] | None, out: list[int]) -> _Request | None:
        extra = params.extra_args
        tag = extra.get(PROBS_KEY)
        family = self._families.setdefault(id(params), [params, 0])  # n > 1: children share a params object
        choice, family[1] = family[1], family[1] + 1
        self._families.move_to_end(id(params))
        while len(self._families) > MAX_PARKED:
            self._families.popitem(last=False)
        try:
            common = CommonSampler(request_params(extra, params.seed, choice), self.vocab, n_vocab=self.n_vocab)
            for t in prompt or ():
                common.accept(int(t), is_generated=False)
        except Exception as e:  # validated at admission; a grammar the vocabulary refuses lands here
            logger.error("samplechain: request left to vLLM's sampling: %s", e)
            return None
        req = _Request(common, out, params, None if tag is None else str(tag))
        if req.n_probs and req.tag is not None:
            _POST_PROBS[req.tag] = []
            while len(_POST_PROBS) > MAX_PROBS_RECORDS:
                _POST_PROBS.popitem(last=False)
        return req

    def _park(self, req: _Request) -> None:
        if not req.broken:  # the last step's token is in the output ids by now (finished or preempted)
            try:
                self._sync(req)
            except Exception as e:
                req.broken = str(e)
        self._parked[id(req.out)] = req
        self._parked.move_to_end(id(req.out))
        while len(self._parked) > MAX_PARKED:
            self._parked.popitem(last=False)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None or self.inert:
            return
        for index in batch_update.removed:
            req = self._rows.pop(index, None)
            if req is not None:
                self._park(req)
        for index, params, prompt, out in batch_update.added:
            old = self._rows.pop(index, None)
            if old is not None:
                self._park(old)
            if params is None or not wants_samplechain(getattr(params, "extra_args", None)):
                continue
            req = self._parked.pop(id(out), None)
            if req is None or req.out is not out:
                req = self._new_request(params, prompt, out)
            if req is not None:
                self._rows[index] = req
        for a, b, direction in batch_update.moved:
            ra, rb = self._rows.pop(a, None), self._rows.pop(b, None)
            if direction == MoveDirectionality.SWAP:
                if ra is not None:
                    self._rows[b] = ra
                if rb is not None:
                    self._rows[a] = rb
            else:  # a -> b; whatever was at b was removed or is replaced
                if rb is not None:
                    self._park(rb)
                if ra is not None:
                    self._rows[b] = ra

    # --- a step ------------------------------------------------------------------------------------------

    def _sync(self, req: _Request) -> None:
        """Bring the sampler up to the request's output ids: commit the pending draw when its token is the next
        output id, else rewind it; accept any other new ids (after a resumption)."""
        out = req.out
        n = len(out)
        while n > req.seen and out[n - 1] == -1:  # async scheduling's placeholders
            n -= 1
        pending, req.pending = req.pending, None
        if pending is not None:
            token, snap, row = pending
            if n > req.seen and out[req.seen] == token:
                req.common.accept(token, is_generated=True)
                req.seen += 1
                if self.trace is not None:
                    self.trace.append((req.tag, row, token))
                if req.n_probs and req.tag in _POST_PROBS:
                    _POST_PROBS[req.tag].append(req.common.top_probs(req.n_probs))
            else:
                _restore(snap)
        if n < req.seen:
            req.broken = f"the output ids shrank from {req.seen} to {n}"
            return
        if n > req.seen:
            logger.warning("samplechain: %d output ids accepted without their draws", n - req.seen)
            for t in out[req.seen : n]:
                req.common.accept(int(t), is_generated=True)
            req.seen = n

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._rows:
            return logits
        batch = logits.shape[0]
        rows = []
        for i in sorted(self._rows):
            req = self._rows[i]
            if i >= batch or req.broken:
                continue
            try:
                self._sync(req)
            except Exception as e:  # e.g. a grammar refusing a token vLLM forced
                req.broken = str(e)
            if req.broken:
                logger.error("samplechain: request left to vLLM's sampling: %s", req.broken)
                continue
            rows.append(i)
        if not rows:
            return logits
        reqs = [self._rows[i] for i in rows]
        whole = rows == list(range(batch))
        index = None if whole else torch.tensor(rows, dtype=torch.int64, device=logits.device)
        x = logits if whole else logits.index_select(0, index)
        keep_rows = self.trace is not None
        host = x.detach().float().cpu().numpy() if keep_rows else None
        for j, req in enumerate(reqs):
            req.pending = (-1, _snapshot(req.common), None if host is None else host[j].copy())
        tokens = self._sample(reqs, x)
        chosen = torch.tensor(tokens, dtype=torch.int64, device=logits.device)
        if whole:
            logits.fill_(-math.inf)
            logits.scatter_(1, chosen[:, None], 0.0)
        else:
            logits.index_fill_(0, index, -math.inf)
            logits[index, chosen] = 0.0
        return logits

    def _sample(self, reqs: list[_Request], x: torch.Tensor) -> list[int]:
        key = tuple(id(r) for r in reqs)
        if self._bs is None or key != self._bs_key or self._bs.device != x.device:
            self._bs = BatchSampler([r.row for r in reqs], x.device)
            self._bs_key = key
        try:
            return self._bs.sample(x)
        except ValueError:  # a row the chain cannot sample (NaN logits, nothing left): those rows alone
            tokens = []
            for j, r in enumerate(reqs):
                _restore(r.pending[1])
                try:
                    tokens.append(BatchSampler([r.row], x.device).sample(x[j : j + 1])[0])
                except ValueError as e:
                    r.broken = str(e)
                    r.pending = None
                    tokens.append(int(torch.argmax(x[j])))
            self._bs = None
            return tokens
