"""Compiled code built on the user's machine: where it lives, and the sampler chain's fused step.

Two libraries are compiled with the machine's C compiler on first use, for the machine they run on (never
downloaded), into :func:`cache_dir`, named by their source's hash and the CPU (:func:`machine_id`):

- ``csrc/sampling.c`` (here): the CPU chain's fused step as one CPython call (:func:`sampling`). It is a fast path
  only: every result is bitwise the NumPy step's (tests/test_native_sampling.py), and without a compiler or
  Python's headers, or with ``SAMPLECHAIN_NATIVE=0``, the chain runs on NumPy alone.
- ``runtime/csrc/engine.c``: the CPU forward (``samplechain.runtime.cpu_engine``), built with :func:`compile_c`.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from importlib import resources
from types import ModuleType


class BuildError(RuntimeError):
    """A C library cannot be built here (no compiler, no headers, unsupported platform, a compiler error)."""


def cache_dir() -> str:
    """Where samplechain keeps per-machine files: ``$SAMPLECHAIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/samplechain``
    (``~/.cache/samplechain``); a temporary folder where that cannot be written."""
    explicit = os.environ.get("SAMPLECHAIN_CACHE_DIR")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = explicit or os.path.join(base, "samplechain")
    try:
        os.makedirs(folder, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder
    except OSError:
        pass
    fallback = os.path.join(tempfile.gettempdir(), f"samplechain-{os.getuid() if hasattr(os, 'getuid') else 0}")
    os.makedirs(fallback, exist_ok=True)
    return fallback


def machine_id() -> str:
    """The CPU this process runs on (model name and feature flags), for per-machine caches."""
    text = platform.machine() + platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    text += line
                if line.strip() == "":
                    break
    except OSError:
        pass
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def compile_c(source: bytes, path: str, flags: list[str], what: str) -> str:
    """Compile C ``source`` into the shared library ``path`` (once: an existing file is reused), saying so on
    stderr. Concurrent builders each write their own temporary file and rename it into place."""
    if os.path.exists(path):
        return path
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None or sys.platform == "win32":
        raise BuildError(f"no C compiler (cc/gcc) to build {what}")
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    print(f"compiling {what} for this machine (once) ...", file=sys.stderr, flush=True)
    fd, src = tempfile.mkstemp(suffix=".c", dir=folder)
    with os.fdopen(fd, "wb") as f:
        f.write(source)
    tmp = src[:-2] + ".so"
    try:
        proc = subprocess.run([cc, *flags, "-o", tmp, src, "-lm"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"building {what} failed: {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, path)
    finally:
        for leftover in (src, tmp):
            if os.path.exists(leftover):
                os.remove(leftover)
    return path


# -ffp-contract=off and no fast-math: the binary32/binary64 operations are the ones written, in their order
SAMPLING_CFLAGS = ["-O2", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared"]
_UNSET = object()
_sampling: object = _UNSET
_lock = threading.Lock()


def sampling() -> ModuleType | None:
    """The compiled fused step (``csrc/sampling.c``), built on first call; None where it cannot be built or
    ``SAMPLECHAIN_NATIVE=0`` (the chain then runs on NumPy alone, with the same results)."""
    global _sampling
    mod = _sampling
    if mod is _UNSET:
        with _lock:
            if _sampling is _UNSET:
                _sampling = _load_sampling()
            mod = _sampling
    return mod  # type: ignore[return-value]


def _load_sampling() -> ModuleType | None:
    if os.environ.get("SAMPLECHAIN_NATIVE", "1") == "0":
        return None
    include = sysconfig.get_paths().get("include")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    if not include or not os.path.exists(os.path.join(include, "Python.h")):
        return None  # Python's headers are not installed (e.g. a distribution's python without python3-dev)
    import numpy as np

    source = resources.files("samplechain").joinpath("csrc/sampling.c").read_bytes()
    flags = [*SAMPLING_CFLAGS, f"-I{include}", f"-I{np.get_include()}"]  # NumPy's C structure: a built ABI
    key = hashlib.sha256(source + " ".join(flags).encode() + suffix.encode() + np.__version__.encode()
                         ).hexdigest()[:16]
    path = os.path.join(cache_dir(), "kernels", f"sampling-{key}-{machine_id()}{suffix}")
    try:
        compile_c(source, path, flags, "the sampler chain's fused step")
        spec = importlib.util.spec_from_file_location("samplechain._csampling", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (BuildError, ImportError, OSError) as e:
        print(f"samplechain: the sampler chain runs on NumPy only ({e})", file=sys.stderr)
        return None
    return module


def set_sampling(module: ModuleType | None) -> ModuleType | None:
    """Use ``module`` as the compiled step (None: NumPy only); returns the previous one. For tests and benchmarks
    comparing the two paths: chains find it when a sampler's parameter next changes (``samplers.base.changes``),
    so build the chains to compare after the switch."""
    global _sampling
    previous = sampling()
    _sampling = module
    return previous
