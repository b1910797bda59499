"""The --spec-type names, ``make_drafters`` (the n-gram drafters of one sequence in llama.cpp's priority
order) and ``draft_round`` (one drafting round); llama.cpp's are in common/speculative.cpp."""

from __future__ import annotations

import os
from collections.abc import Sequence

from samplechain.runtime.speculation import Drafter
from samplechain.speculative.ngram.cache import NgramCache, NgramCacheTable
from samplechain.speculative.ngram.map_k import NgramMapK
from samplechain.speculative.ngram.mod import NgramMod, NgramModTable
from samplechain.speculative.ngram.simple import NgramSimple
from samplechain.validate import check_int_range

# every --spec-type name; the implementations in llama.cpp's priority order (first = tried first)
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
DRAFT_MODEL_TYPES = ("draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
SPEC_TYPES = ("none", *NGRAM_TYPES, *DRAFT_MODEL_TYPES)


# every parameter make_drafters takes: (default, lo, hi, llama.cpp flag); None bounds = not an integer
NGRAM_PARAMS: dict[str, tuple[object, int | None, int | None, str]] = {
    "ngram_simple_size_n": (12, 1, 1024, "--spec-ngram-simple-size-n"),
    "ngram_simple_size_m": (48, 1, 1024, "--spec-ngram-simple-size-m"),
    "ngram_simple_min_hits": (1, 1, 65535, "--spec-ngram-simple-min-hits"),  # unused by llama.cpp
    "ngram_map_k_size_n": (12, 1, 1024, "--spec-ngram-map-k-size-n"),
    "ngram_map_k_size_m": (48, 1, 1024, "--spec-ngram-map-k-size-m"),
    "ngram_map_k_min_hits": (1, 1, 65535, "--spec-ngram-map-k-min-hits"),  # unused by llama.cpp
    "ngram_map_k4v_size_n": (12, 1, 1024, "--spec-ngram-map-k4v-size-n"),
    "ngram_map_k4v_size_m": (48, 1, 1024, "--spec-ngram-map-k4v-size-m"),
    "ngram_map_k4v_min_hits": (1, 1, 65535, "--spec-ngram-map-k4v-min-hits"),
    "ngram_mod_n_match": (24, 1, 1024, "--spec-ngram-mod-n-match"),
    "ngram_mod_n_min": (48, 0, 1024, "--spec-ngram-mod-n-min"),
    "ngram_mod_n_max": (64, 0, 1024, "--spec-ngram-mod-n-max"),
    "ngram_mod_table": (None, None, None, "a shared NgramModTable"),
    "lookup_cache_static": (None, None, None, "--lookup-cache-static"),
    "lookup_cache_dynamic": (None, None, None, "--lookup-cache-dynamic"),
}


def _enabled_types(types: Sequence[str] | str) -> set[str]:
    """The types a list of --spec-type values enables. Each value is a comma-separated list; a value containing
    ``none`` contributes nothing (as llama.cpp, names before the ``none`` are checked, names after it are not);
    an unknown name is an error."""
    if isinstance(types, str):
        types = [types]
    enabled: set[str] = set()
    for value in types:
        if not isinstance(value, str):
            raise ValueError(f"speculative types must be strings, got {value!r}")
        names: list[str] = []
        for name in value.split(","):
            if name not in SPEC_TYPES:
                raise ValueError(f"unknown speculative type: {name!r} (known: {', '.join(SPEC_TYPES)})")
            if name == "none":
                names = []
                break
            names.append(name)
        enabled.update(names)
    return enabled


def make_drafters(types: Sequence[str] | str, **params: object) -> list[Drafter]:
    """The n-gram drafters for one sequence, in llama.cpp's priority order: ngram-simple, ngram-map-k,
    ngram-map-k4v, ngram-mod, ngram-cache.

    ``types`` are --spec-type values (each may be a comma-separated list; ``none`` in a value drops that value).
    Draft-model types (draft-simple, draft-eagle3, ...) are valid names but are not built here: they come after
    every n-gram type in the priority order, so the caller appends its draft-model drafter to this list.

    ``params`` (all checked against llama.cpp's ranges, enabled or not): ``ngram_simple_size_n`` /
    ``_size_m`` / ``_min_hits``, the same for ``ngram_map_k_`` and ``ngram_map_k4v_``, ``ngram_mod_n_match`` /
    ``_n_min`` / ``_n_max``, ``ngram_mod_table`` (an ``NgramModTable`` shared by several sequences),
    ``lookup_cache_static`` / ``lookup_cache_dynamic`` (a path or an ``NgramCacheTable``).
    """
    for key in params:
        if key not in NGRAM_PARAMS:
            raise ValueError(f"unknown speculative parameter {key!r} (known: {', '.join(NGRAM_PARAMS)})")
    p: dict[str, object] = {}
    for key, (default, lo, hi, flag) in NGRAM_PARAMS.items():
        value = params.get(key, default)
        if lo is not None and hi is not None:
            value = check_int_range(key, value, lo, hi, flag)
        p[key] = value
    table = p["ngram_mod_table"]
    if table is not None:
        if not isinstance(table, NgramModTable):
            raise ValueError(f"ngram_mod_table must be an NgramModTable, got {type(table).__name__}")
        if table.n != p["ngram_mod_n_match"]:
            raise ValueError(f"ngram_mod_table hashes {table.n}-grams, but ngram_mod_n_match is "
                             f"{p['ngram_mod_n_match']}")
    for key in ("lookup_cache_static", "lookup_cache_dynamic"):
        value = p[key]
        if value is not None and not isinstance(value, (NgramCacheTable, str, os.PathLike)):
            raise ValueError(f"{key} must be an NgramCacheTable or a file path, got {type(value).__name__}")

    enabled = _enabled_types(types)
    out: list[Drafter] = []
    for name in NGRAM_TYPES:
        if name not in enabled:
            continue
        if name == "ngram-simple":
            out.append(NgramSimple(p["ngram_simple_size_n"], p["ngram_simple_size_m"]))
        elif name in ("ngram-map-k", "ngram-map-k4v"):
            pre = name.replace("-", "_")
            out.append(NgramMapK(p[f"{pre}_size_n"], p[f"{pre}_size_m"], p[f"{pre}_min_hits"],
                                 values=name == "ngram-map-k4v"))
        elif name == "ngram-mod":
            out.append(NgramMod(p["ngram_mod_n_match"], p["ngram_mod_n_min"], p["ngram_mod_n_max"],
                                table=table))
        else:
            out.append(NgramCache(p["lookup_cache_static"], p["lookup_cache_dynamic"]))
    return out


def draft_round(drafters: Sequence[Drafter], history: Sequence[int], id_last: int,
                n_max: int) -> tuple[list[int], Drafter | None]:
    """One sequence's ``common_speculative_draft``: the drafters in order until one returns a non-empty draft,
    cut to ``n_max`` tokens when ``n_max > 0`` (0 or less = no cap). Returns (draft, winner) or ([], None).

    The caller verifies the draft, then calls ``winner.accept(n, False)`` and ``accept(n, True)`` on the others.
    """
    for drafter in drafters:
        result = drafter.draft(history, id_last)
        if result:
            if n_max > 0:
                result = result[:n_max]
            return result, drafter
    return [], None
