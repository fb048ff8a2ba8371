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
