"""DESIGN.md's layers: no module imports a layer above its own, and torch stays out of the NumPy layers."""

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "samplechain"

# layer of each module or package (DESIGN.md's table) and the layers it uses directly; a module may import any layer
# below its own (the closure of these sets). _numeric, the binary32 arithmetic of the NumPy layers, is below all of
# them; samplers read token texts (dry, infill) through vocab.
LAYERS = {
    "_numeric": set(), "candidates": set(), "rng": set(), "rows": set(), "gguf": set(), "tokenizer": set(),
    "samplers": {"candidates", "rows", "rng", "vocab"},
    "chain": {"samplers", "candidates"},
    "device": {"samplers", "rows", "candidates", "chain", "rng"},
    "vocab": {"gguf", "tokenizer"},
    "grammar": {"vocab", "candidates", "samplers"},
    "param_specs": {"samplers"},
    "params": {"chain", "grammar", "param_specs"},
    "chat": {"vocab", "grammar", "params"},
    "runtime": {"device", "params", "gguf", "chat"},
    "speculative": {"runtime"},
    "trace": {"params", "runtime"},
    "integrations": {"device", "params", "server"},
    "server": {"runtime", "speculative", "trace", "chat"},
    "cli": {"server", "integrations"},
}


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
