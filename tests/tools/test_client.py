"""Client-tool declarations and the engine's side of a call (the storage per socket is in
tests/chat/test_client_tool_registrations.py)."""

import asyncio

import pytest
from channels.layers import get_channel_layer

from geosense.wire import CLIENT_TOOL_ANSWER, CLIENT_TOOL_FORGET, CLIENT_TOOL_INVOKE
from tests.client_tools import PICK
from tools import schemas
from tools.client import (
    ClientTool,
    ClientToolRefused,
    client_tool_declare,
    client_tool_request,
)

SHOW = {
    "kind": "one-way",
    "name": "map_focus",
    "description": "Pan and zoom to annotations.",
    "arguments": {"type": "object", "properties": {"ids": {"type": "array"}}},
    "serve": False,
}


def test_a_blocking_tool_without_serve_is_answered_by_the_reader():
    tool = client_tool_declare(PICK, backend_names=())
    assert tool.kind == "blocking"
    assert tool.serve is False
    assert tool.result == PICK["result"]


def test_a_one_way_tool_has_neither_result_nor_serve():
    tool = client_tool_declare(SHOW, backend_names=())
    assert tool.result is None
    assert tool.serve is False
    assert "result" not in tool.declaration()


@pytest.mark.parametrize("raw", [PICK, {**PICK, "serve": True}, SHOW])
def test_a_declaration_survives_storage_unchanged(raw):
    tool = client_tool_declare(raw, backend_names=())
    assert ClientTool.from_declaration(tool.declaration()) == tool


def test_the_model_sees_an_openai_function():
    tool = client_tool_declare(PICK, backend_names=())
    assert tool.openai_spec() == {
        "type": "function",
        "function": {
            "name": "map_select",
            "description": PICK["description"],
            "parameters": PICK["arguments"],
        },
    }


def test_a_collision_with_a_backend_tool_is_refused_not_shadowed():
    with pytest.raises(ClientToolRefused) as refused:
        client_tool_declare(
            {**PICK, "name": "delete_annotations"}, backend_names={"delete_annotations"}
        )
    assert refused.value.name == "delete_annotations"
    assert "backend tool" in refused.value.reason


def test_a_pattern_deep_inside_anyof_is_refused():
    result = {"anyOf": [{"type": "object"}, {"type": "string", "pattern": "a+"}]}
    with pytest.raises(ClientToolRefused) as refused:
        client_tool_declare({**PICK, "result": result}, backend_names=())
    assert "'pattern' at /anyOf/1/pattern" in refused.value.reason


def test_an_oversized_declaration_is_refused():
    with pytest.raises(ClientToolRefused) as refused:
        client_tool_declare(
            {**PICK, "arguments": {"type": "object", "description": "x" * 20_000}}, backend_names=()
        )
    assert "larger than 16 KiB" in refused.value.reason


class FakeSocket:
    """Stands in for a consumer on the channel layer: answers each invoke with `reply(message)`."""

    def __init__(self, reply):
        self.reply = reply
        self.seen: list[dict] = []

    async def serve(self, channel: str) -> None:
        layer = get_channel_layer()
        while True:
            message = await layer.receive(channel)
            self.seen.append(message)
            if message["type"] == CLIENT_TOOL_INVOKE:
                answer = self.reply(message)
                if answer is not None:
                    await layer.send(message["reply_to"], answer)


async def with_fake_socket(reply, *, arguments=None, wait=2.0):
    layer = get_channel_layer()
    channel = await layer.new_channel()
    socket = FakeSocket(reply)
    serving = asyncio.create_task(socket.serve(channel))
    tool = client_tool_declare(PICK, backend_names=())
    try:
        answer = await client_tool_request(
            channel_name=channel, tool=tool, arguments=arguments or {}, timeout=wait
        )
        await asyncio.sleep(0.05)
    finally:
        serving.cancel()
    return answer, socket.seen


def answer_with(**fields):
    return lambda m: {"type": CLIENT_TOOL_ANSWER, "correlation_id": m["correlation_id"], **fields}


@pytest.mark.asyncio
async def test_the_invoke_carries_the_name_arguments_and_a_fresh_correlation_id():
    answer, seen = await with_fake_socket(
        answer_with(result={"ids": [3]}), arguments={"prompt": "Pick"}
    )
    assert answer.ok
    assert answer.result == {"ids": [3]}
    invoke = seen[0]
    assert invoke["name"] == "map_select"
    assert invoke["arguments"] == {"prompt": "Pick"}
    assert len(invoke["correlation_id"]) == 32


@pytest.mark.asyncio
async def test_answers_for_other_correlation_ids_are_not_taken_for_this_call():
    def reply(message):
        return {
            "type": CLIENT_TOOL_ANSWER,
            "correlation_id": "someone-else",
            "result": {"ids": [1]},
        }

    answer, _ = await with_fake_socket(reply, wait=0.2)
    assert answer.error == "No answer from the client within 0.2 seconds."


@pytest.mark.asyncio
async def test_a_timed_out_call_tells_the_socket_to_forget_it():
    answer, seen = await with_fake_socket(lambda m: None, wait=0.1)
    assert not answer.ok
    assert [m["type"] for m in seen] == [CLIENT_TOOL_INVOKE, CLIENT_TOOL_FORGET]
    assert seen[1]["correlation_id"] == seen[0]["correlation_id"]


@pytest.mark.asyncio
async def test_the_clients_error_text_is_bounded():
    answer, _ = await with_fake_socket(answer_with(error="no " * 1000))
    assert answer.error.startswith("The client refused: no no")
    assert len(answer.error) <= len("The client refused: ") + 1000


@pytest.mark.asyncio
async def test_a_layer_that_cannot_deliver_answers_the_model_readably(monkeypatch):
    layer = get_channel_layer()

    async def broken_send(channel, message):
        raise ConnectionError("layer down")

    monkeypatch.setattr(layer, "send", broken_send)
    tool = client_tool_declare(PICK, backend_names=())
    answer = await client_tool_request(
        channel_name="specific.x", tool=tool, arguments={}, timeout=5
    )
    assert not answer.ok
    assert answer.error == "The client could not be reached; its answer is unknown."


@pytest.mark.asyncio
async def test_a_tools_result_schema_is_looked_up_once_for_all_its_answers(monkeypatch):
    """Looking a validator up by its schema writes the schema out as canonical JSON: a tool
    keeps its own, so a page answering over and over costs that once."""
    looked_up = []
    real = schemas._compiled
    monkeypatch.setattr(schemas, "_compiled", lambda text: looked_up.append(text) or real(text))
    layer = get_channel_layer()
    channel = await layer.new_channel()
    serving = asyncio.create_task(FakeSocket(answer_with(result={"ids": [3]})).serve(channel))
    tool = client_tool_declare(PICK, backend_names=())
    try:
        for _ in range(3):
            answer = await client_tool_request(
                channel_name=channel, tool=tool, arguments={}, timeout=2
            )
            assert answer.ok
    finally:
        serving.cancel()
    assert len(looked_up) == 1


def test_correlation_ids_differ_between_calls_and_between_forked_processes():
    import os

    from tools.client import _correlation_id

    first, second = _correlation_id(), _correlation_id()
    assert first != second and len(first) == len(second) == 32
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child reports its next id and leaves at once
        os.write(write, _correlation_id().encode())
        os._exit(0)
    os.waitpid(child, 0)
    assert os.read(read, 64).decode()[:16] != _correlation_id()[:16]


@pytest.mark.asyncio
async def test_a_call_waits_without_a_timeout_context_of_its_own(monkeypatch):
    """`asyncio.timeout` cost a context manager, a timer and the task's cancellation
    bookkeeping on every call (issue 15, item 8): the waiter has a timer of its own, cancelled
    once answered. The time-out itself: `test_a_timed_out_call_tells_the_socket_to_forget_it`."""
    entered = []
    real = asyncio.timeout
    monkeypatch.setattr(asyncio, "timeout", lambda delay: entered.append(delay) or real(delay))
    answer, _ = await with_fake_socket(answer_with(result={"ids": [3]}))
    assert answer.ok
    assert entered == []


async def with_unanswered_call(monkeypatch, reachable, *, within: float):
    """A call to a socket that never answers by itself, its reachability asked every 10 ms."""
    from tools import client

    monkeypatch.setattr(client, "REACHABLE_CHECK_SECONDS", 0.01)
    layer = get_channel_layer()
    channel = await layer.new_channel()
    tool = client_tool_declare(PICK, backend_names=())
    request = client_tool_request(
        channel_name=channel, tool=tool, arguments={}, timeout=within, reachable=reachable
    )
    return await asyncio.wait_for(request, 5)


@pytest.mark.asyncio
async def test_the_time_out_answers_while_a_reachability_check_is_still_queued(monkeypatch):
    """The check reads the database through the engine's pool, which queues under load: the
    time-out used to wait for the read in flight (review of session 25, finding 6)."""
    checking = asyncio.Event()

    async def reachable():
        checking.set()
        await asyncio.sleep(30)  # a read stuck behind a long queue
        return True

    answer = await with_unanswered_call(monkeypatch, reachable, within=0.2)
    assert checking.is_set()
    assert answer.error == "No answer from the client within 0.2 seconds."


@pytest.mark.asyncio
async def test_an_answer_that_arrives_during_a_check_wins_over_its_verdict(monkeypatch):
    """A socket that answers while its process is being checked has answered: a late "gone"
    verdict must not replace the answer with "could not be reached"."""
    from tools import client

    async def reachable():
        (waiter,) = client._replies_running(asyncio.get_running_loop()).waiting.values()
        waiter.set_result(
            {"type": CLIENT_TOOL_ANSWER, "correlation_id": "x", "result": {"ids": [4]}}
        )
        await asyncio.sleep(0.05)
        return False

    answer = await with_unanswered_call(monkeypatch, reachable, within=2)
    assert answer.ok and answer.result == {"ids": [4]}


def test_arguments_too_long_to_be_within_the_caps_by_their_length_are_measured():
    tool = client_tool_declare(PICK, backend_names=())
    deep: dict = {}
    for _ in range(40):
        deep = {"choice": deep}
    problem = asyncio.run(tool.arguments_problem(deep, size=12 * 40 + 2))

    assert "nests deeper than 32" in problem
    assert schemas.size_within_bounds(2 * schemas.VALUE_MAX_DEPTH + 1)
    assert not schemas.size_within_bounds(2 * schemas.VALUE_MAX_DEPTH + 2)


@pytest.mark.asyncio
async def test_short_arguments_are_checked_without_measuring_them_against_the_caps():
    """A model's arguments are a short JSON text nearly always: one of at most 65 characters
    can neither nest past the depth cap nor grow past the size cap, so it is not walked nor
    written out again to be measured: 19 Python calls on the loop before, 15 now."""
    from tests.chat.costs import python_calls

    tool = client_tool_declare(PICK, backend_names=())
    short = {"prompt": "Pick one."}
    assert await tool.arguments_problem(short, size=23) is None

    calls = await python_calls(tool.arguments_problem(short, size=23))
    assert calls <= 15, calls
