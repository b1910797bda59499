"""The names of the ``samplers`` list: llama.cpp's canonical names, their aliases and one-letter codes
(llama.cpp's common/sampling.cpp: ``common_sampler_types_from_names``, ``common_sampler_type_to_chr``)."""

from __future__ import annotations

from collections.abc import Iterable

# canonical name -> (one-letter code, extra accepted names)
SAMPLER_TYPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "penalties": ("e", ()),
    "dry": ("d", ()),
    "top_n_sigma": ("s", ("top-n-sigma", "topnsigma")),
    "top_k": ("k", ("top-k", "topk")),
    "typ_p": ("y", ("typ-p", "typp", "typ")),
    "top_p": ("p", ("top-p", "topp", "nucleus")),
    "min_p": ("m", ("min-p", "minp")),
    "xtc": ("x", ()),
    "temperature": ("t", ("temp",)),
    "infill": ("i", ()),
    "adaptive_p": ("a", ("adaptive-p", "adaptivep")),
}
_BY_NAME = {alias: name for name, (_, aliases) in SAMPLER_TYPES.items() for alias in (name, *aliases)}
_BY_CHAR = {char: name for name, (char, _) in SAMPLER_TYPES.items()}
DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")


def parse_sampler_names(names: str | Iterable[str]) -> tuple[str, ...]:
    """Canonical sampler names from a ``;``-separated string or a list of names (case-insensitive)."""
    if isinstance(names, str):
        items = names.split(";") if names else []
    else:
        items = list(names)
    out = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"sampler names must be strings, got {item!r}")
        name = _BY_NAME.get(item.lower())
        if name is None:
            known = ", ".join(SAMPLER_TYPES)
            raise ValueError(f"unknown sampler name {item!r} (known: {known} and their aliases)")
        out.append(name)
    return tuple(out)


def parse_sampler_chars(chars: str) -> tuple[str, ...]:
    """Canonical sampler names from one-letter codes, e.g. ``"edskypmxt"``."""
    out = []
    for ch in chars:
        name = _BY_CHAR.get(ch)
        if name is None:
            raise ValueError(f"unknown sampler code {ch!r} (known: {''.join(_BY_CHAR)})")
        out.append(name)
    return tuple(out)


def sampler_chars(names: Iterable[str]) -> str:
    return "".join(SAMPLER_TYPES[n][0] for n in names)
