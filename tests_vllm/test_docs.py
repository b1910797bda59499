"""docs/vllm.md's Python example runs as written (in a process of its own: vLLM holds one engine per process),
against the tiny model, offline, and prints each answer."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "vllm.md"


def test_the_docs_example_runs(model_dir):
    (block,) = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
    env = {**os.environ, "SAMPLECHAIN_VLLM_MODEL": str(model_dir)}
    done = subprocess.run([sys.executable, "-c", block], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()[-3:]  # (vLLM logs to stdout before them)
    assert all(line[0] in "'\"" for line in lines), lines
    assert lines[2] in ("'yes.'", "'no.'")  # the grammar holds inside vLLM
