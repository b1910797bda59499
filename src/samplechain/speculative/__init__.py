"""Speculative decoding's drafters: llama.cpp's n-gram family (``ngram``) and a draft model (``draft_model``).

The verification loop and the adaptive draft length live in the runtime (``samplechain.runtime.speculation``);
``Speculation([...drafters])`` passed to ``Model.generate`` turns drafting on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samplechain.runtime.speculation import Drafter, Speculation
from samplechain.speculative.ngram import (
    NgramCache,
    NgramCacheTable,
    NgramMapK,
    NgramMod,
    NgramModTable,
    NgramSimple,
    draft_round,
    make_drafters,
)

if TYPE_CHECKING:  # loaded on first use (PEP 562): the draft model needs torch, the n-gram drafters do not
    from samplechain.speculative.draft_model import DraftModel as DraftModel
    from samplechain.speculative.draft_model import check_compatible as check_compatible

__all__ = ["DraftModel", "Drafter", "NgramCache", "NgramCacheTable", "NgramMapK", "NgramMod", "NgramModTable",
           "NgramSimple", "Speculation", "check_compatible", "draft_round", "make_drafters"]


def __getattr__(name: str) -> Any:
    if name in ("DraftModel", "check_compatible"):
        from samplechain.speculative import draft_model

        return getattr(draft_model, name)
    raise AttributeError(f"module 'samplechain.speculative' has no attribute {name!r}")
