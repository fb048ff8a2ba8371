"""chat.agents.wire: every recorded dialect, and the rules behind them, without a server."""

import json
import sys

import pytest

from chat.agents import AgentError, TextDelta, Thinking, ToolCallRequest
from chat.agents.wire import (
    TOKENS_REPORTED_MAX,
    ChunkParser,
    SseDecoder,
    SseError,
    Usage,
    chunk_decode,
    sse_events,
    stream_parse,
)
from tests.chat.costs import python_calls, python_calls_of
from tests.fakes.dialects import RECORDINGS, Recording


def parse(recording: Recording):
    return stream_parse(sse_events(recording.wire.decode().splitlines()))


@pytest.mark.parametrize("recording", RECORDINGS, ids=lambda r: r.id)
def test_every_recorded_stream_parses_to_its_text_thinking_calls_and_usage(recording):
    if recording.error:
        with pytest.raises(AgentError) as caught:
            parse(recording)
        assert (
            str(caught.value) == f"The language model server reported an error: {recording.error}"
        )
        return

    items = parse(recording)

    assert "".join(i.text for i in items if isinstance(i, TextDelta)) == recording.text
    assert tuple(i.text for i in items if isinstance(i, Thinking)) == recording.thinking
    calls = tuple((c.id, c.name, c.arguments) for c in items if isinstance(c, ToolCallRequest))
    assert calls == recording.calls
    usage = [i for i in items if isinstance(i, Usage)]
    assert usage == ([Usage(*recording.usage)] if recording.usage else [])


@pytest.mark.parametrize("recording", RECORDINGS, ids=lambda r: r.id)
def test_reasoning_never_reaches_the_answer_text(recording):
    if recording.error or not recording.thinking:
        return
    text = "".join(i.text for i in parse(recording) if isinstance(i, TextDelta))
    for thought in recording.thinking:
        assert thought not in text
    assert "<think>" not in text and "</think>" not in text


def test_sse_framing_joins_data_lines_and_skips_comments_and_other_fields():
    lines = [": keep-alive", "", "event: message", "id: 3", 'data: {"a":', "data: 1}", "", ":", ""]
    assert list(sse_events(lines)) == ['{"a":\n1}']


def test_an_event_cut_off_by_the_end_of_the_body_still_counts():
    assert list(sse_events(["data: [DONE]"])) == ["[DONE]"]


def test_the_non_standard_error_field_is_an_event_of_its_own():
    assert list(sse_events(['error: {"message":"boom"}', ""])) == [SseError('{"message":"boom"}')]


def chunk(delta=None, finish=None, **extra):
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return {"choices": [choice], **extra}


def run(*chunks, done=True):
    parser = ChunkParser()
    out = []
    for c in chunks:
        out += parser.feed(c)
    return out + parser.close(done=done)


def calls_of(items):
    return [(c.id, c.name, c.arguments) for c in items if isinstance(c, ToolCallRequest)]


def test_a_stream_that_neither_finished_nor_said_done_was_cut_off():
    with pytest.raises(AgentError, match="ended before it was complete"):
        run(chunk({"content": "half an ans"}), done=False)


def test_a_finished_stream_without_done_is_complete():
    items = run(chunk({"content": "All"}), chunk({}, "stop"), done=False)
    assert items == [TextDelta("All")]


def test_a_new_id_at_a_used_index_starts_a_new_call():
    items = run(
        chunk(
            {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{"}}]}
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}),
        chunk(
            {"tool_calls": [{"index": 0, "id": "b", "function": {"name": "g", "arguments": "{}"}}]}
        ),
    )
    assert calls_of(items) == [("a", "f", "{}"), ("b", "g", "{}")]


def test_a_name_without_id_after_a_complete_call_at_the_same_index_starts_a_new_call():
    items = run(
        chunk({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{}"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"name": "g", "arguments": "{}"}}]}),
    )
    assert calls_of(items) == [("call_0", "f", "{}"), ("call_1", "g", "{}")]


def test_a_call_repeated_whole_after_it_was_streamed_is_not_appended_again():
    fragment = {"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x": 1}'}}
    items = run(chunk({"tool_calls": [fragment]}), chunk({"tool_calls": [fragment]}))
    assert calls_of(items) == [("a", "f", '{"x": 1}')]


def test_arguments_sent_as_an_object_become_json_text():
    fragment = {"index": 0, "id": "a", "function": {"name": "f", "arguments": {"x": 1}}}
    assert calls_of(run(chunk({"tool_calls": [fragment]}))) == [("a", "f", '{"x": 1}')]


def test_a_call_without_a_name_is_an_error():
    with pytest.raises(AgentError, match="without a name"):
        run(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}))


def test_long_reasoning_goes_out_a_paragraph_at_a_time():
    parser = ChunkParser()
    first = parser.feed(chunk({"reasoning_content": "One thought."}))
    second = parser.feed(chunk({"reasoning_content": "\n\nAnother"}))
    rest = parser.feed(chunk({"content": "Answer"})) + parser.close(done=True)
    assert first == []
    assert second == [Thinking("One thought.")]
    assert rest == [Thinking("Another"), TextDelta("Answer")]


def test_reasoning_and_reasoning_content_sent_together_count_once():
    items = run(chunk({"reasoning_content": "Hmm.", "reasoning": "Hmm."}), chunk({}, "stop"))
    assert items == [Thinking("Hmm.")]


def test_content_that_only_looks_like_a_think_tag_at_first_is_the_answer():
    items = run(chunk({"content": "<th"}), chunk({"content": "ere>"}), chunk({}, "stop"))
    assert "".join(i.text for i in items if isinstance(i, TextDelta)) == "<there>"


def test_a_think_tag_later_in_the_answer_stays_text():
    items = run(chunk({"content": "Use <think> tags"}), chunk({}, "stop"))
    assert items == [TextDelta("Use <think> tags")]


def test_choices_other_than_the_first_are_ignored():
    other = {"index": 1, "delta": {"content": "other"}, "finish_reason": None}
    items = run({"choices": [other]}, chunk({"content": "mine"}, "stop"))
    assert items == [TextDelta("mine")]


def test_the_last_usage_reported_wins():
    items = run(
        chunk({"content": "a"}, usage={"prompt_tokens": 5, "completion_tokens": 1}),
        chunk({}, "stop", usage={"prompt_tokens": 5, "completion_tokens": 2}),
        {"choices": [], "usage": None},
    )
    assert items[-1] == Usage(prompt_tokens=5, completion_tokens=2)


def test_a_usage_no_model_could_report_is_no_usage():
    """A server's 2**63 tokens failed the statement that adds them to the turn's row (review
    29-a H1); a count past 2**31 - 1 is taken as no report, a real count as it is."""
    most = TOKENS_REPORTED_MAX
    for prompt, completion in ((2**63, 1), (1, most + 1)):
        usage = {"prompt_tokens": prompt, "completion_tokens": completion}
        assert run(chunk({"content": "a"}, "stop", usage=usage)) == [TextDelta("a")]
    usage = {"prompt_tokens": most, "completion_tokens": 0}
    items = run(chunk({"content": "a"}, "stop", usage=usage))
    assert items[-1] == Usage(prompt_tokens=most, completion_tokens=0)


# --- the body's bytes, as they arrive ----------------------------------------------------------
MIXED_LINE_ENDS = (
    b': keep-alive\r\n\r\ndata: {"a":\r\ndata: 1}\r\rdata: \xc3\xa9t\xc3\xa9\n\n'
    b"error: boom\r\n\r\ndata: [DONE]"
)
MIXED_EVENTS = ['{"a":\n1}', "été", SseError("boom"), "[DONE]"]


def test_crlf_cr_and_lf_end_lines_wherever_the_body_is_cut():
    """A CR ending one piece and the LF opening the next are one line end, not two (that
    would end the event early); a UTF-8 character may be cut between pieces too."""
    for cut in range(len(MIXED_LINE_ENDS) + 1):
        decoder = SseDecoder()
        events = decoder.feed(MIXED_LINE_ENDS[:cut]) + decoder.feed(MIXED_LINE_ENDS[cut:])
        assert events + decoder.close() == MIXED_EVENTS, cut


def test_bytes_one_at_a_time_make_the_same_events():
    decoder = SseDecoder()
    events = [
        e for i in range(len(MIXED_LINE_ENDS)) for e in decoder.feed(MIXED_LINE_ENDS[i : i + 1])
    ]
    assert events + decoder.close() == MIXED_EVENTS


def test_a_leading_bom_is_dropped_and_invalid_utf8_replaced():
    decoder = SseDecoder()
    assert decoder.feed(b"\xef\xbb\xbfdata: a\xffb\n\n") == ["a\ufffdb"]


def test_a_bom_cut_between_pieces_is_dropped_and_one_later_kept():
    body = b"\xef\xbb\xbfdata: \xef\xbb\xbf\xc3\xa9\n\n"
    for cut in range(len(body) + 1):
        decoder = SseDecoder()
        events = decoder.feed(body[:cut]) + decoder.feed(body[cut:]) + decoder.close()
        assert events == ["\ufeff\u00e9"], cut


def test_a_character_cut_off_by_the_end_of_the_body_is_replaced():
    decoder = SseDecoder()
    assert decoder.feed(b"data: a\xc3") == []
    assert decoder.close() == ["a\ufffd"]


def test_a_long_line_is_whole_and_one_past_the_limit_is_a_clear_error():
    long = "x" * 200_000  # aiohttp's readline stops at 64 KiB
    decoder = SseDecoder()
    body = f"data: {long}\n\n".encode()
    events = [e for i in range(0, len(body), 1000) for e in decoder.feed(body[i : i + 1000])]
    assert events == [long]

    with pytest.raises(AgentError, match="sent a stream line longer than 1,000 characters"):
        SseDecoder(limit=1000).feed(b"data: " + b"x" * 1001)
    with pytest.raises(AgentError, match="sent a stream event longer than 1,000 characters"):
        SseDecoder(limit=1000).feed(b"data: " + b"x" * 600 + b"\ndata: " + b"x" * 600 + b"\n")


def test_a_long_line_in_many_pieces_is_scanned_once(monkeypatch):
    """Each piece was joined to the line so far and the whole split again: a line in n pieces
    cost n times its length on the event loop (15 Mi characters in 16 KiB pieces: 3 s)."""
    from chat.agents import wire

    scanned = []
    real = wire._lines_of
    monkeypatch.setattr(wire, "_lines_of", lambda text: scanned.append(len(text)) or real(text))
    body = b"data: " + b"x" * 1_000_000 + b"\n\n"
    decoder = SseDecoder()
    events = [e for i in range(0, len(body), 1000) for e in decoder.feed(body[i : i + 1000])]
    assert events == ["x" * 1_000_000]
    assert sum(scanned) == len(body)


def test_empty_data_lines_count_towards_the_event_limit():
    """`data:` with nothing after it still adds a line to the event: a server sending them
    forever filled the memory under a limit that counted only the values."""
    with pytest.raises(AgentError, match="sent a stream event longer than 1,000 characters"):
        SseDecoder(limit=1000).feed(b"data:\n" * 1001)


def test_the_text_before_an_error_in_the_same_piece_is_given_first():
    """Events that arrive together are fed one by one: the text before a mid-stream `error:`
    (llama.cpp) reaches the page and is kept, cut off, before the error ends the turn."""
    text = '{"choices": [{"index": 0, "delta": {"content": "Hello"}}]}'
    events = SseDecoder().feed(f'data: {text}\n\nerror: {{"message": "overflow"}}\n\n'.encode())
    given = []
    with pytest.raises(AgentError, match="overflow"):
        for item in ChunkParser().feed_events(events):
            given.append(item)
    assert given == [TextDelta("Hello")]


def test_a_chunk_nested_too_deep_is_a_malformed_stream():
    with pytest.raises(AgentError, match="malformed stream"):
        chunk_decode("[" * 100_000 + "]" * 100_000)
    with pytest.raises(AgentError, match="malformed stream"):
        stream_parse(["[" * 100_000 + "]" * 100_000])


def test_a_chunk_orjson_refuses_is_read_as_json_reads_it():
    """A lone surrogate (half an emoji a server's tokenizer cut) or NaN: read, not refused;
    the half emoji becomes U+FFFD, which can be sent and stored (it could not)."""
    chunk = chunk_decode('{"choices": [{"index": 0, "delta": {"content": "a\\ud83d"}}], "x": NaN}')
    assert chunk["choices"][0]["delta"]["content"] == "a\ufffd"
    assert chunk_decode('{"t": "\\ud83d\\ude00"}') == {"t": "\U0001f600"}  # a whole pair
    streamed = '{"choices": [{"index": 0, "delta": {"content": "a\\ud83d"}}], "x": NaN}'
    assert stream_parse([streamed, "[DONE]"]) == [TextDelta("a\ufffd")]


@pytest.mark.asyncio
async def test_a_streamed_answer_costs_few_python_calls_a_chunk():
    """Each chunk of an answer, as it arrives in a piece of its own (a token a chunk), is
    decoded, framed, parsed and turned into a `TextDelta` on the event loop: 16 Python calls
    a piece before (the codec's incremental decoder, an object per event, the error check, the
    think tags and the reasoning flush called for nothing), 9 now (issue 15)."""

    def piece(delta, finish=None):
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        chunk = {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}
        return f"data: {json.dumps(chunk)}\n\n".encode()

    usage = {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": 3, "completion_tokens": 40},
    }
    pieces = [
        piece({"role": "assistant", "content": ""}),
        *(piece({"content": f"word{n} "}) for n in range(40)),
        piece({}, "stop"),
        f"data: {json.dumps(usage)}\n\n".encode(),
        b"data: [DONE]\n\n",
    ]
    items = []

    async def stream():
        decoder, parser = SseDecoder(), ChunkParser()
        for data in pieces:
            items.extend(parser.feed_events(decoder.feed(data)))
        items.extend(parser.close(done=parser.done))

    calls = await python_calls(stream())
    assert items[:2] == [TextDelta("word0 "), TextDelta("word1 ")]
    assert items[-1] == Usage(prompt_tokens=3, completion_tokens=40)
    assert calls / len(pieces) <= 10


def test_a_whole_answer_read_at_once_costs_few_python_calls():
    """What a request's answer costs the parser when its body is read in one piece (as a
    loaded server reads it): per event its JSON and its choice, and at the end only what the
    stream left to do. The think tags' state is made without a Python call, and their close
    and the reasoning's flush are not called with nothing to give: 32 and 27 Python calls
    before, then 29 and 24; the choice and the error check read in `feed`'s own frame, not
    in `_choice` and `chunk_decode`: 20 and 17."""

    def body(*deltas, usage=True):
        events = [{"id": "c", "object": "chat.completion.chunk", "choices": [d]} for d in deltas]
        if usage:
            events.append(
                {"id": "c", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}}
            )
        return "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"

    call = {"index": 0, "id": "call_1", "function": {"name": "location_get", "arguments": ""}}
    arguments = {"index": 0, "function": {"arguments": '{"i": 1}'}}
    tool_call = body(
        {"index": 0, "delta": {"role": "assistant", "content": ""}},
        {"index": 0, "delta": {"tool_calls": [call]}},
        {"index": 0, "delta": {"tool_calls": [arguments]}},
        {"index": 0, "delta": {}, "finish_reason": "tool_calls"},
    )
    text = body(
        {"index": 0, "delta": {"role": "assistant", "content": ""}},
        {"index": 0, "delta": {"content": "Here."}},
        {"index": 0, "delta": {}, "finish_reason": "stop"},
    )

    def read(data: bytes) -> list:
        decoder, parser = SseDecoder(), ChunkParser()
        items = list(parser.feed_events(decoder.feed(data)))
        return items + parser.close(done=parser.done)

    items = read(tool_call) + read(text)
    assert items == [
        ToolCallRequest(id="call_1", name="location_get", arguments='{"i": 1}'),
        Usage(prompt_tokens=9, completion_tokens=3),
        TextDelta("Here."),
        Usage(prompt_tokens=9, completion_tokens=3),
    ]
    assert (python_calls_of(read, tool_call), python_calls_of(read, text)) == (20, 17)


def test_a_content_chunk_is_parsed_with_few_calls_of_builtins():
    """A model streams its answer a token a chunk, each a content delta alone: the delta's other
    fields (reasoning, refusal, tool calls, the legacy function call) are looked up only when it
    has their keys (`in` is no call). Python and builtins' calls of parsing one such chunk (the
    profile's own unsetting included): 26 before (a `get` and an `isinstance` for each absent
    field), 17 now."""
    from tests.chat.costs import _counter

    parser = ChunkParser()
    parser.feed({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "A"}}]})
    chunk = {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": "word "}, "finish_reason": None}],
    }
    count, calls = _counter(True)
    sys.setprofile(count)
    try:
        items = parser.feed(chunk)
    finally:
        sys.setprofile(None)

    assert items == [TextDelta("word ")]
    assert calls[0] <= 17, calls[0]
