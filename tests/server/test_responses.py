"""Stream chunks from typed engine events, without a model: the shapes of OpenAI's chat and completion streams."""

from samplechain.chat import ChatSyntax
from samplechain.runtime.events import Error, Final, Progress, Token
from samplechain.server.request import Options
from samplechain.server.responses import BUILD_INFO, ChatStream, error_event, oai_completion_chunk, prompt_progress, sse

ENV = {"created": 123, "model": "m", "system_fingerprint": BUILD_INFO, "object": "chat.completion.chunk",
       "id": "chatcmpl-x"}


def token(text: str, probs: dict | None = None) -> Token:
    return Token(token=7, text=text, probs=probs, n_decoded=1, n_prompt=3, id_slot=0, timings={"predicted_n": 1})


def final(stop_type: str = "eos") -> Final:
    return Final(content="", tokens=[7], stop_type=stop_type, stopping_word="", truncated=False, has_new_line=False,
                 n_prompt=3, n_decoded=2, n_cached=1, timings={"predicted_n": 2}, probs=[], id_slot=0)


def delta(d: dict) -> dict:
    return {"choices": [{"finish_reason": None, "index": 0, "delta": d}], **ENV}


def test_chat_stream_sends_the_role_first_and_the_reasoning_apart():
    chat = ChatStream("chatcmpl-x", "m", 123, Options(), ChatSyntax(), with_logprobs=False)
    assert chat.chunks(0, token("<think>")) == [delta({"role": "assistant", "content": None})]
    assert chat.chunks(0, token("hm")) == [delta({"reasoning_content": "hm"})]
    assert chat.chunks(0, token("</think>Hi")) == [delta({"content": "Hi"})]
    assert chat.chunks(0, final("word")) == [{"choices": [{"finish_reason": "stop", "index": 0, "delta": {}}], **ENV,
                                              "timings": {"predicted_n": 2}}]
    assert chat.usage_chunk() is None


def test_chat_stream_progress_rides_on_the_role_chunk_and_usage_comes_last():
    chat = ChatStream("chatcmpl-x", "m", 123, Options(include_usage=True), ChatSyntax(extract_reasoning=False),
                      with_logprobs=True)
    progress = Progress(id_slot=0, n_prompt=3, total=3, cache=1, processed=1, time_ms=0.5)
    assert chat.chunks(0, progress) == [{**delta({"role": "assistant", "content": None}),
                                         "prompt_progress": {"total": 3, "cache": 1, "processed": 1, "time_ms": 0.5}}]
    entry = {"id": 7, "token": "", "bytes": [], "logprob": -1.0, "top_logprobs": []}
    with_probs = delta({})
    with_probs["choices"][0]["logprobs"] = {"content": [entry]}
    assert chat.chunks(0, token("", entry)) == [with_probs]  # no text, but its logprobs
    assert chat.chunks(0, final("limit")) == [{"choices": [{"finish_reason": "length", "index": 0, "delta": {}}],
                                               **ENV}]
    assert chat.usage_chunk() == {"choices": [], **ENV, "timings": {"predicted_n": 2}, "usage": {
        "completion_tokens": 2, "prompt_tokens": 3, "total_tokens": 5, "prompt_tokens_details": {"cached_tokens": 1}}}


def test_completion_chunks_skip_tokens_that_release_nothing():
    env = {"id": "c"}
    assert oai_completion_chunk(token(""), 1, env) is None
    assert oai_completion_chunk(token("a"), 1, env) == {
        "choices": [{"text": "a", "index": 1, "logprobs": None, "finish_reason": None}], "id": "c"}
    assert oai_completion_chunk(final(), 1, env)["choices"] == [
        {"text": "", "index": 1, "logprobs": None, "finish_reason": "stop"}]


def test_an_error_event_is_its_error_body():
    error = Error(503, "the server is shutting down", "unavailable_error", final=final())
    assert sse(error_event(error).body()) == (b'data: {"error":{"code":503,"message":"the server is shutting down",'
                                              b'"type":"unavailable_error"}}\n\n')
    assert prompt_progress(Progress(0, 5, 5, 0, 5, 1.0)) == {"total": 5, "cache": 0, "processed": 5, "time_ms": 1.0}
