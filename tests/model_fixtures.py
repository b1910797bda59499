"""Tiny random-weight models of every architecture we run, as llama.cpp sees them.

For each family a seeded generator writes an F16 GGUF the way llama.cpp's converter lays one out (tensor names,
shapes, metadata: Llama 3's ``rope_freqs``, Qwen 2's biases, Qwen 3's q/k norms, Phi-3's fused matrices and rope
factors, Gemma 2's soft-capping and alternating sliding windows, Gemma 3's q/k norms and window pattern), with the
family's real tokenizer metadata cut down to ``N_VOCAB`` tokens (its first tokens, its special tokens moved into
the range, the merges among the kept tokens). llama.cpp (llama-cpp-python) then quantizes it to Q8_0, Q4_K_M
(Q4_K with Q6_K where llama.cpp's recipe puts it) and Q6_K, and evaluates every file on a fixed random token
sequence; the quantized files and llama.cpp's logits are stored under ``tests/fixtures/models``. For each quantized
file llama.cpp also evaluates its weights dequantized to an F32 GGUF (``<type>_F32``): llama.cpp's float path over
exactly the same weight values, without the 8-bit activations its quantized matrix products use.

The F16 file is not stored: ``write_f16`` rebuilds it bit for bit from the seed (its SHA-256 is stored with the
logits and checked). ``python -m tests.model_fixtures`` regenerates everything; it needs the bench extra
(llama-cpp-python) and llama.cpp's tree (``tests.llama_tree``). CI only reads the stored files.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).parent / "fixtures" / "models"
N_TOKENS = 40  # the evaluated sequence
QUANT_TYPES = {"Q8_0": 7, "Q4_K_M": 15, "Q6_K": 18}  # llama_ftype values
SEED = 20261125
TOKEN_CONTROL = 3


@dataclass(frozen=True)
class Shape:
    n_vocab: int | None = 320  # the family's first tokens (a multiple of 16, as our engine tiles its output rows);
    n_embd: int = 256  # None: the whole vocabulary
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_ff: int = 256
    n_layer: int = 2


TINY = Shape()
N_VOCAB = TINY.n_vocab


@dataclass(frozen=True)
class Family:
    name: str  # the fixture's name
    arch: str
    vocab: str  # llama.cpp's ggml-vocab-<vocab>.gguf, or "gemma3" (our packaged Gemma 3's vocabulary)
    tied: bool = True
    extra: dict = field(default_factory=dict)


FAMILIES = [
    Family("llama3", "llama", "llama-bpe", tied=False, extra={"rope_freqs": True, "rope_base": 500000.0}),
    Family("mistral", "llama", "llama-spm", tied=False),
    Family("qwen2", "qwen2", "qwen2", extra={"bias": True, "rope_base": 1000000.0}),
    Family("qwen3", "qwen3", "qwen2", extra={"qk_norm": True, "rope_base": 1000000.0}),
    Family("phi3", "phi3", "phi-3", tied=False, extra={"fused": True, "rope_factors": True}),
    Family("gemma2", "gemma2", "gemma3", extra={"gemma": 2, "window": 8}),
    Family("gemma3", "gemma3", "gemma3", extra={"gemma": 3, "window": 8, "qk_norm": True, "rope_base": 1000000.0}),
]


def _vocab_source(vocab: str) -> Path:
    if vocab == "gemma3":
        from samplechain.runtime import model_path

        return Path(model_path("gemma3-270m"))
    try:
        from llama_tree import vocab_file
    except ImportError:  # run as ``python -m tests.model_fixtures``
        from tests.llama_tree import vocab_file

    return vocab_file(vocab)


def small_vocab(vocab: str, n_vocab: int | None = N_VOCAB) -> dict:
    """The family's tokenizer metadata cut to ``n_vocab`` tokens: the first ones, the special tokens the metadata
    names moved into the range (replacing the last kept tokens), and the merges whose parts and result are kept.
    ``n_vocab`` None keeps every token; more than the vocabulary has pads it with unused ``[PAD<i>]`` tokens (as
    llama.cpp's converter pads Qwen's)."""
    from samplechain.gguf import GGUFFile

    g = GGUFFile(_vocab_source(vocab))
    meta = g.metadata
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = np.asarray(meta.get("tokenizer.ggml.token_type", np.ones(len(tokens))), dtype=np.int32)
    scores = meta.get("tokenizer.ggml.scores")
    keys = ["bos_token_id", "eos_token_id", "eot_token_id", "eom_token_id", "unknown_token_id", "padding_token_id"]
    ids = {k: int(meta[f"tokenizer.ggml.{k}"]) for k in keys if f"tokenizer.ggml.{k}" in meta}
    if n_vocab is None or n_vocab >= len(tokens):
        pad = 0 if n_vocab is None else n_vocab - len(tokens)
        out = {"tokenizer.ggml.model": meta["tokenizer.ggml.model"],
               "tokens": tokens + [f"[PAD{i}]" for i in range(pad)], "types": [*map(int, types), *[5] * pad],
               "ids": ids}
        if scores is not None:
            out["scores"] = [*map(float, scores), *[0.0] * pad]
        for key, name in (("pre", "pre"), ("merges", "merges")):
            if f"tokenizer.ggml.{name}" in meta:
                out[key] = meta[f"tokenizer.ggml.{name}"]
        for key in ("add_bos_token", "add_eos_token", "add_space_prefix"):
            if f"tokenizer.ggml.{key}" in meta:
                out[key] = bool(meta[f"tokenizer.ggml.{key}"])
        return out
    keep = list(range(n_vocab))
    slot = n_vocab - 1
    moved: dict[int, int] = {}
    for old in sorted(set(ids.values())):
        if old >= n_vocab:
            moved[old] = slot
            keep[slot] = old
            slot -= 1
    out = {
        "tokenizer.ggml.model": meta["tokenizer.ggml.model"],
        "tokens": [tokens[i] for i in keep],
        "types": [int(types[i]) for i in keep],
        "ids": {k: moved.get(v, v) for k, v in ids.items()},
    }
    if "tokenizer.ggml.pre" in meta:
        out["pre"] = meta["tokenizer.ggml.pre"]
    if scores is not None:
        out["scores"] = [float(scores[i]) for i in keep]
    merges = meta.get("tokenizer.ggml.merges")
    if merges is not None:
        kept = set(out["tokens"])
        pairs = [(m, *m.split(" ", 1)) for m in merges]
        out["merges"] = [m for m, a, b in pairs if a in kept and b in kept and a + b in kept]
    for key in ("add_bos_token", "add_eos_token", "add_space_prefix"):
        if f"tokenizer.ggml.{key}" in meta:
            out[key] = bool(meta[f"tokenizer.ggml.{key}"])
    return out


def _weights(family: Family, shape: Shape = TINY, n_vocab: int = N_VOCAB, dtype: type = np.float32,
             ) -> dict[str, np.ndarray]:
    """The family's tensors in NumPy order ([out, in]), seeded by its name; matrices in ``dtype``."""
    rng = np.random.default_rng([SEED, *family.name.encode()])
    x = family.extra
    gemma = x.get("gemma")
    n_embd, n_head, n_head_kv, head_dim, n_ff = shape.n_embd, shape.n_head, shape.n_head_kv, shape.head_dim, shape.n_ff

    def mat(n_out: int, n_in: int) -> np.ndarray:
        m = rng.standard_normal((n_out, n_in), dtype=np.float32)
        m *= np.float32(1.0 / np.sqrt(n_in))
        return m.astype(dtype, copy=False)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    qd, kd = n_head * head_dim, n_head_kv * head_dim
    embd = rng.standard_normal((n_vocab, n_embd), dtype=np.float32)
    embd *= np.float32(0.06 if gemma else 1.0)
    t = {"token_embd.weight": embd.astype(dtype, copy=False), "output_norm.weight": norm(n_embd)}
    if not family.tied:
        t["output.weight"] = (mat(n_vocab, n_embd) * 4.0).astype(dtype, copy=False)
    if x.get("rope_freqs"):  # Llama 3.1's factors: 1 for high frequencies, up to 8 for low ones
        t["rope_freqs.weight"] = np.linspace(1.0, 8.0, head_dim // 2).astype(np.float32)
    if x.get("rope_factors"):
        t["rope_factors_short.weight"] = (1.0 + rng.random(head_dim // 2)).astype(np.float32)
        t["rope_factors_long.weight"] = (1.0 + 4 * rng.random(head_dim // 2)).astype(np.float32)
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = norm(n_embd)
        if x.get("fused"):
            t[p + "attn_qkv.weight"] = mat(qd + 2 * kd, n_embd)
        else:
            t[p + "attn_q.weight"], t[p + "attn_k.weight"] = mat(qd, n_embd), mat(kd, n_embd)
            t[p + "attn_v.weight"] = mat(kd, n_embd)
        if x.get("bias"):
            for name, n in (("q", qd), ("k", kd), ("v", kd)):
                t[p + f"attn_{name}.bias"] = (0.5 * rng.standard_normal(n)).astype(np.float32)
        if x.get("qk_norm"):
            t[p + "attn_q_norm.weight"], t[p + "attn_k_norm.weight"] = norm(head_dim), norm(head_dim)
        t[p + "attn_output.weight"] = mat(n_embd, qd)
        if gemma:
            t[p + "post_attention_norm.weight"] = norm(n_embd)
            t[p + "post_ffw_norm.weight"] = norm(n_embd)
        t[p + "ffn_norm.weight"] = norm(n_embd)
        if x.get("fused"):
            t[p + "ffn_up.weight"] = mat(2 * n_ff, n_embd)
        else:
            t[p + "ffn_gate.weight"], t[p + "ffn_up.weight"] = mat(n_ff, n_embd), mat(n_ff, n_embd)
        t[p + "ffn_down.weight"] = mat(n_embd, n_ff)
    return t


def write_f16(family: Family, path: Path) -> str:
    """Write the family's F16 GGUF (norms, biases and rope factors F32, as llama.cpp's converter keeps them);
    returns its SHA-256."""
    tensors = {k: v if v.ndim == 1 else v.astype(np.float16) for k, v in _weights(family).items()}
    return write_gguf(family, path, tensors)


def write_gguf(family: Family, path: Path, tensors: dict[str, np.ndarray], shape: Shape = TINY,
               context_length: int = 4096) -> str:
    """Write a GGUF of the family's metadata and ``tensors`` (F32 or F16 arrays); returns its SHA-256."""
    import gguf

    x = family.extra
    v = small_vocab(family.vocab, shape.n_vocab)
    w = gguf.GGUFWriter(str(path), family.arch)
    w.add_name(f"samplechain-fixture-{family.name}")
    w.add_block_count(shape.n_layer)
    w.add_context_length(context_length)
    w.add_embedding_length(shape.n_embd)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(float(x.get("rope_base", 10000.0)))
    w.add_layer_norm_rms_eps(1e-6 if x.get("gemma") else 1e-5)
    w.add_file_type(1 if any(t.dtype == np.float16 for t in tensors.values()) else 0)  # MOSTLY_F16 / ALL_F32
    if x.get("rope_factors"):
        w.add_rope_scaling_attn_factors(1.19)
        w.add_rope_scaling_orig_ctx_len(4096)
    if x.get("gemma"):
        w.add_sliding_window(int(x["window"]))
        w.add_sliding_window_pattern(2)  # one sliding layer, one global: both kinds in two layers
        if x["gemma"] == 2:
            w.add_attn_logit_softcapping(50.0)
            w.add_final_logit_softcapping(30.0)
        else:
            w.add_rope_freq_base_swa(10000.0)
    w.add_tokenizer_model(v["tokenizer.ggml.model"])
    if "pre" in v:
        w.add_tokenizer_pre(v["pre"])
    w.add_token_list(v["tokens"])
    w.add_token_types(v["types"])
    if "scores" in v:
        w.add_token_scores(v["scores"])
    if "merges" in v:
        w.add_token_merges(v["merges"])
    setters = {"bos_token_id": w.add_bos_token_id, "eos_token_id": w.add_eos_token_id,
               "eot_token_id": w.add_eot_token_id, "eom_token_id": w.add_eom_token_id,
               "unknown_token_id": w.add_unk_token_id, "padding_token_id": w.add_pad_token_id}
    for key, value in v["ids"].items():
        setters[key](value)
    for key, setter in (("add_bos_token", w.add_add_bos_token), ("add_eos_token", w.add_add_eos_token),
                        ("add_space_prefix", w.add_add_space_prefix)):
        if key in v:
            setter(v[key])
    for name, value in tensors.items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def dequantized(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF as float32, in file order."""
    from samplechain.gguf import GGUFFile

    g = GGUFFile(path)
    return {name: g.dequantize(name) for name in g.tensors}


def tokens_for(family: Family) -> np.ndarray:
    """The evaluated sequence: seeded random ids, BOS first where the family has one."""
    rng = np.random.default_rng([SEED, 1, *family.name.encode()])
    ids = rng.integers(0, N_VOCAB, N_TOKENS)
    bos = small_vocab(family.vocab)["ids"].get("bos_token_id")
    if bos is not None:
        ids[0] = bos
    return ids.astype(np.int64)


def files(family: Family) -> dict[str, Path]:
    """The stored quantized files of a family by type name."""
    return {t: FIXTURES / f"{family.name}-{t}.gguf" for t in QUANT_TYPES}


def reference(family: Family) -> dict:
    """llama.cpp's stored results for a family: tokens, f16_sha256, and logits per type."""
    data = np.load(FIXTURES / f"{family.name}.npz")
    out = {"tokens": data["tokens"], "f16_sha256": str(data["f16_sha256"])}
    out["logits"] = {k[len("logits_"):]: data[k] for k in data.files if k.startswith("logits_")}
    return out


def _llama_logits(path: Path, tokens: np.ndarray) -> np.ndarray:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_batch=64, n_ubatch=64, logits_all=True, n_threads=2,
                          verbose=False)
    llm.eval(tokens.tolist())
    out = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    llm.close()
    return out


def _quantize(src: Path, dst: Path, ftype: int) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 2
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {src} to ftype {ftype}")


def generate(names: list[str] | None = None) -> None:
    import tempfile

    FIXTURES.mkdir(parents=True, exist_ok=True)
    summary = {}
    for family in FAMILIES:
        if names and family.name not in names:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            f16 = Path(tmp) / f"{family.name}-F16.gguf"
            sha = write_f16(family, f16)
            tokens = tokens_for(family)
            logits = {"F16": _llama_logits(f16, tokens)}
            for qname, ftype in QUANT_TYPES.items():
                dst = files(family)[qname]
                _quantize(f16, dst, ftype)
                logits[qname] = _llama_logits(dst, tokens)
                # the same weights dequantized, as F32: llama.cpp's float path, without 8-bit activations
                exact = Path(tmp) / f"{family.name}-{qname}-F32.gguf"
                write_gguf(family, exact, dequantized(dst))
                logits[f"{qname}_F32"] = _llama_logits(exact, tokens)
        np.savez_compressed(FIXTURES / f"{family.name}.npz", tokens=tokens, f16_sha256=np.array(sha),
                            **{f"logits_{k}": v for k, v in logits.items()})
        summary[family.name] = {k: float(v.max() - v.min()) for k, v in logits.items()}
        print(f"{family.name}: {json.dumps(summary[family.name])}", file=sys.stderr)


if __name__ == "__main__":
    generate(sys.argv[1:] or None)
