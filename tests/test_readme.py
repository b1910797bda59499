"""The README's and docs/'s examples still work, and their links lead somewhere.

- Every ```python block of README.md and docs/*.md runs as written (each a complete program that prints what it
  shows). A block that appears verbatim on several pages (the README's examples are copies of the docs') runs once.
- ```py blocks are Python that cannot run here (they download a model, start a Ray cluster, ...): they are compiled,
  not run. docs/vllm.md's ```python block needs vLLM: tests_vllm/test_docs.py runs it in .venv-vllm.
- Every command of a ```sh block names files, make targets and models that exist.
- Every fence's language is one of the above, or ```text / ```ini / a bare ``` for output, configuration and
  diagrams shown as is (so that a misspelt ```pyhton is not skipped in silence).
- Every relative link points to a file that exists, and its #anchor to a heading of that file.
"""

import os
import re
import shlex
from itertools import pairwise
from pathlib import Path

import pytest

from samplechain.runtime.generation import MODEL_PACKAGES

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = {"python", "py", "sh", "text", "ini", ""}
ELSEWHERE = {"docs/vllm.md": ROOT / "tests_vllm" / "test_docs.py"}  # pages whose ```python blocks another suite runs
READS = {"-f", "--file", "--grammar-file", "-jf", "--json-schema-file", "-lcs", "--lookup-cache-static",
         "--api-key-file"}  # flags whose value is a file the command reads
MODELS = {"-m", "--model", "-md", "--model-draft"}  # a GGUF file or a packaged model's name


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def blocks(page: Path) -> list[tuple[str, int, str]]:
    """The fenced blocks of a page: (language, line of the opening fence, code)."""
    found, lang, start, code = [], None, 0, []
    for number, line in enumerate(page.read_text(encoding="utf-8").split("\n"), 1):
        if not line.startswith("```"):
            if lang is not None:
                code.append(line)
        elif lang is None:
            lang, start, code = line[3:].strip(), number, []
        else:
            assert line == "```", f"{name(page)}:{number}: a closing fence is three backticks alone"
            found.append((lang, start, "\n".join(code) + "\n"))
            lang = None
    assert lang is None, f"{name(page)}:{start}: a fence is never closed"
    return found


BLOCKS = {page: blocks(page) for page in PAGES}


def _python_cases():
    seen, cases = set(), []
    for page, found in BLOCKS.items():
        for lang, line, code in found:
            if lang != "python" or code in seen:
                continue
            seen.add(code)
            where = f"{name(page)}:{line}"
            other = ELSEWHERE.get(name(page))
            marks = [pytest.mark.skip(reason=f"run by {other.relative_to(ROOT)}")] if other else []
            cases.append(pytest.param(where, code, id=where, marks=marks))
    return cases


PYTHON = _python_cases()
SHELL = [(page, line, code) for page, found in BLOCKS.items() for lang, line, code in found if lang == "sh"]


def test_the_readme_shows_each_face_and_the_docs_go_further():
    readme = [lang for lang, _, _ in BLOCKS[ROOT / "README.md"]]
    assert readme.count("python") >= 3 and readme.count("sh") >= 4
    assert len(PYTHON) >= 8
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 260, "the README is a front page"


@pytest.mark.parametrize(("where", "code"), PYTHON)
def test_python_block_runs(where, code, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # examples may write files (state.bin)
    exec(compile(code, f"{where} (python block)", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert out.strip(), "an example prints what it shows"
    assert os.getcwd() == str(tmp_path)


def test_blocks_that_cannot_run_here_still_compile():
    shown = [(page, line, code) for page, found in BLOCKS.items() for lang, line, code in found if lang == "py"]
    assert shown
    for page, line, code in shown:
        compile(code, f"{name(page)}:{line} (py block)", "exec")


def test_every_fence_language_is_known():
    for page, found in BLOCKS.items():
        for lang, line, _ in found:
            assert lang in LANGUAGES, f"{name(page)}:{line}: fence language {lang!r}, expected one of {LANGUAGES}"


def test_blocks_run_elsewhere_are_run_there():
    for page, test in ELSEWHERE.items():
        assert any(lang == "python" for lang, _, _ in BLOCKS[ROOT / page]), page
        assert Path(page).name in test.read_text(encoding="utf-8"), f"{test} does not read {page}"


def test_commands_name_files_that_exist():
    targets = set(re.findall(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), flags=re.M)[0].split())
    assert len(SHELL) >= 10
    for page, line, block in SHELL:
        where = f"{name(page)}:{line}"
        words = shlex.split(block, comments=True)
        written = {w for prev, w in pairwise(words) if prev == ">"}  # files the block itself writes first
        for prev, word in pairwise(words):
            if prev in READS:
                assert word in written or (ROOT / word).is_file(), f"{where}: {prev} {word}: no such file"
            elif prev in MODELS:
                assert word in MODEL_PACKAGES or (ROOT / word).is_file(), f"{where}: {prev} {word}: no such model"
            elif prev == "make":
                assert word in targets, f"{where}: make {word}: no such target"


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, punctuation dropped, spaces as hyphens)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    found, count = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug if slug not in count else f"{slug}-{count[slug]}")
        count[slug] = count.get(slug, 0) + 1
    return found


def test_relative_links_lead_to_files_and_headings_that_exist():
    checked = 0
    for page in PAGES:
        text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
        text = re.sub(r"`[^`\n]*`", "", text)  # code spans
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            assert file.is_file(), f"{name(page)}: link to {target}: no such file"
            if anchor and file.suffix == ".md":
                assert anchor in anchors(file), f"{name(page)}: link to {target}: no such heading"
            checked += 1
    assert checked >= 40
