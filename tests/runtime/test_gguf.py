import struct
import time

import numpy as np
import pytest

from samplechain.gguf import GGUFError, GGUFFile
from samplechain.runtime import model_path


@pytest.fixture(scope="module")
def smol_path():
    return model_path("smollm2")


def test_header_metadata_and_index(smol_path):
    start = time.thread_time()  # this thread's work, whatever else loads the machine
    g = GGUFFile(smol_path)
    elapsed = time.thread_time() - start
    assert elapsed < 2.0  # the gguf package's reader takes 1.6-3.5 s here
    assert g.version == 3
    assert g.architecture == "llama"
    assert g.arch_get("block_count") == 30
    assert g.arch_get("embedding_length") == 576
    assert g.arch_get("attention.head_count") == 9
    assert g.arch_get("attention.head_count_kv") == 3
    assert g.arch_get("rope.freq_base") == 100000.0
    assert len(g.metadata["tokenizer.ggml.tokens"]) == 49152
    assert len(g.metadata["tokenizer.ggml.merges"]) == 48900
    assert g.metadata["tokenizer.ggml.bos_token_id"] == 1
    assert g.metadata["tokenizer.ggml.eos_token_id"] == 2
    kinds = [t.type_name for t in g.tensors.values()]
    assert (kinds.count("Q4_1"), kinds.count("F32"), kinds.count("Q8_0")) == (210, 61, 1)
    assert g.tensors["token_embd.weight"].shape == (49152, 576)
    assert g.tensors["blk.0.ffn_down.weight"].shape == (576, 1536)


def test_long_string_arrays_are_read_from_the_file_on_access(smol_path):
    """A vocabulary's tokens and merges stay in the mapped file (StringArray), equal to the gguf package's lists
    item by item, by index (negative too), slice and iteration."""
    import gguf

    from samplechain.gguf import StringArray

    g = GGUFFile(smol_path)
    ref = gguf.GGUFReader(smol_path)
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        got, want = g.metadata[key], ref.fields[key].contents()
        assert isinstance(got, StringArray) and len(got) == len(want)
        assert list(got) == want and got == want and got != want[:-1]
        assert (got[0], got[-1], got[1234], got[-2:]) == (want[0], want[-1], want[1234], want[-2:])
        with pytest.raises(IndexError):
            got[len(want)]
    assert g.metadata["tokenizer.ggml.tokens"][1] == "<|im_start|>"
    assert g.metadata["tokenizer.ggml.merges"][0] == "Ġ t"


def test_dequantize_matches_block_formula(smol_path):
    g = GGUFFile(smol_path)
    raw = g.raw("blk.0.attn_k.weight")  # Q4_1: d f16, m f16, 16 bytes of nibbles per 32 weights
    w = g.dequantize("blk.0.attn_k.weight")
    assert w.shape == (192, 576) and w.dtype == np.float32
    block = raw[3, 20:40]
    d, m = np.frombuffer(block[:4].tobytes(), dtype=np.float16).astype(np.float32)
    q = np.concatenate([block[4:] & 15, block[4:] >> 4]).astype(np.float32)
    np.testing.assert_array_equal(w[3, 32:64], q * d + m)


def _write(path, data):
    path.write_bytes(data)
    return str(path)


def test_bad_files_are_rejected(tmp_path, smol_path):
    with open(smol_path, "rb") as f:
        head = f.read(4_000_000)
    with pytest.raises(GGUFError, match="magic"):
        GGUFFile(_write(tmp_path / "a.gguf", b"GGML" + head[4:1000]))
    with pytest.raises(GGUFError, match="only 3 bytes"):
        GGUFFile(_write(tmp_path / "b.gguf", b"GGU"))
    with pytest.raises(GGUFError, match="version 7"):
        GGUFFile(_write(tmp_path / "c.gguf", b"GGUF" + struct.pack("<I", 7) + head[8:1000]))
    with pytest.raises(GGUFError, match="truncated"):
        GGUFFile(_write(tmp_path / "d.gguf", head[:500_000]))  # inside the vocabulary
    with pytest.raises(GGUFError, match="past the end"):
        GGUFFile(_write(tmp_path / "e.gguf", head))  # header complete, tensor data missing
    with pytest.raises(GGUFError, match="implausible"):
        GGUFFile(_write(tmp_path / "f.gguf", b"GGUF" + struct.pack("<IQQ", 3, 2**60, 1) + bytes(64)))
    with pytest.raises(GGUFError, match="cannot open"):
        GGUFFile(tmp_path / "missing.gguf")
    with pytest.raises(GGUFError, match="no tensor named"):
        GGUFFile(smol_path).raw("nope")


def test_types_without_a_kernel_are_dequantized_with_a_notice(tmp_path, capsys):
    """A Q3_K and an IQ4_NL matrix (types our table does not list load through the gguf package): dequantized
    exactly as gguf-py does, one notice per type."""
    import gguf
    from gguf.quants import dequantize

    from samplechain.gguf import GGUFFile
    from samplechain.runtime.weights import WeightLoader

    rng = np.random.default_rng(7)
    path = tmp_path / "odd.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    raws = {}
    for name, qtype in (("a.weight", gguf.GGMLQuantizationType.Q3_K), ("b.weight", gguf.GGMLQuantizationType.Q3_K),
                        ("c.weight", gguf.GGMLQuantizationType.IQ4_NL)):
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (16, 256 // block * size), dtype=np.uint8)
        blocks = raw.reshape(16, -1, size)
        blocks[..., -2:] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)  # Q3_K's d: the block's last 2 bytes
        if qtype == gguf.GGMLQuantizationType.IQ4_NL:
            blocks[..., :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)  # IQ4_NL's d comes first
        raws[name] = (raw, qtype)
        w.add_tensor(name, raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    g = GGUFFile(path)
    assert [g.info(n).type_name for n in raws] == ["Q3_K", "Q3_K", "IQ4_NL"]
    loader = WeightLoader(g)
    for name, (raw, qtype) in raws.items():
        lin = loader.linear(name)
        np.testing.assert_array_equal(lin.dense_weight().numpy(), dequantize(raw, qtype).reshape(16, 256))
    notices = capsys.readouterr().err.splitlines()
    tail = "weights have no kernel of their own here; dequantized to float32 at load"
    assert notices == [f"notice: odd.gguf: Q3_K {tail}", f"notice: odd.gguf: IQ4_NL {tail}"]
