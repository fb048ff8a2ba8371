"""Turns on the database pool: a turn's trips go before those of the turns whose requests came
after its own (`turn_prepare` marks them with its start, geosense/dbpool.py `work_begin`). In
the order trips came, at 200 users a turn's every trip waited behind ~196 others, newer turns'
included: ~480 ms of each client tool's round trip (the result stored, the next step read)."""

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async

from chat import services, turns
from chat.agents import TextDelta
from chat.turns import NewMessage, turn_launch, turn_prepare
from geosense import dbpool
from tests.chat.conftest import Caller, make_caller

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


class _Waiting:
    """An agent whose answer, one text, comes when the test lets it."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.answer = asyncio.Event()

    async def stream(self, *, history, tools, context):
        self.asked.set()
        await self.answer.wait()
        yield TextDelta("Done.")


class _Held:
    """The engine's pool, of one thread, held by a call until `release`."""

    def __init__(self, monkeypatch) -> None:
        self.pool = dbpool._Pool(max_workers=1)
        monkeypatch.setattr(dbpool, "_pool", self.pool)
        self._gate = threading.Event()

    async def hold(self) -> None:
        held = threading.Event()

        def hold() -> None:
            held.set()
            self._gate.wait(10)

        self._holder = asyncio.ensure_future(dbpool.in_db_thread(hold)())
        await asyncio.to_thread(held.wait, 10)

    async def queued(self, count: int) -> None:
        while self.pool.queued < count:  # noqa: ASYNC110 (submitted on this loop: no event)
            await asyncio.sleep(0)

    async def release(self) -> None:
        self._gate.set()
        await self._holder


def _noted(monkeypatch) -> list[tuple[str, str]]:
    """The pool's work as it runs: each message stored, by session."""
    noted: list[tuple[str, str]] = []
    real_store = services.message_store

    def store(**kwargs):
        noted.append(("store", str(kwargs["session_id"])))
        return real_store(**kwargs)

    monkeypatch.setattr(services, "message_store", store)
    return noted


async def _prepared(caller: Caller) -> turns.PreparedTurn:
    return await turn_prepare(
        session_id=caller.session.pk, user=caller.user, request=NewMessage(text="hi")
    )


async def test_the_older_turns_step_is_stored_before_a_newer_turns_queued_first(monkeypatch):
    held = _Held(monkeypatch)
    noted = _noted(monkeypatch)
    older, newer = [await sync_to_async(make_caller)(name) for name in ("older", "newer")]
    older_agent, newer_agent = _Waiting(), _Waiting()
    running = []
    for caller, agent in ((older, older_agent), (newer, newer_agent)):  # the older comes first
        running.append(turn_launch(await _prepared(caller), agent=agent))
        await agent.asked.wait()
    noted.clear()
    await held.hold()
    for queued, agent in enumerate((newer_agent, older_agent), start=1):  # the newer answers first
        agent.answer.set()
        await held.queued(queued)
    await held.release()
    await asyncio.gather(*running)
    held.pool.shutdown(wait=True)

    assert noted == [("store", str(older.session.pk)), ("store", str(newer.session.pk))]


async def test_a_turns_first_step_goes_before_a_request_that_came_after_its_own(monkeypatch):
    """A turn's mark is its request's start, not its task's: a new message's preparation
    queued between the two (at 200 users, ~100 at a time) waits for the turn's trips (its first
    step's store: its reads were made by its preparation)."""
    held = _Held(monkeypatch)
    noted = _noted(monkeypatch)
    turn, later = [await sync_to_async(make_caller)(name) for name in ("turn", "later")]
    prepared = await _prepared(turn)
    noted.clear()
    await held.hold()
    later_prepared = asyncio.ensure_future(_prepared(later))  # a task: a context of its own
    await held.queued(1)
    agent = _Waiting()
    running = turn_launch(prepared, agent=agent)
    await agent.asked.wait()
    agent.answer.set()
    await held.queued(2)
    await held.release()
    await asyncio.gather(running, later_prepared)
    await dbpool.in_db_thread(services.session_release)(session_id=later.session.pk)
    held.pool.shutdown(wait=True)

    assert noted[:2] == [("store", str(turn.session.pk)), ("store", str(later.session.pk))]
