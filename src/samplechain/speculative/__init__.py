"""Speculative decoding's drafters: llama.cpp's n-gram family (``ngram``) and a draft model (``draft_model``).

The verification loop and the adaptive draft length live in the runtime (``samplechain.runtime.speculation``);
``Speculation([...drafters])`` passed to ``Model.generate`` turns drafting on.
"""

from samplechain.runtime.speculation import Drafter, Speculation
from samplechain.speculative.draft_model import DraftModel, check_compatible
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

__all__ = ["DraftModel", "Drafter", "NgramCache", "NgramCacheTable", "NgramMapK", "NgramMod", "NgramModTable",
           "NgramSimple", "Speculation", "check_compatible", "draft_round", "make_drafters"]
