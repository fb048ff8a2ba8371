"""`POST /api/sessions/<id>/find-similar`: the reader's free search, bounded (issue 12, item 9)."""

import json

import pytest

from geosense.annotations.models import Annotation

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def _search(client, caller, body):
    response = await client.post(
        caller.url("/find-similar"),
        data=json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {caller.token}"},
    )
    return response.status_code, json.loads(response.content)


async def _pool() -> int:
    return (await Annotation.objects.filter(category="pool").order_by("id").afirst()).pk


async def test_a_search_answers_at_most_the_20_hits_a_block_shows(client, caller, neighbourhood):
    status, found = await _search(client, caller, {"samples": [{"id": await _pool()}]})
    assert status == 200
    assert found["class"] == "pool" and 0 < len(found["ids"]) <= 20
    status, refused = await _search(client, caller, {"samples": [{"id": 1}], "k": 21})
    assert (status, refused) == (400, {"error": "k must be an integer from 1 to 20"})


async def test_more_than_ten_searches_a_minute_are_refused_with_429(client, caller, neighbourhood):
    body = {"samples": [{"id": await _pool()}], "k": 3}
    statuses = [(await _search(client, caller, body))[0] for _ in range(11)]
    assert statuses == [200] * 10 + [429]
    status, refused = await _search(client, caller, body)
    assert status == 429 and "at most 10 searches a minute" in refused["error"]
