"""Speculative decoding as one declared configuration: llama.cpp's speculative flags (``common/arg.cpp``:
``--spec-type``, ``--draft-max``, ``--draft-min``, ``--draft-p-min``, the n-gram sizes, the lookup caches), held as
plain values so the CLI, ``serve`` and ``samplechain.server.start()`` turn drafting on the same way, and a server's
configuration stays a plain value (it crosses processes: Ray replicas, the router's children).

``build()`` gives the ``Speculation`` of one sequence (its own drafters: they index that sequence's tokens); a draft
model, loaded once by its owner, is passed in (``draft``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from samplechain.options import option
from samplechain.runtime.speculation import Drafter, Speculation, synth_probabilities
from samplechain.speculative.ngram import make_drafters
from samplechain.validate import cli_non_negative_int, cli_number

# llama-server's --spec-default: ngram-mod with these sizes (common/arg.cpp)
SPEC_DEFAULT = {"ngram_mod_n_match": 24, "ngram_mod_n_min": 48, "ngram_mod_n_max": 64}


class SynthError(ValueError):
    """A bad synthetic acceptance setting (``synth_rates`` / ``synth_len``): on ``serve``'s command line, a usage
    error."""


@dataclass(frozen=True)
class SpeculationConfig:
    """How to draft. ``types``: ``--spec-type`` values (each may list several, comma-separated; ``draft-simple``
    drafts with a draft model); ``n_max`` / ``n_min``: the longest draft and the shortest kept; ``p_min``: a draft
    model stops below this top probability; ``adaptive``: the draft length follows measured cost and acceptance
    (else always ``n_max``); ``verify``: ``compare`` (llama.cpp's sample-and-compare: the same text as without
    drafting) or ``sample`` (distribution-preserving, draft model); ``ngram``: ``make_drafters``' parameters
    (sizes, ``lookup_cache_static`` / ``_dynamic``); ``synth_rates`` / ``synth_len``: synthetic acceptance for
    benchmarks (llama-server's ``--spec-synth-*``: fixed lengths up to ``n_max``)."""

    types: tuple[str, ...] = option((), "--spec-type", action="append", flag_default=[], convert=tuple,
                                    metavar="TYPES",
                                    help="comma-separated drafters: ngram-simple, ngram-map-k, ngram-map-k4v, "
                                         "ngram-mod, ngram-cache, draft-simple (with -md), none; repeatable")
    n_max: int = option(16, "--draft-max", "--draft", "--draft-n", "--spec-draft-n-max", type=cli_non_negative_int,
                        help="longest draft (the length adapts below it)")
    n_min: int = option(0, "--draft-min", "--draft-n-min", "--spec-draft-n-min", type=cli_non_negative_int,
                        help="shorter drafts are dropped")
    p_min: float = option(0.0, "--draft-p-min", "--spec-draft-p-min", type=cli_number,
                          help="draft model: stop drafting below this top-10 probability")
    adaptive: bool = option(True, "--spec-adaptive", negative=("--spec-no-adaptive",), action="store_true",
                            help="the draft length follows the measured verify cost and acceptance (default)",
                            negative_help="always draft up to --draft-max")
    verify: str = option("compare", "--spec-verify", choices=("compare", "sample"),
                         help="compare: llama.cpp's sample-and-compare (same text as without drafting); sample: "
                              "distribution-preserving speculative sampling (draft model)")
    seed: int | None = None
    ngram: Mapping[str, Any] = field(default_factory=dict)
    synth_rates: tuple[float, ...] | None = None
    synth_len: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.types, str):
            object.__setattr__(self, "types", (self.types,))
        self.check()

    @property
    def names(self) -> set[str]:
        """Every drafter type named (``none`` drops the value it is in, as llama.cpp reads it)."""
        return {t.strip() for value in self.types if "none" not in value.split(",") for t in value.split(",")}

    @property
    def draft_model(self) -> bool:
        """Whether a draft model drafts (``draft-simple``)."""
        return "draft-simple" in self.names

    @property
    def synth(self) -> tuple[float, ...]:
        """The synthetic acceptance rates, one per draft position (empty: off)."""
        return tuple(synth_probabilities(self.synth_rates, self.synth_len, self.n_max) or ())

    def draft_params(self) -> dict[str, Any]:
        """A draft model's ``DraftModel`` parameters (``speculative/draft_model.py``): it drafts at least one token."""
        return {"n_max": max(1, self.n_max), "n_min": self.n_min, "p_min": self.p_min,
                "sample": self.verify == "sample", "seed": self.seed}

    def check(self) -> None:
        """ValueError for an unknown type or parameter, a bad length or rate (before anything loads)."""
        if self.verify not in ("compare", "sample"):
            raise ValueError(f"verify must be compare or sample, got {self.verify!r}")
        if self.n_max < 0 or self.n_min < 0:
            raise ValueError(f"draft lengths must be non-negative, got n_max={self.n_max}, n_min={self.n_min}")
        make_drafters(self.types, **self.ngram)
        try:
            synth = self.synth
        except ValueError as e:
            raise SynthError(str(e)) from None
        if synth and not self.names:
            raise SynthError("synthetic acceptance requires an initialized speculative decoding context (--spec-type)")

    def build(self, draft: Drafter | None = None) -> Speculation | None:
        """A fresh ``Speculation`` for one sequence (None: nothing drafts); ``draft``: the draft model's drafter,
        after the n-gram drafters (llama.cpp's priority order)."""
        if not self.names:
            return None
        drafters = make_drafters(self.types, **self.ngram)
        if draft is not None:
            drafters.append(draft)
        spec = Speculation(drafters, n_max=self.n_max, n_min=self.n_min, adaptive=self.adaptive, verify=self.verify,
                           seed=0 if self.seed is None else self.seed)
        if self.synth:
            spec.synth, spec.adaptive = self.synth, False
        return spec
