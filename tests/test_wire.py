"""The wire is defined once on each side: geosense/wire.py and static/geosense/wire.js agree,
and the shape check the suites run on every event and frame catches a drifting payload."""

import json
import re
import sys
from pathlib import Path

from geosense import wire
from tests.wire_shapes import event_problem, server_frame_problem, shape_problem

WIRE_JS = (Path(__file__).resolve().parent.parent / "static" / "geosense" / "wire.js").read_text()


def js_constant(name: str) -> object:
    """An exported constant of wire.js: a frozen array of strings or object of strings."""
    match = re.search(
        rf"export const {name} = Object\.freeze\((?P<body>[\[{{].*?[\]}}])\);", WIRE_JS, re.S
    )
    assert match, f"wire.js exports no {name}"
    body = re.sub(r",(\s*[\]}])", r"\1", match["body"].replace("'", '"'))  # as JSON
    body = re.sub(r"(\w+):", r'"\1":', body)
    return json.loads(body)


def test_both_sides_name_the_same_turn_events():
    assert tuple(js_constant("TURN_EVENTS")) == wire.TURN_EVENTS


def test_both_sides_name_the_same_context_types():
    assert tuple(js_constant("CONTEXT_TYPES")) == wire.CONTEXT_TYPES
    assert tuple(js_constant("MAP_CONTEXT_TYPES")) == wire.MAP_CONTEXT_TYPES


def test_both_sides_name_the_same_frames():
    assert sorted(js_constant("CLIENT_FRAMES").values()) == sorted(wire.CLIENT_FRAME_TYPES)
    assert sorted(js_constant("SERVER_FRAMES").values()) == sorted(wire.SERVER_FRAMES)


def test_every_event_builder_makes_the_shape_of_its_event():
    events = [
        wire.turn_start(session="s", turn=1),
        wire.text_delta("a"),
        wire.backend_thinking("b"),
        wire.backend_tool_call(call_id="c", name="n", arguments={}, ok=False, error="no"),
        wire.backend_tool_call(call_id="c", name="n", arguments={}, ok=True, error=None),
        wire.client_tool_call(call_id="c", name="n", arguments={}, kind="one-way"),
        wire.error("e"),
        wire.turn_end(),
    ]
    assert {e.event for e in events} == set(wire.TURN_EVENTS) - {"message"}
    for event in events:
        assert event_problem(event.event, json.loads(json.dumps(event.data))) is None


def test_the_shape_check_catches_a_missing_an_unknown_and_a_mistyped_field():
    assert "lacks turn" in event_problem("turn_start", {"session": "s"})
    assert "unknown extra" in event_problem("text_delta", {"delta": "a", "extra": 1})
    words = {"title": "T", "summary": "S"}
    assert "expected a boolean" in event_problem(
        "backend_tool_call", {"call_id": "c", "name": "n", "arguments": {}, "ok": "yes", **words}
    )
    assert "not one of" in event_problem(
        "client_tool_call", {"call_id": "c", "name": "n", "arguments": {}, "kind": "later", **words}
    )
    assert "lacks summary, title" in event_problem(
        "client_tool_call", {"call_id": "c", "name": "n", "arguments": {}, "kind": "blocking"}
    )
    assert event_problem("turn_paused", {}) == "unknown event 'turn_paused'"


def test_the_shape_check_reads_optional_fields_and_nested_shapes():
    assert shape_problem({"type": "error", "status": 404, "error": "x"}, wire.ErrorFrame) is None
    frame = {"type": "event", "event": "turn_start", "data": {"session": "s"}}
    assert "lacks turn" in server_frame_problem(frame)
    assert "unknown frame" in server_frame_problem({"type": "hello"})


def test_a_page_answer_becomes_the_engines_answer_with_a_bounded_refusal():
    refusal = wire.client_tool_result_parse(
        {"type": "client-tool-result", "correlationId": "c1", "error": "x" * 50}
    )
    answer = wire.client_tool_answer_message(refusal, error_max_chars=10)
    assert answer == {"type": "client.tool.answer", "correlation_id": "c1", "error": "x" * 10}
    assert shape_problem(answer, wire.ClientToolAnswerMessage) is None


EVENT_DATA = [
    {"delta": 'Il y a douze arbres \u00e0 c\u00f4t\u00e9 \U0001f333 "quoted"\n'},
    {"call_id": "c1", "name": "n", "arguments": {"a": [1, 2.5, None, True]}, "ok": True},
    {"x": float("nan"), "y": float("inf"), "z": -0.0, "big": 10**30},
    {"lone": "\ud83d"},  # a lone surrogate: ASCII escapes, so that a UTF-8 stream carries it
    {},
]


def test_an_events_data_is_written_as_json_dumps_writes_it():
    for data in EVENT_DATA:
        expected = json.dumps(data, ensure_ascii=False)
        try:
            expected.encode()
        except UnicodeEncodeError:
            expected = json.dumps(data)
        assert wire.TurnEvent("text_delta", data).data_json == expected


def test_an_events_data_is_encoded_without_jsons_python_frames():
    """`JSONEncoder.encode` and `iterencode`: two Python calls an event, around the C encoder.
    The text is kept: a second read (the SSE frame after the socket's) makes no call."""
    event = wire.TurnEvent("text_delta", {"delta": "There are twelve trees."})
    calls: list[str] = []

    def count(frame, kind, arg):
        if kind == "call":
            calls.append(frame.f_code.co_name)

    sys.setprofile(count)
    try:
        first = event.data_json
        second = event.data_json
    finally:
        sys.setprofile(None)

    assert calls == ["__get__", "data_json"]  # functools.cached_property's, then the encoding
    assert first is second
