"""Every fenced Python block of the README runs as written (each a complete program), and every command of its
shell blocks names files that exist."""

import os
import re
import shlex
from itertools import pairwise
from pathlib import Path

import pytest

from samplechain.runtime.generation import MODEL_PACKAGES

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.S | re.M)
SHELL = re.findall(r"^```sh\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.S | re.M)
READS = {"-f", "--file", "--grammar-file", "-jf", "--json-schema-file", "-lcs", "--lookup-cache-static",
         "--api-key-file"}  # flags whose value is a file the command reads
MODELS = {"-m", "--model", "-md", "--model-draft"}  # a GGUF file or a packaged model's name


def test_the_readme_has_python_examples():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # examples may write files (state.bin)
    code = compile(BLOCKS[index], f"README.md python block {index + 1}", "exec")
    exec(code, {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert out.strip(), "an example prints what it shows"
    assert os.getcwd() == str(tmp_path)


def test_the_readmes_commands_name_files_that_exist():
    targets = set(re.findall(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), flags=re.M)[0].split())
    assert len(SHELL) >= 5
    for block in SHELL:
        words = shlex.split(block, comments=True)
        written = {w for prev, w in pairwise(words) if prev == ">"}  # files the block itself writes first
        for prev, word in pairwise(words):
            if prev in READS:
                assert word in written or (ROOT / word).is_file(), f"README: {prev} {word}: no such file"
            elif prev in MODELS:
                assert word in MODEL_PACKAGES or (ROOT / word).is_file(), f"README: {prev} {word}: no such model"
            elif prev == "make":
                assert word in targets, f"README: make {word}: no such target"
