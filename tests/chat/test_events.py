"""chat/events.py's `EventFeed`: a turn's events for one SSE stream, and its keep-alive."""

import asyncio

import pytest

from chat.events import EventFeed
from geosense import wire

pytestmark = pytest.mark.asyncio

IDLE = 0.05


async def test_a_feed_hands_on_what_was_put_since_the_last_take_in_order():
    feed = EventFeed(idle=60)
    try:
        first, second = wire.text_delta("a"), wire.text_delta("b")
        assert feed.taken_now() == []
        feed.put(first)
        feed.put(second)
        assert await feed.taken() == [first, second]

        waiting = asyncio.create_task(feed.taken())
        await asyncio.sleep(0)
        assert not waiting.done()
        feed.put(first)
        assert await waiting == [first]
    finally:
        feed.close()


async def test_a_reader_waiting_idle_seconds_without_an_event_is_woken_with_none():
    feed = EventFeed(idle=IDLE)
    try:
        assert await asyncio.wait_for(feed.taken(), 2) == []
        assert await asyncio.wait_for(feed.taken(), 2) == []  # and again, IDLE later
    finally:
        feed.close()


async def test_a_closed_feed_wakes_no_one_again():
    feed = EventFeed(idle=IDLE)
    feed.close()
    waiting = asyncio.create_task(feed.taken())
    await asyncio.sleep(3 * IDLE)

    assert not waiting.done()
    waiting.cancel()
