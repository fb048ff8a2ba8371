"""chat.history: the window of whole turns a model request carries, its bounds and its pictures."""

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chat import history
from chat.agents.openai import history_without_images
from chat.history import (
    LEFT_OUT_NOTE,
    TOOL_RESULT_CHARS,
    history_window,
    tokens_estimate,
)
from chat.models import Artifact, Message
from tests.chat.conftest import make_caller
from tests.chat.helpers import post_stream

PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="


def add_turns(session, count: int, *, first: int = 1, result: str = '{"n": 1}') -> None:
    """`count` turns of four messages: a question, a call, its result and the answer."""
    rows = []
    for turn in range(first, first + count):
        call = {"id": f"call-{turn}", "name": "measure", "arguments": '{"id": 1}'}
        rows += [
            Message(session=session, turn=turn, role="user", content=f"question {turn}"),
            Message(session=session, turn=turn, role="assistant", content="", tool_calls=[call]),
            Message(
                session=session,
                turn=turn,
                role="tool",
                content=result,
                tool_call_id=call["id"],
                tool_name="measure",
            ),
            Message(session=session, turn=turn, role="assistant", content=f"answer {turn}"),
            Message(session=session, turn=turn, role="note", content="never sent"),
        ]
    Message.objects.bulk_create(rows)


def turn_messages(turn: int, *, result: str = '{"n": 1}') -> list[dict]:
    call = {"id": f"call-{turn}", "type": "function"}
    call["function"] = {"name": "measure", "arguments": '{"id": 1}'}
    return [
        {"role": "user", "content": f"question {turn}"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call-{turn}", "content": result},
        {"role": "assistant", "content": f"answer {turn}"},
    ]


def turn_cost(turn: int) -> int:
    costs = [tokens_estimate(m) for m in turn_messages(turn)]
    costs[0] = tokens_estimate(f"question {turn}") + 4
    return sum(costs)


@pytest.fixture
def session(transactional_db):
    return make_caller("hana").session


def test_a_short_session_is_sent_whole_in_order(session):
    add_turns(session, 3)

    window = history_window(session_id=session.pk, budget=100_000)

    assert window.messages == turn_messages(1) + turn_messages(2) + turn_messages(3)
    assert not window.left_out


def test_the_oldest_whole_turns_are_left_out_when_the_history_does_not_fit(session):
    add_turns(session, 5)
    budget = turn_cost(5) + turn_cost(4) + turn_cost(3) - 1  # two turns and most of a third

    window = history_window(session_id=session.pk, budget=budget)

    assert window.messages == turn_messages(4) + turn_messages(5)
    assert window.left_out


def test_the_newest_turn_goes_in_even_when_it_alone_is_over_budget(session):
    add_turns(session, 3)

    window = history_window(session_id=session.pk, budget=1)

    assert window.messages == turn_messages(3)
    assert window.left_out


@pytest.mark.parametrize("budget_turns", range(1, 8))
def test_a_call_never_arrives_without_its_result(session, monkeypatch, budget_turns):
    monkeypatch.setattr(history, "READ_BATCH", 3)  # batches end inside turns
    add_turns(session, 7)
    budget = sum(turn_cost(t) for t in range(8 - budget_turns, 8))

    window = history_window(session_id=session.pk, budget=budget)

    calls = [c["id"] for m in window.messages for c in m.get("tool_calls", [])]
    results = [m["tool_call_id"] for m in window.messages if m["role"] == "tool"]
    assert calls == results
    assert window.messages[0]["role"] == "user"
    assert window.messages == [m for t in range(8 - budget_turns, 8) for m in turn_messages(t)]
    assert window.left_out is (budget_turns < 7)


def test_a_large_tool_result_is_cut_in_the_database_with_a_note(session):
    big = json.dumps({"ids": list(range(5000))})
    add_turns(session, 1, result=big)

    (_, _, tool, _) = history_window(session_id=session.pk, budget=100_000).messages

    assert tool["content"] == (
        f"{big[:TOOL_RESULT_CHARS]}… (cut: the model reads the first {TOOL_RESULT_CHARS} of "
        f"{len(big)} characters of this result)"
    )


def test_a_long_session_reads_only_its_window(session, monkeypatch):
    """Issue 15, cause 2: a step of a huge session may not read (and build) its whole history."""
    monkeypatch.setattr(history, "READ_BATCH", 16)
    budget = 3 * turn_cost(1)
    add_turns(session, 10)
    with CaptureQueriesContext(connection) as short:
        history_window(session_id=session.pk, budget=budget)
    add_turns(session, 1000, first=11)
    with CaptureQueriesContext(connection) as long:
        window = history_window(session_id=session.pk, budget=budget)

    assert len(window.messages) <= 4 * 4
    # The long read checks the rows the short one kept (one statement), finds a thousand turns
    # stored since, and reads from the newest back as far as the window reaches (the check's
    # rows within CHECK_ROWS, the newest batch is that read; past it, one statement more).
    assert len(long.captured_queries) <= len(short.captured_queries) + 1 <= 7


def test_the_newest_picture_is_an_image_part_and_older_ones_are_words(session):
    add_turns(session, 1)
    for turn, text in ((2, "look"), (3, "and now?")):
        message = Message.objects.create(session=session, turn=turn, role="user", content=text)
        Artifact.objects.create(
            session=session,
            artifact_id=f"image-{turn}",
            kind="image",
            data={"png": PNG, "width": 800, "height": 600},
            origin="client:image",
            message=message,
        )
        Artifact.objects.create(
            session=session,
            artifact_id=f"position-{turn}",
            kind="position",
            data={"zoom": 17},
            origin="client:position",
            message=message,
        )
        Message.objects.create(session=session, turn=turn, role="assistant", content="I see.")

    window = history_window(session_id=session.pk, budget=100_000, images=True)

    described = (
        '\n[context type="image" artifact_id="image-{0}"] '
        "A picture of the map as the user saw it, 800×600 px."
        '\n[context type="position" artifact_id="position-{0}"] {{"zoom": 17}}'
    )
    older, newest = window.messages[4], window.messages[6]
    assert older == {"role": "user", "content": "look" + described.format(2)}
    assert newest == {
        "role": "user",
        "content": [
            {"type": "text", "text": "and now?" + described.format(3)},
            {"type": "image_url", "image_url": {"url": PNG}},
        ],
    }
    without = history_window(session_id=session.pk, budget=100_000, images=False)
    assert history_without_images(window.messages) == without.messages
    assert "base64" not in json.dumps(without.messages)


@pytest.mark.parametrize(
    "png",
    [
        "data:image/svg+xml;base64,PHN2Zz4=",
        "javascript:alert(1)",
        "data:image/png;base64,not base64!",
        None,
        12,
    ],
)
def test_a_picture_that_is_not_an_image_data_url_is_only_described(session, png):
    message = Message.objects.create(session=session, turn=1, role="user", content="look")
    Artifact.objects.create(
        session=session,
        artifact_id="image-1",
        kind="image",
        data={"png": png, "width": 8, "height": 6},
        origin="client:image",
        message=message,
    )

    (entry,) = history_window(session_id=session.pk, budget=100_000, images=True).messages

    assert entry["content"] == (
        'look\n[context type="image" artifact_id="image-1"] '
        "A picture of the map as the user saw it, 8×6 px."
    )


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_model_is_told_when_earlier_turns_were_left_out(
    client, trusted_caller, openai_agent, settings
):
    from asgiref.sync import sync_to_async

    await sync_to_async(add_turns)(trusted_caller.session, 400, result="x" * 2000)
    settings.GEOSENSE_LLM_CONTEXT_TOKENS = 20_000

    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hello"}, token=trusted_caller.token
    )

    assert out.status == 200
    (request,) = openai_agent.requests
    system, *messages = request["messages"]
    assert system["content"].endswith("\n\n" + LEFT_OUT_NOTE)
    assert messages[0]["role"] == "user" and messages[-1] == {"role": "user", "content": "hello"}
    assert 4 < len(messages) < 400 * 4
    assert tokens_estimate(request) < 20_000


def test_the_latest_request_carries_a_pictures_size_not_its_png(session):
    from chat.selectors import user_request_latest

    message = Message.objects.create(session=session, turn=1, role="user", content="look")
    for kind, data in (("image", {"png": PNG, "width": 8, "height": 6}), ("position", {"z": 1})):
        Artifact.objects.create(
            session=session,
            artifact_id=f"{kind}-1",
            kind=kind,
            data=data,
            origin=f"client:{kind}",
            message=message,
        )

    request = user_request_latest(session_id=session.pk)

    assert [(c.type, c.artifact_id, c.data) for c in request.contexts] == [
        ("image", "image-1", {"width": 8, "height": 6}),
        ("position", "position-1", {"z": 1}),
    ]
