"""DESIGN.md's layers: no module imports a layer above its own, and torch stays out of the NumPy layers."""

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "samplechain"

# layer of each module or package (DESIGN.md's table); a module may import only layers it depends on
# (_numeric, the binary32 arithmetic of the NumPy layers, is below all of them; dry and infill read token texts)
LAYERS = {
    "_numeric": set(), "candidates": set(), "rng": set(),
    "rows": set(),
    "samplers": {"candidates", "rows", "rng", "vocab"},
    "chain": {"samplers", "candidates"},
    "device": {"samplers", "rows", "candidates", "chain", "rng"},
}
TORCH_FREE = ("candidates", "_numeric", "rng", "chain")  # torch is imported lazily or not at all there


def imports(path: pathlib.Path) -> list[tuple[str, bool]]:
    """(samplechain submodule, imported at module level) for every import in ``path``."""
    tree = ast.parse(path.read_text())
    top = set(map(id, tree.body))
    out = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            out.append((name, id(node) in top))
    return out


def layer_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "samplechain" and len(parts) > 1 else None


@pytest.mark.parametrize("layer", list(LAYERS))
def test_no_module_imports_a_layer_above_it(layer):
    paths = sorted((SRC / layer).rglob("*.py")) if (SRC / layer).is_dir() else [SRC / f"{layer}.py"]
    assert paths and all(p.exists() for p in paths)
    for path in paths:
        for name, _ in imports(path):
            used = layer_of(name)
            if used not in (None, layer, "_numeric"):
                assert used in LAYERS[layer], f"{path.relative_to(SRC)} imports {name}"


@pytest.mark.parametrize("layer", ["samplers", *TORCH_FREE])
def test_torch_is_imported_lazily_below_rows(layer):
    paths = sorted((SRC / layer).rglob("*.py")) if (SRC / layer).is_dir() else [SRC / f"{layer}.py"]
    for path in paths:
        for name, module_level in imports(path):
            assert not (module_level and (name == "torch" or name.startswith("torch.") or name == "samplechain.rows"
                                          )), f"{path.relative_to(SRC)} imports {name} at module level"


def test_the_device_layer_knows_no_policy():
    assert not (SRC / "device" / "rows.py").exists()  # the row layout lives in samplechain/rows.py
    for path in (SRC / "device").rglob("*.py"):
        assert "CommonSampler" not in {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
