"""Embeddings (``--embedding``): pooling and normalization against llama.cpp, and the routes' shapes and errors.

Two oracles, llama.cpp through llama-cpp-python:
- on a tiny model's weights as F32 (llama.cpp's float path, its KV cache F32 too) our pooled vectors are llama.cpp's
  up to float rounding: within ``FLOAT_BOUND`` of the largest value (measured: 6e-7);
- on the packaged SmolLM2 Q4_1, llama.cpp quantizes activations to 8 bits in its matrix products, which moves its
  hidden states 2-4 % from the exact (dequantized) model's, while ours stay within 3e-4 of it: the normalized
  pooled vectors agree within ``Q4_MAX_ABS`` per value and ``Q4_MIN_COS`` in direction (measured: mean 6.6e-3 /
  0.99974, cls 6.6e-3 / 0.99981, last 1.2e-2 / 0.99907).
"""

import base64
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from tests.server.conftest import call, live_server

from model_fixtures import FAMILIES, dequantized, files, tokens_for, write_gguf
from samplechain.gguf import GGUFFile
from samplechain.runtime.context import Context
from samplechain.runtime.embeddings import normalize, pool
from samplechain.runtime.model import ModelConfig, Transformer
from samplechain.runtime.weights import WeightLoader

FLOAT_BOUND = 1e-5  # max |ours - llama.cpp's float path| / max |llama.cpp|
Q4_MAX_ABS = 0.02  # normalized vectors, per value, against llama.cpp on the Q4_1 file
Q4_MIN_COS = 0.998
POOLING_TYPE = {"none": 0, "mean": 1, "cls": 2, "last": 3}
TEXT = "I believe the meaning of life is"
FLOAT_FAMILIES = ("llama3", "qwen2")
SMOL_POOLINGS = ("mean", "cls", "last")
STORED = Path(__file__).parents[1] / "fixtures" / "embeddings.npz"


def tiny_f32(family, folder):
    """A tiny fixture model's weights dequantized to an F32 GGUF, and its evaluated tokens (20 of them)."""
    fam = next(f for f in FAMILIES if f.name == family)
    path = folder / f"{family}-f32.gguf"
    write_gguf(fam, path, dequantized(files(fam)["Q8_0"]))
    return path, tokens_for(fam)[:20].tolist()


def llama_cpp_embedding(path, tokens, pooling, f32_cache=False):
    """llama.cpp's embedding of ``tokens`` (unnormalized): per token for ``none``, else pooled."""
    import llama_cpp
    from benchmarks import _llama

    _llama.without_extra_bufts()  # ggml's AMX buffers crash on CPUs that have AMX (see there)
    kv = {"type_k": 0, "type_v": 0} if f32_cache else {}
    llm = llama_cpp.Llama(str(path), embedding=True, pooling_type=POOLING_TYPE[pooling], n_ctx=128, n_batch=128,
                          n_ubatch=128, n_threads=1, verbose=False, **kv)
    llm.tokenize = lambda *a, **k: list(tokens)  # the tokens themselves, whatever the text
    return np.asarray(llm.embed("unused", normalize=False), dtype=np.float32)


def llama_cpp_references(folder):
    """Every reference vector, computed by llama.cpp (llama-cpp-python)."""
    from samplechain.runtime import model_path

    out = {}
    for family in FLOAT_FAMILIES:
        path, tokens = tiny_f32(family, folder)
        for pooling in POOLING_TYPE:
            out[f"{family}_{pooling}"] = llama_cpp_embedding(path, tokens, pooling, f32_cache=True)
    llm_tokens = [57, 2875, 260, 2455, 282, 1029, 314]  # SmolLM2's tokens of TEXT (checked against ours below)
    out["smol_tokens"] = np.array(llm_tokens)
    for pooling in SMOL_POOLINGS:
        out[f"smol_{pooling}"] = llama_cpp_embedding(model_path("smollm2"), llm_tokens, pooling)
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """llama.cpp's vectors: computed now where llama-cpp-python is installed (the bench extra), else as stored by
    ``PYTHONPATH=.:tests python tests/server/test_embeddings.py`` with llama-cpp-python 0.3.36."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        with np.load(STORED) as data:
            return dict(data)
    return llama_cpp_references(tmp_path_factory.mktemp("f32"))


@pytest.mark.parametrize("family", FLOAT_FAMILIES)
def test_pooling_matches_llama_cpp_float_path(family, reference, tmp_path):
    path, tokens = tiny_f32(family, tmp_path)
    g = GGUFFile(path)
    t = Transformer(ModelConfig.from_gguf(g), WeightLoader(g, int4=False))
    hidden = Context(t, 64).embed(tokens).numpy()
    assert hidden.shape == (20, 256)
    for pooling in POOLING_TYPE:
        ref = reference[f"{family}_{pooling}"]
        ours = pool(hidden, pooling)
        ours = ours if pooling == "none" else ours[0]
        assert ours.shape == ref.shape
        assert np.abs(ours - ref).max() <= FLOAT_BOUND * np.abs(ref).max(), pooling


@pytest.mark.parametrize("pooling", SMOL_POOLINGS)
def test_server_matches_llama_cpp_on_smollm2(smol, pooling, reference):
    assert smol.tokenize(TEXT) == reference["smol_tokens"].tolist()
    ref = reference[f"smol_{pooling}"] / np.linalg.norm(reference[f"smol_{pooling}"])
    with live_server(smol, n_slots=2, n_ctx=256, embedding=True, pooling=pooling) as s:
        r = call(s, "POST", "/v1/embeddings", {"input": TEXT})
    assert r.status == 200
    ours = np.asarray(r.json()["data"][0]["embedding"])
    assert ours.shape == (576,)
    assert abs(float(ours @ ours) - 1.0) < 1e-6  # euclidean normalization (embd_normalize 2)
    assert np.abs(ours - ref).max() <= Q4_MAX_ABS
    assert float(ours @ ref) >= Q4_MIN_COS


@pytest.mark.parametrize("norm, expected", [
    (-1, [3.0, -4.0, 0.0]),
    (0, [3.0 * 32760 / 4, -32760.0, 0.0]),  # max-absolute, scaled to int16's range
    (1, [3.0 / 7, -4.0 / 7, 0.0]),
    (2, [0.6, -0.8, 0.0]),
    (3, [3.0 / 91 ** (1 / 3), -4.0 / 91 ** (1 / 3), 0.0]),
])
def test_normalize_is_common_embd_normalize(norm, expected):
    got = normalize(np.array([3.0, -4.0, 0.0], dtype=np.float32), norm)
    assert got.dtype == np.float32
    assert np.allclose(got, expected, rtol=1e-6, atol=0)
    assert normalize(np.zeros(3, dtype=np.float32), 2).tolist() == [0.0, 0.0, 0.0]


def test_pool_shapes():
    h = np.arange(12, dtype=np.float32).reshape(4, 3)
    assert pool(h, "none").tolist() == h.tolist()
    assert pool(h, "mean").tolist() == [[4.5, 5.5, 6.5]]
    assert pool(h, "cls").tolist() == [[0.0, 1.0, 2.0]]
    assert pool(h, "last").tolist() == [[9.0, 10.0, 11.0]]
    assert pool(h, "rank").tolist() == [[9.0]]  # no classification head: the score is the last vector's first value


@pytest.fixture(scope="module")
def mean_server(smol):
    """2 slots of 256 cells, batches of 64 tokens (a prompt to pool must fit in one), mean pooling."""
    with live_server(smol, n_slots=2, n_ctx=512, n_batch=64, embedding=True, pooling="mean") as s:
        yield s


def test_several_inputs_in_order_with_usage(mean_server, smol):
    texts = ["I believe the meaning of life is", "hello", "I believe the meaning of life is"]
    r = call(mean_server, "POST", "/v1/embeddings", {"input": texts, "model": "my-model"})
    body = r.json()
    assert r.status == 200 and body["object"] == "list" and body["model"] == "my-model"
    n = sum(len(smol.tokenize(t)) for t in texts)
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and {d["object"] for d in body["data"]} == {"embedding"}
    # each prompt alone, through the batch-invariant forward: the same bits whatever it shared a step with
    alone = normalize(pool(Context(smol.transformer, 64).embed(smol.tokenize(texts[1])).numpy(), "mean")[0], 2)
    assert body["data"][1]["embedding"] == alone.tolist()
    assert body["data"][0]["embedding"] == body["data"][2]["embedding"]


def test_base64_is_the_float_vector(mean_server):
    floats = call(mean_server, "POST", "/v1/embeddings", {"input": TEXT}).json()["data"][0]["embedding"]
    r = call(mean_server, "POST", "/v1/embeddings", {"input": TEXT, "encoding_format": "base64"}).json()["data"][0]
    assert r["encoding_format"] == "base64"
    decoded = struct.unpack(f"<{len(floats)}f", base64.b64decode(r["embedding"]))
    assert list(decoded) == floats


def test_openai_client(mean_server):
    import openai

    client = openai.OpenAI(base_url=mean_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    res = client.embeddings.create(model="text-embedding-3-small", input=[TEXT, "hello"])  # base64 on the wire
    floats = call(mean_server, "POST", "/v1/embeddings", {"input": [TEXT, "hello"]}).json()["data"]
    assert [d.embedding for d in res.data] == [d["embedding"] for d in floats]


def test_native_shape_and_input_forms(mean_server, smol):
    r = call(mean_server, "POST", "/embeddings", {"content": "hello world"})
    body = r.json()
    assert r.status == 200 and len(body) == 1 and body[0]["index"] == 0
    assert len(body[0]["embedding"]) == 1 and len(body[0]["embedding"][0]) == 576
    # "content" on the OpenAI route answers in the native shape, as llama-server does
    assert call(mean_server, "POST", "/v1/embeddings", {"content": "hello world"}).json() == body
    # OpenAI content parts are joined with nothing between them; token ids are prompts too
    oai = call(mean_server, "POST", "/v1/embeddings", {"input": [
        "hello world", {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]},
        {"prompt_string": "hello world"}, smol.tokenize("hello world")]}).json()["data"]
    assert [d["embedding"] for d in oai[1:]] == [oai[0]["embedding"]] * 3
    assert body[0]["embedding"][0] == oai[0]["embedding"]


def test_embd_normalize(mean_server):
    raw = np.asarray(call(mean_server, "POST", "/v1/embeddings", {"input": TEXT, "embd_normalize": -1}).json()
                     ["data"][0]["embedding"], dtype=np.float32)
    for norm in (0, 1, 2):
        got = call(mean_server, "POST", "/v1/embeddings", {"input": TEXT, "embd_normalize": norm}).json()
        assert got["data"][0]["embedding"] == normalize(raw, norm).tolist()


@pytest.mark.parametrize("body, status, message", [
    ({"input": ""}, 400, "Input content cannot be empty"),
    ({"input": []}, 400, '"input" must not be empty'),
    ({}, 400, '"input" or "content" must be provided'),
    ({"input": "x", "encoding_format": "int8"}, 400, "Can be either float or base64"),
    ({"input": {"content": "string"}}, 400, '"content" must be an array'),
    ({"input": {"content": [{"type": "unknown"}]}}, 400, "unsupported content[].type"),
    ({"input": {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}}, 400,
     "image input is not supported"),
    ({"input": [True]}, 400, "\"prompt\" elements must be a string"),
    ({"input": [1, True]}, 400, "prompt token ids must be integers"),
    ({"input": [42] * 80}, 400, "input (80 tokens) is too large to process. increase the physical batch size "
                                    "(current batch size: 64)"),
])
def test_bad_requests(mean_server, body, status, message):
    r = call(mean_server, "POST", "/v1/embeddings", body)
    assert r.status == status and message in r.json()["error"]["message"], r.json()


def test_completions_still_run_beside_embeddings(mean_server):
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        cmpl = ex.submit(call, mean_server, "POST", "/completion",
                         {"prompt": "Hello", "n_predict": 8, "temperature": 0})
        embd = ex.submit(call, mean_server, "POST", "/embedding", {"content": TEXT})
        assert cmpl.result().status == 200 and cmpl.result().json()["tokens_predicted"] == 8
        assert embd.result().status == 200


def test_unified_cache_gives_the_same_vectors(smol, mean_server):
    expected = call(mean_server, "POST", "/v1/embeddings", {"input": [TEXT, "hello"]}).json()["data"]
    with live_server(smol, n_slots=2, n_ctx=256, embedding=True, pooling="mean", kv_unified=True) as s:
        got = call(s, "POST", "/v1/embeddings", {"input": [TEXT, "hello"]}).json()["data"]
    assert got == expected


def test_pooling_none_gives_each_token_unnormalized(smol):
    tokens = smol.tokenize(TEXT)
    expected = Context(smol.transformer, 64).embed(tokens).numpy()
    with live_server(smol, n_slots=1, n_ctx=256, embedding=True) as s:  # SmolLM2 has no pooling type: none
        r = call(s, "POST", "/embedding", {"content": TEXT})
        assert r.status == 200 and r.json()[0]["embedding"] == expected.tolist()
        r = call(s, "POST", "/v1/embeddings", {"input": TEXT})
        assert r.status == 400
        assert r.json()["error"]["message"] == ("Pooling type 'none' is not OAI compatible. Please use a different "
                                                "pooling type")


def test_pooling_last_reads_long_prompts_in_chunks(smol):
    tokens = smol.tokenize("hello " * 100)  # 100 tokens, read in batches of 32
    expected = normalize(Context(smol.transformer, 128).embed(tokens).numpy()[-1], 2)
    with live_server(smol, n_slots=1, n_ctx=128, n_batch=32, embedding=True, pooling="last") as s:
        r = call(s, "POST", "/v1/embeddings", {"input": tokens})
        assert r.status == 200 and r.json()["data"][0]["embedding"] == expected.tolist()
        r = call(s, "POST", "/v1/embeddings", {"input": "hello " * 130})
        assert r.status == 400 and r.json()["error"]["type"] == "exceed_context_size_error"


def test_without_embedding_the_routes_answer_501(server):
    for path in ("/embedding", "/embeddings", "/v1/embeddings"):
        r = call(server, "POST", path, {"input": "hello"})
        assert r.status == 501 and r.json()["error"] == {
            "code": 501, "message": "This server does not support embeddings. Start it with `--embeddings`",
            "type": "not_supported_error"}


if __name__ == "__main__":  # regenerate the stored references (needs llama-cpp-python: the bench extra)
    with tempfile.TemporaryDirectory() as tmp:
        np.savez_compressed(STORED, **llama_cpp_references(Path(tmp)))
    print(f"wrote {STORED}")
