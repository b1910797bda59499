"""The prefix-tree walk behind token masks (mask_walk.py over tokens.TokenTrie): the tree's layout against a brute-force
one, and masks equal to one transition per token (llama.cpp's llama_grammar_accept_impl, token by token) whichever
way the walk goes: NumPy groups, node by node, skipping over loops."""

import itertools
import json

import numpy as np
import pytest
from tests.grammar.conftest import packaged_vocab
from tests.grammar.test_masks import GRAMMARS

from samplechain import Vocab
from samplechain.grammar import Grammar, MaskEngine, TokenTable, json_schema_to_gbnf, mask_groups, mask_walk, masks
from samplechain.grammar.tokens import TokenTrie

TOY_GRAMMARS = [
    *GRAMMARS,
    "root ::= .* [\\u20ac]",
    'root ::= ( [^\\u00e9"]* "\\"" )+',
    'root ::= ( [a-m] | [^a-m"] )* "\\""',  # two tops keep the loop, a third leaves it
    'root ::= [a-z]* [a-c] "!"',  # a code point both a looping top and another one match leaves the loop
]
BIG = 1 << 40
# how the walk may go: NumPy only; node by node only; skipping every loop it can (with either; suffixes deepened
# until they do not pop, so that loops are found); suffixes of one entry (never deepened); every child tested
# (literals' children not found by bisection); nothing walked with the grammar; the defaults
WALKS = {
    "numpy": {"FEW": 0, "LOOP_MIN": BIG},
    "few": {"FEW": BIG, "LOOP_MIN": BIG},
    "skip-numpy": {"FEW": 0, "LOOP_MIN": 0, "LOOP_LEAVERS": 0, "POP_MAX": 0},
    "skip-few": {"FEW": BIG, "LOOP_MIN": 0, "LOOP_LEAVERS": 0, "POP_MAX": 0},
    "shallow": {"POP_MAX": BIG},
    "no-points": {"POINTS_MAX": -1},
    "unprepared": {"LOOPS_MAX": 0},
    "default": {},
}
MODULES = {"LOOP_LEAVERS": mask_groups, "POINTS_MAX": mask_groups, "LOOPS_MAX": masks}
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
    "n": {"type": "integer", "minimum": 0}, "ok": {"type": "boolean"}}, "required": ["name", "tags", "n"]}
DOC = json.dumps({"name": "Zoë \"Q\" \\ 😀 — 東京", "tags": ["a\tb", "€uro", ""], "n": 1234, "ok": True}, indent=1,
                 ensure_ascii=False)


def walk(monkeypatch, how):
    for name, value in WALKS[how].items():
        monkeypatch.setattr(MODULES.get(name, mask_walk), name, value)


def expected(engine, state, tokens, vocab):
    """One transition per token: the reference the masks must equal."""
    return np.array([(() in state.stacks) if vocab.is_eog(t) else engine.transition(state, t) is not None
                     for t in tokens], dtype=bool)


def check_layout(table: TokenTable, nodes: np.ndarray) -> None:
    """Each node's ranges, enders and children against the sorted token texts."""
    tr = table.trie
    texts = [tuple(table.flat[table.offsets[i] : table.offsets[i] + table.lens[i]].tolist()) for i in tr.sorted_ids]
    partial = (table.partial_n[tr.sorted_ids] > 0).tolist()
    assert all(a <= b for a, b in itertools.pairwise(texts))
    for node in nodes.tolist():
        d, lo, hi = int(tr.depth[node]), int(tr.lo[node]), int(tr.hi[node])
        prefix = texts[lo][: d + 1]
        assert len(prefix) == d + 1 and prefix[-1] == tr.cp[node] == tr.ucp[tr.cpi[node]]
        assert all(t[: d + 1] == prefix for t in texts[lo:hi])
        assert (lo == 0 or texts[lo - 1][: d + 1] != prefix) and (hi == tr.m or texts[hi][: d + 1] != prefix)
        ending = [q for q in range(lo, hi) if len(texts[q]) == d + 1]
        assert ending == list(range(lo, int(tr.pend[node])))
        assert [q for q in ending if not partial[q]] == list(range(lo, int(tr.end[node])))
        kids = range(int(tr.clo[node]), int(tr.chi[node]))
        assert [texts[tr.lo[k]][: d + 2] for k in kids] == sorted({t[: d + 2] for t in texts[tr.pend[node] : hi]})
        assert all(tr.depth[k] == d + 1 for k in kids)
    assert (np.diff(tr.root_cps) > 0).all()
    assert np.array_equal(np.sort(tr.by_cp), np.arange(len(tr.cp))) and (np.diff(tr.cp[tr.by_cp]) >= 0).all()
    assert np.array_equal(tr.pos_of[tr.sorted_ids], np.arange(tr.m))


def node_of(trie: TokenTrie, text: str) -> int:
    """The tree node of a prefix, found by walking down from the root."""
    first, last = 0, trie.dstart[1]
    for ch in text:
        node = next(n for n in range(first, last) if trie.cp[n] == ord(ch))
        first, last = trie.clo[node], trie.chi[node]
    return node


def test_trie_layout_of_the_toy_vocabulary(toy_vocab):
    table = TokenTable.of(toy_vocab)
    tr = table.trie
    check_layout(table, np.arange(len(tr.cp)))
    by_pos = [toy_vocab.token_bytes(int(t)) for t in tr.sorted_ids]
    ab = node_of(tr, "ab")
    assert by_pos[tr.lo[ab] : tr.hi[ab]] == [b"ab", b"abc"] and tr.end[ab] == tr.lo[ab] + 1
    assert by_pos[tr.lo[node_of(tr, "a")] : tr.hi[node_of(tr, "a")]] == [b"a", b"a\x00b", b"ab", b"abc"]
    caf = node_of(tr, "caf")  # b"caf\xc3" ends inside a character: no token ends at "caf" whole
    assert (tr.end[caf], tr.pend[caf], tr.hi[caf]) == (tr.lo[caf], tr.lo[caf] + 1, tr.lo[caf] + 1)
    # control, end-of-generation, empty, NUL-led and invalid tokens are not in the tree, nor those without a whole
    # character (b"\xc3", b"\xe2\x82", and b"\xff", a 4-byte lead to llama.cpp: the mask checks them on their own)
    outside = [t for t in range(toy_vocab.n_tokens) if tr.pos_of[t] == tr.m]
    assert outside == [0, 1, 30, 31, 33, 34, 40, 41, 42, 45, 46, 47] and table.partial_only.tolist() == [30, 33, 41]


def test_trie_layout_of_a_real_vocabulary():
    table = TokenTable.of(packaged_vocab("smollm2"))
    tr = table.trie
    assert tr.m == 48_860 and len(tr.cp) == 99_842 and len(tr.root_cps) == 452
    check_layout(table, np.random.default_rng(5).choice(len(tr.cp), 1500, replace=False))


def test_trie_beyond_unicode():
    """A 4-byte lead past U+10FFFF decodes (llama.cpp does not check) to a code point no str holds: sorted as lists."""
    vocab = Vocab([b"<s>", b"</s>", b"\xf7\xbf\xbf\xbf", b"a", b"a\xf7\xbf\xbf\xbf", b"b", b"\xf7\xbf\xbf\xbfa"],
                  eog=[1], special=[0, 1], bos=0, eos=1)
    table = TokenTable.of(vocab)
    assert table.lut_size > 0x110000
    check_layout(table, np.arange(len(table.trie.cp)))
    g = Grammar.from_gbnf("root ::= .+")
    engine = MaskEngine(g, table)
    assert np.flatnonzero(engine.mask(g.initial)).tolist() == [2, 3, 4, 5, 6]


@pytest.mark.parametrize("how", list(WALKS))
@pytest.mark.parametrize("text", TOY_GRAMMARS, ids=range(len(TOY_GRAMMARS)))
def test_every_walk_equals_transitions_on_a_toy_vocabulary(text, how, toy_vocab, monkeypatch):
    walk(monkeypatch, how)
    skips = []
    monkeypatch.setattr(mask_walk.MaskWalker, "_skip", lambda self, *a, _f=mask_walk.MaskWalker._skip: skips.append(1)
                        or _f(self, *a))
    g = Grammar.from_gbnf(text, vocab=toy_vocab)
    rng = np.random.default_rng(7)
    tokens = list(range(toy_vocab.n_tokens))
    for _ in range(3):
        engine = MaskEngine(g, TokenTable.of(toy_vocab))
        state = g.initial
        for _ in range(20):
            mask = engine.mask(state)
            assert np.array_equal(mask, expected(engine, state, tokens, toy_vocab))
            choices = [t for t in np.flatnonzero(mask).tolist() if not toy_vocab.is_eog(t)]
            if not choices:
                break
            state = engine.transition(state, int(rng.choice(choices)))
    if how.startswith("skip") and text in TOY_GRAMMARS[4:]:
        assert skips  # the loop path did run


def masks_along(vocab, gbnf, text):
    g = Grammar.from_gbnf(gbnf)
    engine = MaskEngine(g, TokenTable.of(vocab))
    state, out, states = g.initial, [], []
    for tok in vocab.tokenize(text):
        out.append(engine.mask(state))
        states.append(state)
        assert out[-1][tok]
        state = engine.transition(state, tok)
    return out, states, engine


def hermes_call():
    from samplechain.chat.formats.base import ToolSetup
    from samplechain.chat.formats.hermes import Hermes2Pro
    from samplechain.chat.tools import parse_tool_request

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "location": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["location"]}}}]
    params = Hermes2Pro().params(ToolSetup(parse_tool_request({"tools": tools}), required=False, parallel=False))
    call = {"name": "get_weather", "arguments": {"location": 'Zürich "CH"', "unit": "c"}}
    return params.grammar, f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"


def test_every_walk_gives_the_same_masks_on_a_real_vocabulary(monkeypatch):
    vocab = packaged_vocab("smollm2")
    cases = [(json_schema_to_gbnf(SCHEMA), DOC), hermes_call()]
    reference = [masks_along(vocab, gbnf, text)[0] for gbnf, text in cases]
    for how in ("numpy", "skip-numpy", "shallow", "no-points", "unprepared"):
        with monkeypatch.context() as m:
            walk(m, how)
            for (gbnf, text), want in zip(cases, reference, strict=True):
                got = masks_along(vocab, gbnf, text)[0]
                assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)), how


@pytest.mark.parametrize("case", ["json", "hermes"])
def test_masks_equal_transitions_on_gemma3s_262k_vocabulary(case):
    """Every few states of a document: the mask against one transition per token, on a seeded sample of tokens,
    the allowed ones, the tokens that end inside a character and those that leave a string (quote, backslash)."""
    vocab = packaged_vocab("gemma3-270m")
    table = TokenTable.of(vocab)
    gbnf, text = (json_schema_to_gbnf(SCHEMA), DOC) if case == "json" else hermes_call()
    found, states, engine = masks_along(vocab, gbnf, text)
    rng = np.random.default_rng(11)
    leaving = [t for t in range(vocab.n_tokens) if b'"' in vocab.token_bytes(t) or b"\\" in vocab.token_bytes(t)]
    partial = np.flatnonzero(table.partial_n > 0)
    checked = 0
    for mask, state in list(zip(found, states, strict=True))[::3]:
        allowed = np.flatnonzero(mask)
        sample = np.unique(np.concatenate([rng.choice(vocab.n_tokens, 600, replace=False), partial,
                                           rng.choice(leaving, 150, replace=False), table.eog,
                                           allowed[rng.permutation(len(allowed))[:150]]]))
        assert np.array_equal(mask[sample], expected(engine, state, sample.tolist(), vocab))
        checked += len(sample)
    assert checked > 10_000


def test_walk_skips_a_string_and_finds_its_exits():
    """Inside a JSON string on Gemma 3's vocabulary: almost every token is allowed as a block; the tokens with a quote
    or a backslash are walked on from there (the quote ends the string, the backslash must start an escape)."""
    vocab = packaged_vocab("gemma3-270m")
    g = Grammar.from_gbnf(json_schema_to_gbnf({"type": "string"}))
    engine = MaskEngine(g, TokenTable.of(vocab))
    state = engine.transition(g.initial, vocab.tokenize('"')[0])
    mask = engine.mask(state)
    ids = {vocab.token_bytes(t): t for t in range(vocab.n_tokens)}
    want = {b"abc": True, b'"': True, b'",': False, b'":': False, b'"}': False, b'\\"': True, b"\\\\": True,
            b"\\": True, b"\\/": False, b"\n": False, b"\t": False, b"\xe2\x80\x94": True, b"\xc2": True,
            b"\xc0": False}  # JSON has no \/ escape here (llama.cpp's grammar); \xc0 can complete no character
    assert {p: bool(mask[ids[p]]) for p in want} == want
    assert int(mask.sum()) == 254_858  # what one transition per token says (262,144 transitions: seconds, so pinned)


def test_tiny_caches_change_no_mask():
    """Masks and walks evicted as soon as they are made (a cache of one): the same masks."""
    vocab = packaged_vocab("smollm2")
    gbnf, text = hermes_call()
    want = masks_along(vocab, gbnf, text)[0]
    g = Grammar.from_gbnf(gbnf)
    engine = MaskEngine(g, TokenTable.of(vocab), cache_bytes=1)
    state = g.initial
    for tok, mask in zip(vocab.tokenize(text), want, strict=True):
        assert np.array_equal(engine.mask(state), mask)
        assert len(engine._local) <= 1 and len(engine._cache) <= 4
        state = engine.transition(state, tok)


def test_the_first_string_finds_its_walks_made_with_the_grammar(monkeypatch):
    """A string's contents (a loop over almost every token), its closing quote and its escapes are walked when the
    engine is made: the first mask inside a string walks only what pops out of them, below their nodes."""
    vocab = packaged_vocab("smollm2")
    gbnf = json_schema_to_gbnf({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]})
    walks = []
    monkeypatch.setattr(mask_walk.MaskWalker, "walk_suffix",
                        lambda self, *a, _f=mask_walk.MaskWalker.walk_suffix: walks.append(a) or _f(self, *a))
    masks_inside = []
    for loops in (masks.LOOPS_MAX, 0):
        monkeypatch.setattr(masks, "LOOPS_MAX", loops)
        g = Grammar.from_gbnf(gbnf)
        engine = MaskEngine(g, TokenTable.of(vocab))
        assert bool(walks) == (loops > 0)  # the walks made with the grammar
        state = g.initial
        for tok in vocab.tokenize('{"a": "'):
            state = engine.transition(state, tok)
        walks.clear()
        masks_inside.append(engine.mask(state))
        from_root = [suffix for suffix, parents, _ in walks if parents is None]
        assert (not from_root) == (loops > 0), from_root
        walks.clear()
    assert np.array_equal(*masks_inside)
    assert masks_inside[0][vocab.tokenize("abc")[0]] and not masks_inside[0][vocab.tokenize("\n")[0]]
