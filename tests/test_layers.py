"""The layers (docs/architecture.md): no module imports a layer above its own, and torch stays out of the NumPy
layers."""

import ast
import pathlib
import re

import pytest

from samplechain._layers import LAYERS

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "samplechain"
DOC = SRC.parents[1] / "docs" / "architecture.md"


def below(layer: str) -> set[str]:
    """Every layer ``layer`` may import: what it uses, and what those use, down to the bottom."""
    seen: set[str] = set()
    todo = list(LAYERS[layer])
    while todo:
        used = todo.pop()
        if used not in seen:
            seen.add(used)
            todo += LAYERS[used]
    return seen


TORCH_FREE = ("candidates", "_numeric", "rng", "chain", "chat")  # torch is imported lazily or not at all there


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
                assert used in below(layer), f"{path.relative_to(SRC)} imports {name}"


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


def test_every_module_has_a_layer():
    top = {p.stem for p in SRC.glob("*.py")} | {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    assert top - {"__init__", "__main__"} == set(LAYERS)


def test_the_layers_have_no_circle():
    for layer in LAYERS:
        assert layer not in below(layer)


def module_graph() -> dict[str, set[str]]:
    """Every samplechain module and the samplechain modules it imports (anywhere: at the top, in a function, or
    for type checking only), relative imports resolved."""
    names = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, base]).strip(".")
                out.update(f"{base}.{a.name}" if f"{base}.{a.name}" in names else base for a in node.names)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
        graph[name] = {m for m in out if m in names and m != name}
    return graph


def test_no_import_circle_between_modules():
    """No two modules import each other, directly or around a circle (type-checking imports count: a circle
    there is one the code works around)."""
    graph = module_graph()
    assert "samplechain.runtime.decoding" in graph["samplechain.runtime.generation"]
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for used in sorted(graph[module]):
            assert state.get(used) != 1, "import circle: " + " -> ".join([*path[path.index(used):], used])
            if used not in state:
                visit(used, [*path, used])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def doc_table() -> dict[str, set[str]]:
    """The layer table of docs/architecture.md: each row's layer and the layers in its "uses directly" column."""
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("<!-- layers -->"):text.index("<!-- /layers -->")]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = set(re.findall(r"`([a-z_]+)`", cells[1]))
    return rows


def test_the_architecture_page_shows_this_table():
    assert doc_table() == {layer: set(used) for layer, used in LAYERS.items()}
