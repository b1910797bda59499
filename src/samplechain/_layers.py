"""The package's layers: each top-level module or package of ``samplechain`` is one layer, and a layer imports only
layers below its own.

``LAYERS`` maps every layer to the layers it uses directly; a layer may import any layer below it, that is, anything
reachable through these sets. ``_numeric`` (the binary32 arithmetic of the NumPy layers) is below all of them and may
be imported from anywhere. docs/architecture.md explains what each layer holds and why the rule exists, and shows
this table; tests/test_layers.py checks every module's imports against it, and that the page's table is this one.

Nothing imports this module at run time: it is data for the tests and the documentation.
"""

LAYERS: dict[str, frozenset[str]] = {
    # the bottom: no samplechain imports but _numeric
    "_layers": frozenset(),
    "_numeric": frozenset(),
    "_native": frozenset(),
    "candidates": frozenset(),
    "rng": frozenset(),
    "rows": frozenset(),
    "gguf": frozenset(),
    "tokenizer": frozenset(),
    "validate": frozenset(),
    "options": frozenset(),
    # token texts; the samplers read them (dry, infill)
    "vocab": frozenset({"gguf", "tokenizer"}),
    "samplers": frozenset({"candidates", "rows", "rng", "vocab", "validate"}),
    "chain": frozenset({"samplers", "candidates", "_native"}),
    "grammar": frozenset({"vocab", "candidates", "samplers"}),
    "param_specs": frozenset({"samplers"}),
    "device": frozenset({"samplers", "rows", "candidates", "chain", "rng"}),
    "params": frozenset({"chain", "grammar", "param_specs"}),
    "chat": frozenset({"vocab", "grammar", "params"}),
    "runtime": frozenset({"device", "params", "gguf", "chat", "options"}),
    "speculative": frozenset({"runtime"}),
    "trace": frozenset({"params", "runtime"}),
    "server": frozenset({"runtime", "speculative", "trace", "chat"}),
    "integrations": frozenset({"device", "params", "server"}),
    "cli": frozenset({"server", "integrations"}),
}
