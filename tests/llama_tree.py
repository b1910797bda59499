"""llama.cpp's own source tree, as shipped in llama-cpp-python's source distribution: its vocab-only GGUFs with
test cases (``models/ggml-vocab-*.gguf`` + ``.inp``/``.out``), its real chat templates (``models/templates``) and
llama-server's own test suite (``tools/server/tests``).

``llama_cpp_tree()`` returns ``vendor/llama.cpp``: from ``$SAMPLECHAIN_LLAMA_CPP_TREE``, else from the cache
(``<cache dir>/llama-cpp-python-<version>``), else downloaded once from the package registry with ``pip download``
(the source archive, ~75 MB) and unpacked there. ``python -m tests.llama_tree`` fetches it ahead of the tests
(``make test`` does).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"  # the llama-cpp-python release our oracle (the bench extra) pins
# the parts of the archive the tests read: vocab GGUFs and templates; llama-server's test suite and the image it reads
# (benchmarks/llama_server_suite.py)
KEEP = ("vendor/llama.cpp/models/", "vendor/llama.cpp/tools/server/tests/", "vendor/llama.cpp/tools/mtmd/test-1.jpeg")
MARK = "\n".join((VERSION, *KEEP))  # a cache unpacked with other parts is unpacked again


def _cache_root() -> Path:
    from samplechain.runtime.cpu_engine import cache_dir

    return Path(cache_dir()) / f"llama-cpp-python-{VERSION}"


def llama_cpp_tree() -> Path:
    explicit = os.environ.get("SAMPLECHAIN_LLAMA_CPP_TREE")
    if explicit:
        return Path(explicit)
    root = _cache_root()
    tree = root / "vendor" / "llama.cpp"
    done = root / ".complete"
    if done.exists() and done.read_text() == MARK:
        return tree
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={VERSION}", "-d", tmp], check=True)
        archive = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        staging = Path(tmp) / "unpacked"
        with tarfile.open(archive) as tar:
            prefix = f"llama_cpp_python-{VERSION}/"
            members = []
            for m in tar.getmembers():
                rel = m.name[len(prefix):] if m.name.startswith(prefix) else None
                if rel and rel.startswith(KEEP) and (m.isfile() or m.isdir()):
                    m.name = rel
                    members.append(m)
            tar.extractall(staging, members=members, filter="data")
        if root.exists():
            shutil.rmtree(root)
        root.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), str(root))
    done.write_text(MARK)
    return tree


def vocab_file(name: str) -> Path:
    """``models/ggml-vocab-<name>.gguf`` of llama.cpp's tree."""
    return llama_cpp_tree() / "models" / f"ggml-vocab-{name}.gguf"


def template_file(name: str) -> Path:
    """``models/templates/<name>.jinja`` of llama.cpp's tree."""
    return llama_cpp_tree() / "models" / "templates" / f"{name}.jinja"


if __name__ == "__main__":
    print(llama_cpp_tree())
