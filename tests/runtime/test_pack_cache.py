"""The CPU engine's packed weights cached on disk: a second load maps them instead of packing, with the same bits; a
changed file, a broken cache or the switch turn it off; the folder stays bounded."""

import json
import os
import shutil

import numpy as np
import pytest
import torch
from tests.model_fixtures import FAMILIES, files

from samplechain.gguf import GGUFFile
from samplechain.runtime import Context, cpu_engine, pack_cache
from samplechain.runtime.cpu_engine import CEngine
from samplechain.runtime.model import ModelConfig, Transformer
from samplechain.runtime.weights import WeightLoader

TOKENS = [1, 17, 42, 99, 7, 3, 250, 12]


@pytest.fixture()
def model_file(tmp_path, monkeypatch):
    """A copy of a small fixture model (its own inode and times), caches in tmp_path, every model cached."""
    monkeypatch.setenv("SAMPLECHAIN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SAMPLECHAIN_PACK_CACHE", raising=False)
    monkeypatch.setattr(pack_cache, "MIN_BYTES", 0)
    path = tmp_path / "model.gguf"
    shutil.copy(files(FAMILIES[0])["Q4_K_M"], path)
    return path


def _engine(path) -> Transformer:
    g = GGUFFile(path)
    t = Transformer(ModelConfig.from_gguf(g), WeightLoader(g))
    return t.with_engine(CEngine(t, "generic"), "c-generic")


def _logits(t: Transformer) -> torch.Tensor:
    return Context(t, 64).decode(TOKENS, outputs=[True] * len(TOKENS))


def _count_packs(monkeypatch) -> list:
    packed: list = []
    real = cpu_engine.pack_part
    monkeypatch.setattr(cpu_engine, "pack_part", lambda part, keep: packed.append(part) or real(part, keep))
    return packed


def _entries(tmp_path) -> list[str]:
    where = tmp_path / "cache" / "packed"
    return sorted(p.name for p in where.iterdir()) if where.exists() else []


def test_the_second_load_maps_the_cache_and_gives_the_same_bits(model_file, tmp_path, monkeypatch):
    packed = _count_packs(monkeypatch)
    first = _logits(_engine(model_file))
    n_parts = len(packed)
    assert n_parts > 0
    names = _entries(tmp_path)
    assert len(names) == 2 and names[0].endswith(".bin") and names[1].endswith(".json")
    index = json.loads((tmp_path / "cache" / "packed" / names[1]).read_text())
    assert index["layout"] == pack_cache.LAYOUT and index["sources"] == [pack_cache.identity(str(model_file))]
    second = _engine(model_file)
    assert len(packed) == n_parts  # nothing packed again
    assert torch.equal(_logits(second), first)
    own = second.engine._keep[0]  # the output matrix's arrays: views of the mapped cache
    arrays = [a for a in own if isinstance(a, np.ndarray)]
    assert len(arrays) > 1 and all(isinstance(a, np.memmap) for a in arrays)


def test_a_changed_file_is_packed_again_and_its_old_cache_removed(model_file, tmp_path, monkeypatch):
    packed = _count_packs(monkeypatch)
    first = _logits(_engine(model_file))
    before = _entries(tmp_path)
    n_parts = len(packed)
    st = os.stat(model_file)
    os.utime(model_file, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert torch.equal(_logits(_engine(model_file)), first)
    assert len(packed) == 2 * n_parts
    after = _entries(tmp_path)
    assert len(after) == 2 and after != before  # the stale cache went when the new one was written


def test_a_broken_cache_is_rebuilt(model_file, tmp_path, monkeypatch):
    packed = _count_packs(monkeypatch)
    first = _logits(_engine(model_file))
    n_parts = len(packed)
    data = next((tmp_path / "cache" / "packed").glob("*.bin"))
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size - 64)
    assert torch.equal(_logits(_engine(model_file)), first)
    assert len(packed) == 2 * n_parts
    assert data.stat().st_size % 64 == 0 and pack_cache.read(str(tmp_path / "cache"), data.stem) is not None


def test_switched_off_nothing_is_written_or_read(model_file, tmp_path, monkeypatch):
    monkeypatch.setenv("SAMPLECHAIN_PACK_CACHE", "0")
    packed = _count_packs(monkeypatch)
    _engine(model_file)
    _engine(model_file)
    assert _entries(tmp_path) == [] and len(packed) > 0 and len(packed) % 2 == 0


def test_small_models_are_not_cached(model_file, tmp_path, monkeypatch):
    monkeypatch.setattr(pack_cache, "MIN_BYTES", 1 << 40)
    _engine(model_file)
    assert _entries(tmp_path) == []


def test_the_least_recently_used_cache_makes_room(model_file, tmp_path, monkeypatch):
    _engine(model_file)
    other = tmp_path / "other.gguf"
    shutil.copy(model_file, other)
    (first_index,) = (tmp_path / "cache" / "packed").glob("*.json")
    size = next((tmp_path / "cache" / "packed").glob("*.bin")).stat().st_size
    monkeypatch.setattr(pack_cache, "MAX_BYTES", size + size // 2)  # room for one
    _engine(other)
    indexes = list((tmp_path / "cache" / "packed").glob("*.json"))
    assert len(indexes) == 1 and indexes[0] != first_index
    assert json.loads(indexes[0].read_text())["sources"] == [pack_cache.identity(str(other))]
