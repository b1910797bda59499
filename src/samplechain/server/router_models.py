"""Router mode's model list: where the models come from and how each one's ``serve`` child is started.

Three sources, as llama-server's router reads them (``tools/server/server-models.cpp: server_models::load_models``,
``common/preset.cpp``):

1. the Hugging Face cache: every GGUF model downloaded with ``-hf``, named ``USER/REPO:QUANT``
   (``samplechain.runtime.hub_cache.cached_models``);
2. ``--models-dir DIR``: each ``NAME.gguf`` in it is the model ``NAME``; each subfolder is a model named after it
   (its first shard ``*-00001-of-*.gguf``, else its GGUF; ``mmproj*`` files are skipped);
3. ``--models-preset FILE``: llama.cpp's INI presets. A section names a model (one of the above, whose options it
   adds to, or a new one with ``model = PATH`` or ``hf-repo = USER/REPO[:QUANT]``); ``[*]`` holds options for
   every model. Keys are ``serve``'s flags without their dashes (``c = 4096``, ``ctx-size = 4096``), or llama.cpp's
   environment names (``LLAMA_ARG_CTX_SIZE``). Preset-only keys: ``load-on-startup``, ``stop-timeout`` (seconds
   between SIGTERM and SIGKILL on unload, default 10) and ``dedup-cache-models`` (hide the cache entry a preset's
   ``hf-repo`` already names).

A later source wins on a name (a folder's model over the cache's); a preset section adds to it. Options apply in the
order ``[*]``, the model's section, then the router's own command line (the highest priority).
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Callable
from dataclasses import dataclass, field

PRESET_ONLY = ("load-on-startup", "stop-timeout", "dedup-cache-models")
MODEL_KEYS = ("model", "m")
REPO_KEYS = ("hf-repo", "hf", "hfr")
DRAFT_REPO_KEYS = ("hf-repo-draft", "hfd", "hfrd", "spec-draft-hf")
TRUE = ("1", "true", "on", "yes", "enabled")


@dataclass
class ModelSpec:
    """One model the router can run: its name, where it came from, and its options (INI keys and values)."""

    name: str
    source: str  # "cache", "models_dir" or "preset"
    options: dict[str, str] = field(default_factory=dict)
    path: str | None = None  # a local file, when known without downloading
    hidden: bool = False  # a cache entry a preset names with dedup-cache-models

    @property
    def load_on_startup(self) -> bool:
        return self.options.get("load-on-startup", "").strip().lower() in TRUE

    @property
    def stop_timeout(self) -> float:
        value = self.options.get("stop-timeout", "10")
        try:
            return max(0.0, float(value))
        except ValueError:
            raise ValueError(f"preset {self.name!r}: stop-timeout must be a number of seconds, got {value!r}") from None

    def ini(self) -> str:
        """The model's options as an INI section (``/models``' ``status.preset``)."""
        lines = [f"[{self.name}]", *(f"{k} = {v}" for k, v in self.options.items())]
        return "\n".join(lines) + "\n"

    def same_as(self, other: ModelSpec) -> bool:
        return (self.source, self.options, self.path) == (other.source, other.options, other.path)


def canonical_key(key: str) -> str:
    """An INI key as a flag name: ``LLAMA_ARG_CTX_SIZE`` -> ``ctx-size``; ``--c`` -> ``c``."""
    key = key.strip()
    if key.startswith("LLAMA_ARG_"):
        return key[len("LLAMA_ARG_"):].lower().replace("_", "-")
    return key.lstrip("-")


def read_preset(path: str, allowed: frozenset[str] | None = None) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """A preset file: (``[*]``'s options, {section: options}). ValueError names the file and the problem.
    ``allowed``: the only keys it may use (a preset from a hub repo), else any."""
    parser = configparser.ConfigParser(interpolation=None, strict=False, default_section="\x00none",
                                       comment_prefixes=(";", "#"), inline_comment_prefixes=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case (LLAMA_ARG_...)
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_string("[\x00top]\n" + f.read(), source=path)  # keys before any section (version = 1)
    except OSError as e:
        raise ValueError(f"--models-preset: cannot read {path}: {e.strerror}") from None
    except configparser.Error as e:
        raise ValueError(f"--models-preset: {path}: {e.message.splitlines()[0]}") from None
    common: dict[str, str] = {}
    sections: dict[str, dict[str, str]] = {}
    for name in parser.sections():
        options = {canonical_key(k): v.strip() for k, v in parser.items(name) if k != "version"}
        for key in options:
            if allowed is not None and key not in allowed:
                raise ValueError(f"--models-preset: {path}: option '{key}' is not allowed in remote presets")
        if name == "\x00top":
            common.update(options)
        elif name == "*":
            common.update(options)
        else:
            sections[_canonical_name(name.strip())] = options
    return common, sections


def _canonical_name(name: str) -> str:
    """``user/repo:q4_k_m`` -> ``user/repo:Q4_K_M`` (llama.cpp's ``canonical_tag``: quant tags are upper case)."""
    repo, colon, tag = name.rpartition(":")
    return f"{repo}:{tag.upper()}" if colon and "/" in repo else name


def scan_models_dir(folder: str) -> dict[str, ModelSpec]:
    """``--models-dir``'s models (see the module): ValueError when it is not a folder."""
    if not os.path.isdir(folder):
        raise ValueError(f"--models-dir: {folder!r} does not exist or is not a directory")
    out: dict[str, ModelSpec] = {}
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.is_dir():
            files = sorted(f for f in os.listdir(entry.path) if f.endswith(".gguf") and "mmproj" not in f)
            shards = [f for f in files if "-00001-of-" in f]
            whole = [f for f in files if "-of-" not in f]
            chosen = shards[0] if shards else (whole[0] if whole else None)
            if chosen is not None:
                path = os.path.join(entry.path, chosen)
                out[entry.name] = ModelSpec(entry.name, "models_dir", {"model": path}, path)
        elif entry.name.endswith(".gguf") and "mmproj" not in entry.name:
            name = entry.name[:-len(".gguf")]
            out[name] = ModelSpec(name, "models_dir", {"model": entry.path}, entry.path)
    return out


def cached_specs(cached: Callable[[], list]) -> dict[str, ModelSpec]:
    """The hub cache's models (``cached``: ``hub_cache.cached_models``), each run from its local file."""
    return {m.id: ModelSpec(m.id, "cache", {"model": m.path}, m.path) for m in cached()}


def load_specs(models_dir: str | None, models_preset: str | None, cached: Callable[[], list] | None,
               resolve: Callable[[str], str | None] = lambda repo: None,
               allowed: frozenset[str] | None = None) -> dict[str, ModelSpec]:
    """Every model the router offers, by name (see the module for the order of the sources). ``cached``: the hub
    cache's models; ``resolve``: ``USER/REPO[:QUANT]`` -> the cached file it names, or None (for
    ``dedup-cache-models``); ``allowed``: the keys the preset may use (``read_preset``)."""
    specs: dict[str, ModelSpec] = dict(cached_specs(cached)) if cached is not None else {}
    if models_dir:
        specs.update(scan_models_dir(models_dir))
    if not models_preset:
        return specs
    common, sections = read_preset(models_preset, allowed)
    for spec in specs.values():
        spec.options = {**common, **spec.options}
    dedup: set[str] = set()  # files a preset with dedup-cache-models names
    for name, options in sections.items():
        base = specs.get(name)
        if base is None and not any(k in options for k in (*MODEL_KEYS, *REPO_KEYS)):
            raise ValueError(f"--models-preset: [{name}] is no known model and names none (model = PATH or "
                             f"hf-repo = USER/REPO[:QUANT])")
        merged = {**common, **(base.options if base is not None else {}), **options}
        if any(k in options for k in (*MODEL_KEYS, *REPO_KEYS)) and base is not None:  # the section's own source
            for k in (*MODEL_KEYS, *REPO_KEYS):
                if k not in options:
                    merged.pop(k, None)
        path = next((merged[k] for k in MODEL_KEYS if k in merged), None)
        specs[name] = ModelSpec(name, "preset", merged, path)
        if merged.get("dedup-cache-models", "").strip().lower() in TRUE:
            dedup.update(p for k in (*REPO_KEYS, *DRAFT_REPO_KEYS) if k in merged
                         for p in [resolve(merged[k])] if p is not None)
    for spec in specs.values():
        if spec.source == "cache" and spec.path is not None and os.path.realpath(spec.path) in {
                os.path.realpath(p) for p in dedup}:
            spec.hidden = True
    return specs


def child_options(spec: ModelSpec) -> list[tuple[str, str]]:
    """The model's options as ``serve`` flags are given to its child: (key, value), preset-only keys removed,
    the model's source first."""
    source = [(k, v) for k, v in spec.options.items() if k in (*MODEL_KEYS, *REPO_KEYS)]
    rest = [(k, v) for k, v in spec.options.items() if k not in (*MODEL_KEYS, *REPO_KEYS, *PRESET_ONLY)]
    return source[-1:] + rest
