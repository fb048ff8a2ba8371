"""The draft of a streaming step (`chat.turns._Draft`): what it leaves behind when closed."""

import asyncio
import gc
import weakref

import pytest

from chat.turns import _Draft

pytestmark = pytest.mark.asyncio


async def test_a_closed_draft_is_freed_when_its_step_lets_it_go():
    """Closing cancelled the draft's timer but kept it: the cancelled task held its error, the
    error the timer's frame, the frame the draft, the draft the task: a cycle left for the
    collector by every step that streamed text."""
    gc.collect()
    gc.disable()
    try:
        draft = _Draft(session_id=1, turn=1)
        draft.add("Hello")
        await asyncio.sleep(0)  # the timer starts its sleep
        await draft.close()
        await asyncio.sleep(0)  # the cancelled timer ends
        kept = weakref.ref(draft)
        del draft
        assert kept() is None
    finally:
        gc.enable()


async def test_a_step_shorter_than_a_save_costs_its_draft_few_python_calls():
    """A step's text streams for less than `DRAFT_SECONDS` nearly always: its draft's wait is a
    timer, cancelled at the step's end, not a task sleeping to be cancelled (asyncio's task
    registry, the task's steps into and out of its sleep), and closing takes no lock when no
    save is under way. 18 Python calls on the loop before, 4 now (the draft's own)."""
    from tests.chat.costs import python_calls

    async def step(*, drafted: bool) -> None:
        draft = _Draft(session_id=1, turn=1) if drafted else None
        if draft is not None:
            draft.add("Hello")
            draft.add(" there")
        await asyncio.sleep(0)  # the loop runs what the draft started
        if draft is not None:
            await draft.close()
        await asyncio.sleep(0)

    calls = await python_calls(step(drafted=True)) - await python_calls(step(drafted=False))
    assert calls == 4, calls
