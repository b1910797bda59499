"""``/infill``: the prompt as llama-server's ``format_prompt_infill`` builds it, run as a native completion.

SmolLM2's vocabulary has no FIM prefix/suffix/middle tokens (only ``<reponame>``, llama.cpp's FIM_REP by its text),
so the route answers 501 as llama-server does; the layout is tested with three of its special tokens standing in
as FIM tokens (set on the tokenizer, as GGUF's ``tokenizer.ggml.fim_*_token_id`` would).
"""

import pytest
from tests.server.conftest import call

from samplechain.server.infill import format_infill

PRE, SUF, MID, SEP = 6, 7, 8, 5  # <filename>, <gh_stars>, <issue_start>, <file_sep>
REP = 4  # <reponame>: SmolLM2's own FIM_REP
BODY = {"input_prefix": "#include <cstdio>\n\nint main() {\n", "prompt": "    int n_threads = llama_",
        "input_suffix": "}\n"}


@pytest.fixture
def fim(smol, monkeypatch):
    """SmolLM2 with FIM tokens (and no file separator unless a test sets one)."""
    tok = smol.vocab.tokenizer
    assert (tok.fim_pre, tok.fim_suf, tok.fim_mid, tok.fim_rep, tok.fim_sep) == (None, None, None, REP, None)
    for name, value in (("fim_pre", PRE), ("fim_suf", SUF), ("fim_mid", MID)):
        monkeypatch.setattr(tok, name, value)
    return {"fim_pre": PRE, "fim_suf": SUF, "fim_mid": MID, "fim_rep": REP, "fim_sep": None}


def text(smol, s):
    return smol.tokenize(s, add_special=False, parse_special=False)


def test_a_model_without_fim_tokens_answers_501(server):
    r = call(server, "POST", "/infill", BODY)
    assert r.status == 501 and r.json()["error"] == {
        "code": 501, "type": "not_supported_error",
        "message": "Infill is not supported by this model: prefix token is missing. suffix token is missing. "
                   "middle token is missing. "}


def test_layout_with_extra_chunks(smol, fim):
    prompt = text(smol, "    x = ")
    extra = [{"filename": "a.h", "text": "int a;\n"}, {"text": "int b;\n"}]
    got = format_infill(smol, fim, "int main() {\n", "}\n", extra, prompt, n_batch=512, n_predict=-1, n_ctx=1024)
    snippet = text(smol, "\n\n--- snippet ---\n\n")  # no file separator: the chunks' separator text
    extra_tokens = [REP, *text(smol, "myproject\n"), *snippet, *text(smol, "int a;\n"), *snippet,
                    *text(smol, "int b;\n")]
    assert got == [*extra_tokens, PRE, *text(smol, "int main() {\n"), *prompt, SUF, *text(smol, "}\n"), MID]
    # with a file separator: each chunk's file name, then the current file's
    got = format_infill(smol, {**fim, "fim_sep": SEP}, "p", "s", extra, [], n_batch=512, n_predict=-1, n_ctx=1024)
    assert got == [REP, *text(smol, "myproject\n"), SEP, *text(smol, "a.h\n"), *text(smol, "int a;\n"),
                   SEP, *text(smol, "tmp\n"), *text(smol, "int b;\n"), SEP, *text(smol, "filename\n"),
                   PRE, *text(smol, "p"), SUF, *text(smol, "s"), MID]


def test_budgets(smol, fim):
    prefix, suffix = text(smol, "x = 1\n" * 40), text(smol, "y = 2\n" * 40)
    prompt = text(smol, "z")
    got = format_infill(smol, fim, "x = 1\n" * 40, "y = 2\n" * 40, [{"text": "e\n" * 50}], prompt, n_batch=64,
                        n_predict=100, n_ctx=300)
    # the prefix's last 3 * 64/4 tokens, the suffix's first 64/4 - 2 - len(prompt), the extra tokens' last
    # n_ctx - n_batch - 2 * n_predict
    extra = [REP, *text(smol, "myproject\n"), *text(smol, "\n\n--- snippet ---\n\n"), *text(smol, "e\n" * 50)]
    assert len(extra) > 36
    assert got == [*extra[-36:], PRE, *prefix[-48:], *prompt, SUF, *suffix[:16 - 2 - len(prompt)], MID]


def test_infill_is_the_completion_of_its_prompt(server, smol, fim):
    body = {**BODY, "input_extra": [{"filename": "llama.h", "text": "int llama_n_threads();\n"}],
            "n_predict": 8, "temperature": 0}
    r = call(server, "POST", "/infill", body)
    assert r.status == 200
    tokens = format_infill(smol, fim, BODY["input_prefix"], BODY["input_suffix"], body["input_extra"],
                           text(smol, BODY["prompt"]), n_batch=512, n_predict=-1, n_ctx=256)
    plain = call(server, "POST", "/completion", {"prompt": tokens, "n_predict": 8, "temperature": 0}).json()
    assert r.json()["tokens_evaluated"] == len(tokens) == plain["tokens_evaluated"]
    assert r.json()["content"] == plain["content"] and r.json()["tokens_predicted"] == plain["tokens_predicted"]


@pytest.mark.parametrize("change, message", [
    ({"input_extra": [{}]}, 'extra_context chunk must contain a "text" field with a string value'),
    ({"input_extra": [{"filename": "ok"}]}, 'extra_context chunk must contain a "text" field with a string value'),
    ({"input_extra": [{"filename": 123, "text": "abc"}]}, "extra_context chunk's \"filename\" field must be a string"),
    ({"input_extra": [{"filename": 123, "text": 456}]}, 'extra_context chunk must contain a "text" field with a '
                                                          'string value'),
    ({"input_extra": {"text": "abc"}}, '"input_extra" must be an array of {"filename": string, "text": string}'),
    ({"prompt": 5}, '"prompt" must be a string'),
    ({"input_prefix": None}, '"input_prefix" must be a string or an array of token ids and strings'),
])
def test_bad_requests(server, fim, change, message):
    r = call(server, "POST", "/infill", {**BODY, **change})
    assert r.status == 400 and r.json()["error"]["message"] == message


def test_prefix_and_suffix_are_required(server, fim):
    for name in ("input_prefix", "input_suffix"):
        body = {k: v for k, v in BODY.items() if k != name}
        r = call(server, "POST", "/infill", body)
        assert r.status == 400 and r.json()["error"]["message"] == f'"{name}" is required'
