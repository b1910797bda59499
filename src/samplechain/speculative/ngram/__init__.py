"""llama.cpp's draftless n-gram drafters (common/speculative.cpp, common/ngram-*.cpp): ngram-simple, ngram-map-k,
ngram-map-k4v, ngram-mod and ngram-cache, with llama.cpp's priority order and the lookup-cache file format.

Every drafter serves one sequence and follows the small ``Drafter`` protocol the verification loop drives:
``begin(prompt)`` once after prompt processing, ``draft(history, id_last)`` each round (``history`` = the tokens
in the context, without ``id_last``), ``accept(n_accepted, is_other)`` after verification: ``is_other=False`` for
the drafter whose draft was verified, ``True`` for the others. ``draft_round`` is llama.cpp's
``common_speculative_draft`` for one sequence: the first non-empty draft in priority order wins.

llama.cpp quirks reproduced (each is what llama.cpp does, on purpose or not):

* ngram-simple and ngram-map-k ignore ``min_hits``; ngram-simple needs ``L > N + M + 1`` tokens, never
  matches position 0 and drops a match followed by fewer than N tokens.
* ngram-map-k/k4v: the hash table keeps the *first* position written to a slot (positions are indexed newest
  first, one batch per call), so once an n-gram is indexed the drafter keeps drafting from that occurrence, not
  from newer ones; a hash collision hides an n-gram from the table, and then only the linear scans can find it.
  The scans and the index skip the positions ``size_last_begin - N - M … size_last_begin`` (the first range ends
  below them, the second starts above them), so an n-gram starting there is never found.
* ngram-map-k: after ``accept(0)`` the key's ``n_accepted`` is 0 and it drafts nothing again (the draft length
  is ``min(M, n_accepted)`` and only a non-empty draft is verified).
* ngram-map-k4v drafts the tokens after the *found* occurrence, not the winning value's own tokens; value
  statistics are rescanned from ``stat_idx`` *inclusive*, so the occurrence at the previous match is counted once
  more on every call that finds it again; only 4 distinct values are kept, later ones are dropped uncounted.
* ngram-mod: one table for all sequences, no collision check (a lookup may return the follower of another
  n-gram); new positions are indexed only when more than 32 accumulated (``i_last + 32 < L``); the occupancy
  check (> 0.25 → clear) runs only in ``begin``; 5 consecutive rounds with acceptance < 0.25 clear the table for
  every sequence but reset ``i_last`` only of the sequence that saw them (the comment in llama.cpp says 0.5);
  ``begin`` does not reset the low-acceptance streak.
* ngram-cache: ``n_draft`` is 8; the context cache is updated with the new tokens as an isolated sequence, so
  n-grams spanning the old/new boundary are never added; ``begin`` is a no-op, so the context cache of a
  previous prompt stays and is only extended once a history is longer than every history seen before. Ties
  between followers are broken by the iteration order of libstdc++'s ``std::unordered_map`` (GCC's prime
  rehash policy), which is emulated exactly; saved files list records in that order too.

llama.cpp bugs fixed here:

* ngram-cache reads before the start of the token vector when history + draft hold fewer than 4 tokens
  (undefined behaviour); n-gram sizes longer than the available tokens are skipped instead.
* ngram-cache multiplies counts in ``int32`` (``count · 100 · static_count``, and the sums), which overflows for
  large static caches; Python integers are exact.
* llama.cpp aborts the process on a malformed cache file (``GGML_ASSERT``) or when a map drafter sees a history
  shorter than the one it last checked (``GGML_ABORT``); here both raise ``ValueError`` with the reason. Unlike
  llama.cpp, a trailing fragment of fewer than 16 bytes is an error too, not silently ignored.
* ngram-mod's occupancy counts non-empty table entries, as ``common_ngram_mod::add`` does (some llama.cpp
  revisions counted overwrites of occupied entries instead).
"""

from samplechain.runtime.speculation import Drafter
from samplechain.speculative.ngram.cache import NgramCache, NgramCacheTable
from samplechain.speculative.ngram.factory import (
    DRAFT_MODEL_TYPES,
    NGRAM_TYPES,
    SPEC_TYPES,
    draft_round,
    make_drafters,
)
from samplechain.speculative.ngram.map_k import NgramMapK
from samplechain.speculative.ngram.mod import NgramMod, NgramModTable
from samplechain.speculative.ngram.simple import NgramSimple

__all__ = [
    "DRAFT_MODEL_TYPES",
    "NGRAM_TYPES",
    "SPEC_TYPES",
    "Drafter",
    "NgramCache",
    "NgramCacheTable",
    "NgramMapK",
    "NgramMod",
    "NgramModTable",
    "NgramSimple",
    "draft_round",
    "make_drafters",
]
