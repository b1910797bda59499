"""Grammar-constrained sampling cost: ours vs llguidance vs llama.cpp, same grammar, same tokens, same run.

For a JSON-Schema grammar on the 49,152-token (SmolLM2) and 262,144-token (Gemma 3) vocabularies, a realistic
JSON document is fed token by token. Per token we time

* the full mask over the vocabulary (ours: ``MaskEngine.mask``; llguidance: ``compute_bitmask``; llama.cpp:
  ``llama_sampler_apply`` of its grammar sampler on all candidates),
* the rejection-path check of the one sampled token (ours: ``MaskEngine.allows`` on a grammar with no mask
  computed; llguidance: ``validate_tokens``; llama.cpp: ``llama_sampler_apply`` on a one-candidate array),

and once per grammar the compile time (schema -> GBNF -> rules -> initial state; llguidance: ``LLMatcher``;
llama.cpp: ``llama_sampler_init_grammar``). Our masks are cached per parse state, so the first pass over a
document is the honest cost (every state seen for the first time is computed); the second pass shows the
cache. Run: ``python -m benchmarks.bench_grammar``.
"""

from __future__ import annotations

import ctypes
import json
import time

import numpy as np

from benchmarks import _llama
from samplechain import Vocab
from samplechain.grammar import Grammar, MaskEngine, TokenTable, json_schema_to_gbnf
from samplechain.runtime import model_path

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "customer": {"type": "object", "properties": {
            "name": {"type": "string"}, "email": {"type": "string"}, "vip": {"type": "boolean"}},
            "required": ["name", "email"]},
        "items": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
            "sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}, "price": {"type": "number"}},
            "required": ["sku", "qty", "price"]}},
        "status": {"enum": ["pending", "paid", "shipped"]},
        "notes": {"type": ["string", "null"]},
        "created": {"type": "string", "format": "date-time"},
    },
    "required": ["id", "customer", "items", "status", "created"],
}
DOCUMENT = {
    "id": "3f2b8c1e-9a7d-4e21-b6c4-0d5e7f8a9b10",
    "customer": {"name": "María Fernández", "email": "maria.fernandez@example.com", "vip": True},
    "items": [
        {"sku": "KB-2041", "qty": 2, "price": 49.99},
        {"sku": "MS-0099", "qty": 1, "price": 19.5},
        {"sku": "USB-C-1M", "qty": 3, "price": 7.25},
    ],
    "status": "paid",
    "created": "2026-11-21T09:30:00Z",
    "notes": "Leave the parcel at the front desk — ring twice.",
}  # required properties first, then optional ones, each in schema order (the converter's object shape)
VOCABS = {"smollm2": "49k", "gemma3-270m": "262k"}


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs) * 1e3, q))


def ours(vocab: Vocab, tokens: list[int]) -> dict:
    table = TokenTable.of(vocab)
    t0 = time.perf_counter()
    grammar = Grammar.from_gbnf(json_schema_to_gbnf(SCHEMA))
    compile_s = time.perf_counter() - t0
    engine = MaskEngine(grammar, table)
    full, cached, state = [], [], grammar.initial
    for tok in tokens:
        t = time.perf_counter()
        mask = engine.mask(state)
        full.append(time.perf_counter() - t)
        assert mask[tok], tok
        state = engine.transition(state, tok)
    state = grammar.initial
    for tok in tokens:
        t = time.perf_counter()
        engine.mask(state)
        cached.append(time.perf_counter() - t)
        state = engine.transition(state, tok)
    fresh = Grammar.from_gbnf(json_schema_to_gbnf(SCHEMA))  # nothing cached: the rejection path from scratch
    fresh_engine, reject, state = MaskEngine(fresh, table), [], fresh.initial
    for tok in tokens:
        t = time.perf_counter()
        ok = fresh_engine.allows(state, tok)
        reject.append(time.perf_counter() - t)
        assert ok
        state = fresh_engine.transition(state, tok)
    return {"compile": compile_s, "full": full, "cached": cached, "reject": reject}


def llguidance_run(vocab: Vocab, tokens: list[int], gbnf: str) -> dict | None:
    try:
        import llguidance
    except ImportError:
        return None

    class _Tok:
        def __init__(self) -> None:
            self.tokens = [vocab.token_bytes(i) for i in range(vocab.n_tokens)]
            self.eos_token_id = vocab.eos if vocab.eos is not None else 0
            self.bos_token_id = vocab.bos
            self.special_token_ids = sorted(vocab.special)

        def __call__(self, text: bytes) -> list[int]:
            return vocab.tokenize(text.decode("utf-8", errors="replace"))

    tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Tok()))
    grammar = llguidance.grammar_from("gbnf", gbnf)
    t0 = time.perf_counter()
    m = llguidance.LLMatcher(tok, grammar, log_level=0)
    compile_s = time.perf_counter() - t0
    assert not m.is_error(), m.get_error()
    full, reject = [], []
    for t in tokens:
        a = time.perf_counter()
        m.compute_bitmask()
        full.append(time.perf_counter() - a)
        a = time.perf_counter()
        n_ok = m.validate_tokens([t])
        reject.append(time.perf_counter() - a)
        assert n_ok == 1 and m.consume_token(t), m.get_error()
    return {"compile": compile_s, "full": full, "reject": reject}


def llama_run(name: str, tokens: list[int], gbnf: str) -> dict | None:
    if not _llama.available():
        return None
    from llama_cpp import Llama

    L = _llama.L
    llm = Llama(model_path=str(model_path(name)), vocab_only=True, verbose=False)
    vocab = L.llama_model_get_vocab(llm.model)
    n = L.llama_vocab_n_tokens(vocab)
    t0 = time.perf_counter()
    smpl = L.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    compile_s = time.perf_counter() - t0
    buf = np.zeros(n, dtype=_llama.TOKEN_DATA)
    one = np.zeros(1, dtype=_llama.TOKEN_DATA)
    full, reject = [], []

    def array(b: np.ndarray):
        return L.llama_token_data_array(data=b.ctypes.data_as(ctypes.POINTER(L.llama_token_data)), size=len(b),
                                        selected=-1, sorted=False)

    for t in tokens:
        buf["id"] = np.arange(n, dtype=np.int32)
        buf["logit"] = 0.0
        arr = array(buf)
        a = time.perf_counter()
        L.llama_sampler_apply(smpl, ctypes.byref(arr))
        full.append(time.perf_counter() - a)
        assert np.isfinite(buf["logit"][t])
        one["id"], one["logit"] = t, 0.0
        arr1 = array(one)
        a = time.perf_counter()
        L.llama_sampler_apply(smpl, ctypes.byref(arr1))
        reject.append(time.perf_counter() - a)
        L.llama_sampler_accept(smpl, t)
    L.llama_sampler_free(smpl)
    return {"compile": compile_s, "full": full, "reject": reject}


def main() -> None:
    gbnf = json_schema_to_gbnf(SCHEMA)
    text = json.dumps(DOCUMENT, indent=2, ensure_ascii=False)
    rows = []
    for name, size in VOCABS.items():
        vocab = Vocab.from_gguf(model_path(name))
        t0 = time.perf_counter()
        TokenTable.of(vocab)
        table_s = time.perf_counter() - t0
        tokens = vocab.tokenize(text)
        results = {"ours": ours(vocab, tokens), "llguidance": llguidance_run(vocab, tokens, gbnf),
                   "llama.cpp": llama_run(name, tokens, gbnf)}
        print(f"\n{size} vocabulary ({name}), {len(tokens)} tokens; our vocabulary table: {table_s * 1e3:.0f} ms "
              "(once per vocabulary)")
        print(f"{'':>12} {'mask med ms':>12} {'mask p99 ms':>12} {'mask mean ms':>13} {'reject med us':>14} "
              f"{'compile ms':>11}")
        for who, r in results.items():
            if r is None:
                print(f"{who:>12}   (not installed)")
                continue
            print(f"{who:>12} {pct(r['full'], 50):12.3f} {pct(r['full'], 99):12.3f} "
                  f"{np.mean(r['full']) * 1e3:13.3f} {pct(r['reject'], 50) * 1e3:14.1f} {r['compile'] * 1e3:11.1f}")
            rows.append((size, who, r))
        c = results["ours"]["cached"]
        print(f"{'ours cached':>12} {pct(c, 50):12.4f} {pct(c, 99):12.4f} {np.mean(c) * 1e3:13.4f}")
    print("\nTargets at 49k: mask median <= 1 ms, p99 <= 10 ms; rejection <= 50 us; compile <= 100 ms.")


if __name__ == "__main__":
    main()
