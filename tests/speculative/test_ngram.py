"""llama.cpp's n-gram drafters (common/speculative.cpp, common/ngram-*.cpp): exact drafts on hand-made histories.

The expected values were worked out by hand from llama.cpp's source and cross-checked against a transcription of
its C++ (``common/ngram-map.cpp``, ``ngram-mod``, ``ngram-cache.cpp``, built with libstdc++).
"""

import numpy as np
import pytest

from samplechain.speculative.ngram import (
    NGRAM_TYPES,
    Drafter,
    NgramCache,
    NgramCacheTable,
    NgramMapK,
    NgramMod,
    NgramModTable,
    NgramSimple,
    draft_round,
    make_drafters,
)

# ---------------------------------------------------------------------------------------------------------------
# ngram-simple


def test_ngram_simple_drafts_after_most_recent_occurrence():
    # key = [h[-1], id_last] = [1, 2]: at 0 (never matched) and at 4, the most recent -> the M=3 tokens after it
    h = [1, 2, 3, 4, 1, 2, 5, 6, 7, 9, 1]
    assert NgramSimple(2, 3).draft(h, 2) == [5, 6, 7]


def test_ngram_simple_never_matches_position_0():
    assert NgramSimple(2, 3).draft([1, 2, 3, 4, 5, 6, 7, 8, 1], 2) == []


def test_ngram_simple_needs_more_than_n_plus_m_plus_1_tokens():
    d = NgramSimple(2, 3)
    assert d.draft([9, 1, 2, 3, 4, 1], 2) == []  # L = 6 = N + M + 1, although [1, 2] occurs at 1
    assert d.draft([9, 1, 2, 3, 4, 5, 1], 2) == [3, 4, 5]


def test_ngram_simple_drops_a_match_followed_by_fewer_than_n_tokens():
    # the most recent [5, 5, 5] starts at L-4: only 1 token follows it (c = 1 < N = 3) -> no draft, even though
    # nothing else would have been drafted from an earlier occurrence either way
    assert NgramSimple(3, 5).draft([1, 2, 3, 4, 5, 6, 7, 5, 5, 5, 5], 5) == []


def test_ngram_simple_takes_numpy_histories():
    h = np.array([1, 2, 3, 4, 1, 2, 5, 6, 7, 9, 1], dtype=np.int32)
    assert NgramSimple(2, 3).draft(h, 2) == [5, 6, 7]


def test_ngram_simple_ignores_min_hits():
    h = [1, 2, 3, 4, 1, 2, 5, 6, 7, 9, 1]
    for hits in (1, 7):
        (d,) = make_drafters(["ngram-simple"], ngram_simple_size_n=2, ngram_simple_size_m=3, ngram_simple_min_hits=hits)
        assert d.draft(h, 2) == [5, 6, 7]


# ---------------------------------------------------------------------------------------------------------------
# ngram-map-k / ngram-map-k4v

MAP_H = [0, 1, 2, 10, 11, 12, 13, 5, 6, 7, 8, 1]  # key [1, 2] at position 1


def test_map_k_drafts_the_tokens_after_the_found_occurrence():
    d = NgramMapK(2, 3)
    d.begin(MAP_H)
    assert d.draft(MAP_H, 2) == [10, 11, 12]


def test_map_k_needs_2n_plus_m_tokens():
    d = NgramMapK(2, 3)
    d.begin(MAP_H[-6:])
    assert d.draft([1, 2, 10, 11, 12, 1], 2) == []  # 6 < 2N + M = 7


@pytest.mark.parametrize(("n_accepted", "is_other", "expected"), [
    (0, False, []),            # accept(0) caps the key at 0 tokens: it never drafts again
    (2, False, [10, 11]),      # the next draft from this key is min(M, n_accepted) tokens
    (0, True, [10, 11, 12]),   # another drafter's verification leaves the cap alone
])
def test_map_k_caps_the_next_draft_at_n_accepted(n_accepted, is_other, expected):
    d = NgramMapK(2, 3)
    d.begin(MAP_H)
    assert d.draft(MAP_H, 2) == [10, 11, 12]
    d.accept(n_accepted, is_other)
    assert d.draft([*MAP_H, 2, 9, 1], 2) == expected


def test_map_k_ignores_min_hits():
    d = NgramMapK(2, 3, min_hits=5)
    d.begin(MAP_H)
    assert d.draft(MAP_H, 2) == [10, 11, 12]


def test_map_k_keeps_drafting_from_the_first_indexed_occurrence():
    # [1, 2] is indexed at position 1 by the first call; its newer occurrence at 8 (followed by 20, 21) cannot
    # take the hash slot (first writer wins), so map-k drafts 10, 11 where ngram-simple drafts 20, 21
    prompt = [0, 1, 2, 10, 11, 0, 0]
    h = [*prompt, 99, 1, 2, 20, 21, 5, 5, 1]
    d = NgramMapK(2, 2)
    d.begin(prompt)
    assert d.draft(prompt, 99) == []
    assert d.draft(h, 2) == [10, 11]
    assert NgramSimple(2, 2).draft(h, 2) == [20, 21]


def test_map_k_never_finds_positions_just_before_the_prompt_end():
    # positions size_last_begin-N-M .. size_last_begin (here 5..10) are neither scanned nor indexed
    prompt = [0, 0, 0, 0, 0, 0, 0, 1, 2, 3]
    h = [*prompt, 4, 5, 6, 7, 8, 1]
    d = NgramMapK(2, 2)
    d.begin(prompt)
    assert d.draft(h, 2) == []
    assert NgramSimple(2, 2).draft(h, 2) == [3, 4]


def test_map_begin_with_a_shrunk_prompt_drops_keys_past_the_cleanup_point():
    p1 = [5, 5, 5, 5, 5, 5, 7, 1, 2, 5, 5, 5]

    def capped():
        d = NgramMapK(1, 2)
        d.begin(p1)
        assert d.draft(p1, 7) == [1, 2]
        d.accept(0)
        assert d.draft([*p1, 7], 7) == []  # key [7] (at 6) is capped at 0 tokens
        return d

    d = capped()
    assert d.draft([*p1, 7, 5, 7, 1, 2, 5, 5, 5], 7) == []  # still capped
    d = capped()
    d.begin(p1[:9])  # shorter than the 13 tokens checked: cleanup from 9 - N - M = 6, so key [7] at 6 goes
    assert d.draft([*p1[:9], 5, 5, 7, 1, 2, 5, 5, 5, 5], 7) == [1, 2]


def test_map_raises_when_the_history_shrinks_without_begin():
    d = NgramMapK(2, 3)
    d.begin(MAP_H)
    with pytest.raises(ValueError, match="call begin"):
        d.draft(MAP_H[:-1], 2)


def test_k4v_needs_min_hits():
    prompt = [0, 7, 1, 2, 9, 9]
    d = NgramMapK(1, 2, min_hits=2, values=True)
    d.begin(prompt)
    assert d.draft(prompt, 7) == []  # first hit of key [7]
    assert d.draft([*prompt, 7], 7) == [1, 2]


@pytest.mark.parametrize(("history", "expected"), [
    ([0, 7, 1, 7, 2, 7, 1, 5, 5, 5], [1]),     # values 1 x2, 2 x1: max 2 >= 2*1
    ([0, 7, 1, 7, 2, 7, 1, 7, 2, 5, 5, 5], []),  # 2 x2, 1 x2: max 2 < 2*2
])
def test_k4v_needs_a_dominant_value(history, expected):
    d = NgramMapK(1, 1, values=True)
    d.begin(history)
    assert d.draft(history, 7) == expected


def test_k4v_keeps_four_values():
    # after 7: 1, 2, 3, 4 fill the 4 slots; 5 (seen 8 times) is dropped, so 1:1:1:1 -> no draft
    h = [0, 7, 1, 7, 2, 7, 3, 7, 4, *[7, 5] * 8, 9, 9, 9]
    d = NgramMapK(1, 1, values=True)
    d.begin(h)
    assert d.draft(h, 7) == []
    # with only three other values 5 gets the fourth slot: 8 >= 2*3 -> the draft
    h = [0, 7, 1, 7, 2, 7, 3, *[7, 5] * 8, 9, 9, 9]
    d = NgramMapK(1, 1, values=True)
    d.begin(h)
    assert d.draft(h, 7) == [5]


def test_k4v_drafts_after_the_found_occurrence_and_recounts_it():
    h = [0, 7, 1, 7, 1, 7, 1, 7, 2, 9, 9, 9]
    d = NgramMapK(1, 1, values=True)
    d.begin(h)
    # values 1 x3, 2 x1: value 1 wins, but the draft is the token after the found occurrence (at 7): 2
    assert d.draft(h, 7) == [2]
    # the hash finds position 7 again; counting restarts at stat_idx = 7 inclusive, so 2 is counted again:
    # 3 < 2*2 -> no draft
    assert d.draft([*h, 7], 7) == []


# ---------------------------------------------------------------------------------------------------------------
# ngram-mod

MOD_PROMPT = [1, 2, 3, 4, 5, 6]  # 2-grams (1,2)->3 ... (4,5)->6


@pytest.mark.parametrize(("n_min", "n_max", "expected"), [
    (0, 5, [3, 4, 5, 6]),  # rolling lookups until (5, 6) misses
    (0, 3, [3, 4, 5]),     # n_max
    (4, 8, [3, 4, 5, 6]),  # the miss after 4 tokens is not before n_min
    (5, 8, []),            # a miss before n_min tokens drops the draft
    (0, 0, []),
])
def test_ngram_mod_rolls_its_lookup_within_n_min_and_n_max(n_min, n_max, expected):
    d = NgramMod(2, n_min, n_max)
    d.begin(MOD_PROMPT)
    assert d.draft([9, 1], 2) == expected


def test_ngram_mod_indexes_new_tokens_once_more_than_32_accumulated():
    prompt = list(range(100, 110))  # begin indexes positions 0..7; i_last = 8
    d = NgramMod(2, 0, 8)
    d.begin(prompt)
    assert d.draft([*prompt, 7, 8, 9, *[0] * 26, 7], 8) == []  # L = 40: 8 + 32 < 40 is false, (7, 8) unknown
    # L = 41: positions 8..38 are added in order, the last (0, 0) -> 7 overwriting (0, 0) -> 0
    assert d.draft([*prompt, 7, 8, 9, *[0] * 27, 7], 8) == [9, 0, 0, 7]


def test_ngram_mod_has_no_collision_check():
    table = NgramModTable(1, 16)  # 1-grams: entry = token % 16
    d = NgramMod(1, 0, 8, table)
    d.begin([1, 5, 9])
    assert d.draft([3], 17) == [5, 9]  # 17 shares 1's entry


def test_ngram_mod_table_is_shared_by_sequences():
    table = NgramModTable(2)
    a, b = NgramMod(2, 0, 5, table), NgramMod(2, 0, 5, table)
    a.begin(MOD_PROMPT)
    b.begin([8, 8])
    assert b.draft([9, 1], 2) == [3, 4, 5, 6]


def test_ngram_mod_clears_a_table_over_a_quarter_full_at_begin():
    d = NgramMod(1, 0, 8, NgramModTable(1, 16))
    d.begin([0, 1, 2, 3, 4])  # 4 of 16 entries: 0.25 is not above 0.25
    assert d.table.used == 4
    d = NgramMod(1, 0, 8, NgramModTable(1, 16))
    d.begin([0, 1, 2, 3, 4, 5])  # 5 of 16
    assert d.table.used == 0


def test_ngram_mod_clears_after_5_low_acceptance_rounds():
    def rounds(accepts, is_other=False):
        table = NgramModTable(2)
        d, other = NgramMod(2, 0, 4, table), NgramMod(2, 0, 4, table)
        d.begin(MOD_PROMPT)
        for n in accepts:
            assert d.draft([9, 1], 2) == [3, 4, 5, 6]
            d.accept(n, is_other)
        return d, other, table

    d, other, table = rounds([0, 0, 0, 0, 0])  # 0/4 < 0.25 five times in a row
    assert table.used == 0
    assert d.draft([9, 1], 2) == [] and other.draft([9, 1], 2) == []  # cleared for every sequence
    d, _, table = rounds([0, 0, 0, 0, 1, 0, 0, 0, 0])  # 1/4 is not below 0.25: the streak restarts
    assert table.used == 4
    d, _, table = rounds([0, 0, 0, 0, 0], is_other=True)  # only the drafter's own verifications count
    assert table.used == 4


# ---------------------------------------------------------------------------------------------------------------
# ngram-cache


def counts(entries):
    """A table from {n-gram: {token: count}} (tokens inserted in the order given)."""
    table = NgramCacheTable()
    for ngram, hist in entries.items():
        for token, c in hist.items():
            for _ in range(c):
                table.update([*ngram, token], len(ngram), len(ngram), 1)
    return table


def test_ngram_cache_context_level_drafts_up_to_8_tokens():
    # the 3-gram (10, 11, 12) -> 13 (one sample is enough at n = 3), then the 4-grams cycle
    assert NgramCache().draft([10, 11, 12, 13, 10, 11], 12) == [13, 10, 11, 12, 13, 10, 11, 12]


def test_ngram_cache_breaks_ties_in_libstdcxx_order():
    # third token: (1, 9, 1) -> {9: 1, 8: 1}, 50 % passes at n = 3; std::unordered_map iterates 8 before 9
    # (8 went to an empty bucket, so to the front of the list)
    assert NgramCache().draft([1, 9, 1, 9, 1, 8, 2], 1) == [9, 1, 8, 2, 1, 9, 1, 8]


@pytest.mark.parametrize(("history", "id_last"), [
    ([3, 4, 5], 3),                    # (3) -> {4: 1}: one sample, n = 1 needs 2
    ([3, 4, 3, 4, 3, 5, 3, 5, 9], 3),  # (3) -> {4: 2, 5: 2}: 50 % < 66 % at n = 1
    ([], 5),                           # fewer than 2 tokens
])
def test_ngram_cache_context_thresholds(history, id_last):
    assert NgramCache().draft(history, id_last) == []


@pytest.mark.parametrize(("dynamic", "expected"), [
    ({(52,): {60: 3}}, []),                            # strict n = 1: 4 samples
    ({(52,): {60: 4}}, [60]),
    ({(52,): {60: 4}, (50, 51, 52): {61: 2}}, [61]),   # longer n-grams first
])
def test_ngram_cache_dynamic_level_is_strict(dynamic, expected):
    assert NgramCache(dynamic=counts(dynamic)).draft([50, 51], 52) == expected


def test_ngram_cache_static_level():
    # 2 samples and 50 %: a tie, broken by the table's order (71 before 70 as inserted here)
    assert NgramCache(static=counts({(51, 52): {70: 1, 71: 1}})).draft([50, 51], 52) == [71]
    assert NgramCache(static=counts({(51, 52): {70: 1}})).draft([50, 51], 52) == []  # 1 sample


def test_ngram_cache_static_counts_weigh_and_veto_context_picks():
    h = [1, 5, 1, 5, 1, 6, 2]  # (1) -> {5: 2, 6: 1}
    assert NgramCache().draft(h, 1) == [5, 1, 6, 2, 1, 5, 1, 6]
    # static (2, 1) -> {6: 1}: 6 scores 1*100 > 5's 2, but holds 1 of 3 samples < 66 % -> no context draft, and
    # the static level alone has 1 sample
    assert NgramCache(static=counts({(2, 1): {6: 1}})).draft(h, 1) == []
    h = [1, 5, 1, 5, 1, 6, 1, 6, 2]  # (1) -> {5: 2, 6: 2}: undecided
    assert NgramCache().draft(h, 1) == []
    assert NgramCache(static=counts({(2, 1): {6: 5}})).draft(h, 1) == [6, 2, 1, 6, 2, 1, 6, 2]


def test_ngram_cache_drops_n_grams_across_update_boundaries():
    d = NgramCache()
    assert d.draft([1, 2, 3], 4) == []
    assert d.draft([1, 2, 3, 4, 5, 6], 7) == []  # adds [5, 6, 7] alone: (2, 3, 4) -> 5 etc. are never counted
    h = [1, 2, 3, 4, 5, 6, 7, 8, 2, 3]
    assert d.draft(h, 4) == []
    assert NgramCache().draft(h, 4) == [5, 6, 7, 8, 2, 3, 4, 5]  # the same history counted in one go


def test_ngram_cache_table_iterates_as_libstdcxx():
    def followers(tokens):
        table = NgramCacheTable()
        table.update([x for t in tokens for x in (100, t)], 1, 1)
        return list(table.histogram([100]))

    assert followers([9, 8]) == [8, 9]
    assert followers([1, 14, 27]) == [27, 14, 1]  # one bucket of 13: each goes to the front of its run
    assert followers([-1, 12, 25, 3]) == [3, 25, 12, -1]
    assert followers(range(14)) == [13, *range(13)]  # the 14th key rehashes into 29 buckets


def in_order(table):
    return [(ngram, list(hist.items())) for ngram, hist in table.items()]


def test_ngram_cache_file_round_trip(tmp_path):
    table = NgramCacheTable.from_tokens([[1, 2, 1, 2, 3]])  # llama-lookup-create: 2-grams
    assert in_order(table) == [((2, 1, -1, -1), [(2, 1)]), ((1, 2, -1, -1), [(3, 1), (1, 1)])]
    path = tmp_path / "static.bin"
    table.save(path)  # records in that order: n-gram, follower count, (token, count) pairs
    assert np.fromfile(path, dtype=np.int32).tolist() == [2, 1, -1, -1, 1, 2, 1,
                                                          1, 2, -1, -1, 2, 3, 1, 1, 1]
    # loading inserts in file order, which libstdc++ iterates differently (llama.cpp's load + save gives the
    # same bytes as ours)
    loaded = NgramCacheTable.load(path)
    assert in_order(loaded) == [((1, 2, -1, -1), [(1, 1), (3, 1)]), ((2, 1, -1, -1), [(2, 1)])]
    loaded.save(tmp_path / "again.bin")
    assert np.fromfile(tmp_path / "again.bin", dtype=np.int32).tolist() == [1, 2, -1, -1, 2, 1, 1, 3, 1,
                                                                            2, 1, -1, -1, 1, 2, 1]
    assert NgramCache.load(tmp_path / "again.bin").histogram([1, 2]) == {3: 1, 1: 1}


def test_ngram_cache_loading_keeps_file_order(tmp_path):
    # a histogram loaded from a file is rebuilt in the file's order, so ties may break differently than in the
    # table that was saved, as in llama.cpp
    table = counts({(51, 52): {70: 1, 71: 1}})
    assert list(table.histogram([51, 52])) == [71, 70]
    table.save(tmp_path / "s.bin")
    loaded = NgramCacheTable.load(tmp_path / "s.bin")
    assert list(loaded.histogram([51, 52])) == [70, 71]
    assert NgramCache(static=tmp_path / "s.bin").draft([50, 51], 52) == [70]


def test_ngram_cache_save_merges_the_context_into_the_dynamic_cache(tmp_path):
    d = NgramCache(dynamic=counts({(7,): {8: 2}}))
    d.draft([7, 8], 9)
    d.save(tmp_path / "dyn.bin")
    merged = NgramCacheTable.load(tmp_path / "dyn.bin")
    assert merged.histogram([7]) == {8: 3}
    assert merged.histogram([8, 9]) == {}
    assert merged.histogram([7, 8]) == {9: 1}
    assert d.dynamic.histogram([7]) == {8: 2}  # the drafter's own caches are unchanged


@pytest.mark.parametrize(("words", "extra", "message"), [
    ([1, 2, -1, -1, 1, 5, 1], b"\x00\x00", "whole number of int32"),
    ([1, 2, -1, -1, 2, 5, 1], b"", "truncated"),
    ([1, 2, -1, -1], b"", "truncated"),
    ([1, 2, -1, -1, 1, 5, 1, 7, 7], b"", "truncated"),  # a trailing fragment (llama.cpp ignores < 16 bytes)
    ([1, 2, -1, -1, 0], b"", "followers; must be > 0"),
    ([1, 2, -1, -1, 1, 5, 0], b"", "counts must be > 0"),
])
def test_ngram_cache_malformed_files(tmp_path, words, extra, message):
    path = tmp_path / "bad.bin"
    path.write_bytes(np.array(words, dtype=np.int32).tobytes() + extra)
    with pytest.raises(ValueError, match=message):
        NgramCacheTable.load(path)


def test_ngram_cache_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        NgramCache(static=tmp_path / "missing.bin")


def test_ngram_cache_duplicates_keep_the_first(tmp_path):
    path = tmp_path / "dup.bin"
    path.write_bytes(np.array([1, 2, -1, -1, 2, 5, 1, 5, 9,   1, 2, -1, -1, 1, 6, 4], dtype=np.int32).tobytes())
    assert NgramCacheTable.load(path).histogram([1, 2]) == {5: 1}


# ---------------------------------------------------------------------------------------------------------------
# make_drafters and draft_round


def test_make_drafters_follows_llama_cpp_priority():
    drafters = make_drafters(["ngram-cache,ngram-simple", "ngram-mod", "ngram-map-k4v,ngram-map-k", "ngram-mod"])
    assert [d.name for d in drafters] == list(NGRAM_TYPES)
    assert [d.n_max for d in drafters] == [48, 48, 48, 64, 8]
    assert all(isinstance(d, Drafter) for d in drafters)


@pytest.mark.parametrize(("types", "names"), [
    (["none"], []),
    (["none,ngram-mod"], []),                      # a value with none adds nothing
    (["ngram-mod,none"], []),
    (["ngram-simple", "none,ngram-mod"], ["ngram-simple"]),  # ... but keeps earlier values' types
    ("ngram-mod", ["ngram-mod"]),
    (["draft-simple,ngram-mod,draft-mtp"], ["ngram-mod"]),   # draft-model types are the caller's to append
])
def test_make_drafters_none_and_model_types(types, names):
    assert [d.name for d in make_drafters(types)] == names


@pytest.mark.parametrize("types", [["ngram-smple"], ["ngram-mod,bogus"], ["bogus,none"], [""]])
def test_make_drafters_rejects_unknown_types(types):
    bad = types[0].split(",")[-1] if "bogus" not in types[0] else "bogus"
    with pytest.raises(ValueError, match=f"unknown speculative type: '{bad}'"):
        make_drafters(types)


@pytest.mark.parametrize(("param", "value", "message"), [
    ("ngram_mod_n_match", 0, "ngram_mod_n_match must be in 1..1024"),
    ("ngram_mod_n_match", 1025, "ngram_mod_n_match must be in 1..1024"),
    ("ngram_mod_n_min", -1, "ngram_mod_n_min must be in 0..1024"),
    ("ngram_mod_n_max", 1025, "ngram_mod_n_max must be in 0..1024"),
    ("ngram_simple_size_n", 0, "ngram_simple_size_n must be in 1..1024"),
    ("ngram_map_k_size_m", 2000, "ngram_map_k_size_m must be in 1..1024"),
    ("ngram_map_k4v_min_hits", 0, "ngram_map_k4v_min_hits must be in 1..65535"),
    ("ngram_simple_size_m", True, "ngram_simple_size_m must be an integer"),
    ("ngram_size_n", 3, "unknown speculative parameter 'ngram_size_n'"),
    ("ngram_mod_table", NgramModTable(12, 16), "hashes 12-grams, but ngram_mod_n_match is 24"),
    ("lookup_cache_static", 3, "lookup_cache_static must be an NgramCacheTable or a file path"),
])
def test_make_drafters_checks_parameters(param, value, message):
    # checked whether or not the type is enabled, as llama.cpp's argument parser does
    with pytest.raises(ValueError, match=message):
        make_drafters(["none"], **{param: value})


def test_make_drafters_passes_parameters():
    table = NgramModTable(16, 1024)
    simple, k4v, mod1 = make_drafters(["ngram-simple,ngram-map-k4v,ngram-mod"], ngram_simple_size_n=3,
                                      ngram_simple_size_m=5, ngram_map_k4v_min_hits=4, ngram_mod_n_match=16,
                                      ngram_mod_n_min=2, ngram_mod_n_max=9, ngram_mod_table=table)
    (mod2,) = make_drafters(["ngram-mod"], ngram_mod_n_match=16, ngram_mod_table=table)
    assert (simple.size_n, simple.n_max, k4v.min_hits, k4v.values) == (3, 5, 4, True)
    assert (mod1.n_min, mod1.n_max, mod1.table, mod2.table) == (2, 9, table, table)


def test_constructors_check_parameters():
    with pytest.raises(ValueError, match=r"size_n must be in 1\.\.1024"):
        NgramSimple(0)
    with pytest.raises(ValueError, match=r"min_hits must be in 1\.\.65535"):
        NgramMapK(min_hits=0)
    with pytest.raises(ValueError, match="shared table hashes 24-grams but n_match is 12"):
        NgramMod(12, table=NgramModTable(24, 16))


class Fixed:
    """A drafter returning a fixed draft and recording its calls."""

    def __init__(self, name, out):
        self.name, self.n_max, self.out, self.calls = name, len(out), out, 0

    def begin(self, prompt):
        pass

    def draft(self, history, id_last):
        self.calls += 1
        return list(self.out)

    def accept(self, n_accepted, is_other=False):
        pass


@pytest.mark.parametrize(("n_max", "expected"), [(2, [1, 2]), (5, [1, 2, 3]), (0, [1, 2, 3]), (-1, [1, 2, 3])])
def test_draft_round_first_non_empty_draft_wins(n_max, expected):
    a, b, c = Fixed("a", []), Fixed("b", [1, 2, 3]), Fixed("c", [9])
    draft, winner = draft_round([a, b, c], [5, 6], 7, n_max)
    assert (draft, winner) == (expected, b)
    assert (a.calls, b.calls, c.calls) == (1, 1, 0)


def test_draft_round_without_a_draft():
    assert draft_round([Fixed("a", []), Fixed("b", [])], [5], 7, 4) == ([], None)
    # real drafters: ngram-simple finds nothing, ngram-mod drafts
    simple, mod = make_drafters(["ngram-simple,ngram-mod"], ngram_mod_n_match=2, ngram_mod_n_min=0)
    mod.begin(MOD_PROMPT)
    assert draft_round([simple, mod], [9, 1], 2, 3) == ([3, 4, 5], mod)


# ---------------------------------------------------------------------------------------------------------------
# a copy task on SmolLM2's tokenizer

PARAGRAPH = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a small brass lantern "
    "and a notebook full of weather observations. He recorded the wind, the colour of the sea and the number "
    "of ships that passed the headland, because his grandfather had done the same for forty years and the "
    "harbour master still asked for the figures each spring."
)


def copy_rounds(drafter, tokens, start):
    """Generate ``tokens[start:]`` with an oracle target: per round, (position of id_last, draft length, accepted)."""
    drafter.begin(tokens[:start])
    pos, rounds, steps = start, [], 0
    while pos < len(tokens) - 1:
        steps += 1
        draft = drafter.draft(tokens[:pos], tokens[pos])
        n = 0
        while n < len(draft) and pos + 1 + n < len(tokens) and draft[n] == tokens[pos + 1 + n]:
            n += 1
        if draft:
            drafter.accept(n)
            rounds.append((pos, len(draft), n))
        pos += n + 1
    return rounds, steps


@pytest.fixture(scope="module")
def copy_tokens():
    from samplechain import Vocab
    from samplechain.runtime import model_path

    vocab = Vocab.from_gguf(model_path("smollm2"))
    para = vocab.tokenize(PARAGRAPH)
    tokens = vocab.tokenize(PARAGRAPH + "\n\n" + PARAGRAPH)
    assert (len(para), len(tokens), tokens[70:]) == (68, 138, para)  # "\n\n" is 2 tokens; the copies tokenize alike
    return tokens


@pytest.mark.parametrize(("make", "expected_rounds", "expected_steps"), [
    # once the 12-token key lies inside the second copy, 48 correct tokens at once; the second draft runs past
    # the end of the text (6 of 48 accepted)
    (NgramSimple, [(82, 48, 48), (131, 48, 6)], 14),
    # one draft: the first copy's positions 22..70 fall in the never-indexed stretch before the prompt end
    (NgramMapK, [(82, 48, 48)], 19),
    (lambda: NgramMapK(values=True), [(82, 48, 48)], 19),
    (NgramMod, [(93, 64, 44)], 24),  # a 24-token key, then 64-token drafts
    (NgramCache, [(72, 8, 8), (81, 8, 8), (90, 8, 8), (99, 8, 8), (108, 8, 8), (117, 8, 8), (126, 8, 8),
                  (135, 5, 2)], 10),
])
def test_copy_task_drafts_the_second_copy(copy_tokens, make, expected_rounds, expected_steps):
    rounds, steps = copy_rounds(make(), copy_tokens, 70)  # prompt: the paragraph and "\n\n"
    assert rounds == expected_rounds
    assert steps == expected_steps  # target steps for tokens 71..137 (67 without drafting)


def test_copy_task_drafts_are_the_second_copy(copy_tokens):
    d = NgramSimple()
    assert d.draft(copy_tokens[:82], copy_tokens[82]) == copy_tokens[83:131]
