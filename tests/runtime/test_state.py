import struct

import pytest

from samplechain import SamplingParams
from samplechain.runtime import StateError

PROMPT = "Write a short poem about the sea and the wind."


def _run(model, cache=None, prompt=PROMPT, **kw):
    text = "".join(model.generate(prompt, SamplingParams(seed=1234), n_predict=24, n_ctx=256,
                                  prompt_cache=cache, **kw))
    return text, model.timings


def test_prompt_cache_continues_exactly_like_the_original_run(smol, tmp_path):
    path = tmp_path / "prompt.bin"
    plain, _t0 = _run(smol)
    first, t1 = _run(smol, path)
    assert path.exists() and t1.n_reused == 0
    second, t2 = _run(smol, path)
    n_prompt = len(smol.tokenize(PROMPT))
    assert t2.n_reused == n_prompt - 1 and t2.n_prompt == 1
    assert first == plain and second == plain


def test_prompt_cache_reuses_the_longest_common_prefix(smol, tmp_path):
    path = tmp_path / "prompt.bin"
    _run(smol, path)
    longer = PROMPT + " Make it rhyme."
    _, t = _run(smol, path, prompt=longer)
    assert t.n_reused == len(smol.tokenize(PROMPT)) - 1
    # the file now holds the longer prompt; a different prompt reuses only the shared start
    _, t = _run(smol, path, prompt="Write a limerick.")
    common = 0
    for a, b in zip(smol.tokenize(longer), smol.tokenize("Write a limerick."), strict=False):
        if a != b:
            break
        common += 1
    assert t.n_reused == common


def test_saved_state_round_trips(smol, tmp_path):
    ctx = smol.new_context(64)
    tokens = smol.tokenize("Hello there, general")
    ctx.decode(tokens)
    ctx.save_state(tmp_path / "s.bin", tokens)
    other = smol.new_context(64)
    assert other.load_state(tmp_path / "s.bin") == tokens
    assert other.kv.n_used == len(tokens) and other.seq_pos_max(0) == len(tokens) - 1
    assert (other.kv.k[:, :, :len(tokens)] == ctx.kv.k[:, :, :len(tokens)]).all()


def test_bad_state_files_are_rejected(smol, gemma, tmp_path):
    ctx = smol.new_context(64)
    tokens = smol.tokenize("Hello there, this state holds more than eight tokens of text")
    ctx.decode(tokens)
    good = tmp_path / "good.bin"
    ctx.save_state(good, tokens)
    data = good.read_bytes()

    def load(blob, context=None):
        p = tmp_path / "bad.bin"
        p.write_bytes(blob)
        return (context or smol.new_context(64)).load_state(p)

    with pytest.raises(StateError, match="truncated"):
        load(data[:-10])
    with pytest.raises(StateError, match="expected"):
        load(data + b"\0")
    with pytest.raises(StateError, match="not a samplechain state"):
        load(b"GGUF" + data[4:])
    with pytest.raises(StateError, match="version 9"):
        load(data[:4] + struct.pack("<I", 9) + data[8:])
    with pytest.raises(StateError, match="corrupt state header"):
        load(data[:12] + b"\x00" + data[13:])
    with pytest.raises(StateError, match="arch='llama'"):
        load(data, gemma.new_context(64))
    with pytest.raises(StateError, match="do not fit"):
        load(data, smol.new_context(8))
    with pytest.raises(StateError, match="cannot read"):
        smol.new_context(64).load_state(tmp_path / "missing.bin")
    with pytest.raises(StateError, match="prompt cache"):
        (tmp_path / "junk.bin").write_bytes(b"junk" * 10)
        "".join(smol.generate("hi", n_predict=1, prompt_cache=tmp_path / "junk.bin"))
