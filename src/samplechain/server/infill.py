"""``/infill``'s prompt as llama-server builds it (tools/server/server-common.cpp ``format_prompt_infill``), with
the model's fill-in-the-middle tokens: the request becomes a native completion of that prompt.

The repo-level pattern (https://arxiv.org/pdf/2409.12186), each part present where the vocabulary has its token:

    [FIM_REP]myproject\\n [FIM_SEP]filename0\\n extra chunk 0 ... [FIM_SEP]filename\\n
    [BOS] [FIM_PRE]prefix prompt [FIM_SUF]suffix [FIM_MID]

A batch holds the prefix (its last ``3 * n_batch / 4`` tokens) and the suffix (its first ``n_batch / 4`` tokens less
the prompt's and two more); the extra chunks fill what the context has left (their last tokens), before the prefix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from samplechain.server import limits
from samplechain.server import prompts as pr
from samplechain.server.limits import APIError, bad_request

if TYPE_CHECKING:
    from samplechain.runtime.generation import Model
    from samplechain.server.state import ServerState

CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"  # between extra chunks when the vocabulary has no file separator
FIM_KINDS = ("fim_pre", "fim_suf", "fim_mid", "fim_rep", "fim_sep")


def fim_tokens(model: Model) -> dict[str, int | None]:
    """The vocabulary's FIM tokens (``tokenizer.ggml.fim_*_token_id``, else found by their text as llama.cpp's
    vocabulary finds them); a 501 when prefix, suffix or middle is missing, as llama-server answers."""
    tokenizer = model.vocab.tokenizer
    fim = {k: getattr(tokenizer, k, None) for k in FIM_KINDS}
    missing = "".join(f"{what} token is missing. " for k, what in (("fim_pre", "prefix"), ("fim_suf", "suffix"),
                                                                    ("fim_mid", "middle")) if fim[k] is None)
    if missing:
        raise APIError(501, f"Infill is not supported by this model: {missing}", "not_supported_error")
    return fim


def check_infill(body: Mapping[str, Any]) -> list[dict[str, str]]:
    """llama-server's checks of an infill request; its extra chunks. (llama-server answers a missing prefix or
    suffix, or a prompt that is not a string, with the error and then runs the request anyway: a 400 here.)"""
    if "prompt" in body and not isinstance(body["prompt"], str):
        raise bad_request("\"prompt\" must be a string")
    for name in ("input_prefix", "input_suffix"):
        if name not in body:
            raise bad_request(f"\"{name}\" is required")
        if not isinstance(body[name], (str, list)):
            raise bad_request(f"\"{name}\" must be a string or an array of token ids and strings")
    extra = body.get("input_extra", [])
    if not isinstance(extra, list):
        raise bad_request("\"input_extra\" must be an array of {\"filename\": string, \"text\": string}")
    if len(extra) > limits.MAX_COMPLETIONS:
        raise bad_request(f"Field 'input_extra': at most {limits.MAX_COMPLETIONS} chunks, got {len(extra)}")
    for chunk in extra:
        if not isinstance(chunk, Mapping) or not isinstance(chunk.get("text"), str):
            raise bad_request("extra_context chunk must contain a \"text\" field with a string value")
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise bad_request("extra_context chunk's \"filename\" field must be a string")
    return extra


def format_infill(model: Model, fim: Mapping[str, int | None], prefix: Any, suffix: Any,
                  extra: list[dict[str, str]], prompt: list[int], n_batch: int, n_predict: int, n_ctx: int,
                  ) -> list[int]:
    """``format_prompt_infill`` (SPM order off): the prompt tokens of an infill request whose ``prompt`` is
    already tokenized. Texts are tokenized without special tokens, added or parsed."""
    def tokenize(text: Any) -> list[int]:
        return pr.tokenize_mixed(model, text, add_special=False, n_ctx=n_ctx, parse_special=False)

    pr.check_length(model, sum(len(c["text"]) for c in extra), n_ctx)  # only their last tokens can be used
    extra_tokens: list[int] = []
    if fim["fim_rep"] is not None:
        extra_tokens += [fim["fim_rep"], *tokenize("myproject\n")]  # llama.cpp's TODO: the project's name
    for chunk in extra:
        if fim["fim_sep"] is not None:
            extra_tokens += [fim["fim_sep"], *tokenize(chunk.get("filename", "tmp") + "\n")]
        else:
            extra_tokens += tokenize(CHUNK_SEPARATOR)
        extra_tokens += tokenize(chunk["text"])
    if fim["fim_sep"] is not None:
        extra_tokens += [fim["fim_sep"], *tokenize("filename\n")]  # llama.cpp's TODO: the current file's name

    prefix_tokens, suffix_tokens = tokenize(prefix), tokenize(suffix)
    n_prefix = min(len(prefix_tokens), 3 * (n_batch // 4))
    n_suffix = min(len(suffix_tokens), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))
    head = [fim["fim_pre"], *prefix_tokens[len(prefix_tokens) - n_prefix:], *prompt]
    tail = [fim["fim_suf"], *suffix_tokens[:n_suffix]]
    bos = [model.vocab.bos] if model.vocab.add_bos and model.vocab.bos is not None else []
    return [*extra_tokens[len(extra_tokens) - n_extra:], *bos, *head, *tail, fim["fim_mid"]]


def infill_body(state: ServerState, fim: Mapping[str, int | None], body: dict[str, Any]) -> dict[str, Any]:
    """The request as the completion it runs: its ``prompt`` replaced by the infill prompt's tokens (the server's
    ``n_batch``, default ``n_predict`` and slot context size the budgets)."""
    extra = check_infill(body)
    engine = state.running_engine
    prompt = pr.tokenize_mixed(state.model, body.get("prompt", ""), add_special=False, n_ctx=engine.n_ctx_slot)
    tokens = format_infill(state.model, fim, body["input_prefix"], body["input_suffix"], extra, prompt,
                           engine.n_batch, state.config.defaults.rules.n_predict, engine.n_ctx_slot)
    return {**body, "prompt": tokens}
