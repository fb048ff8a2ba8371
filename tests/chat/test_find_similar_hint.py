"""The page's find-similar search (`POST …/find-similar`) takes a hint alone, as its class, and
the same sample limit as a block."""

import pytest
from django.test import Client

from geosense.annotations.selectors import annotation_list
from geosense.annotations.types import SIMILAR_SAMPLES_MAX
from tests.chat.conftest import make_caller

pytestmark = pytest.mark.django_db(transaction=True)


def post(caller, body):
    return Client().post(
        caller.url("/find-similar"),
        data=body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {caller.token}"},
    )


@pytest.fixture
def alice(neighbourhood):
    return make_caller("alice")


def test_a_hint_alone_finds_the_most_typical_members_of_its_class(alice):
    answer = post(alice, {"hint": "pools"})

    assert answer.status_code == 200
    found = answer.json()
    pools = {row.id for row in annotation_list(category="pool")}
    assert found["class"] == "pool" and len(found["ids"]) == 20 and set(found["ids"]) <= pools
    assert found["scores"] == sorted(found["scores"], reverse=True)


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ({"hint": "unicorn"}, 404, "'unicorn' names no class, and there are no samples"),
        ({}, 400, "send samples (a list of 1 to 20 {id, v?} objects), a hint naming a class"),
        ({"hint": 7}, 400, "hint must be a text"),
        (
            {"samples": [{"id": i} for i in range(1, SIMILAR_SAMPLES_MAX + 2)]},
            400,
            "a list of 1 to 20",
        ),
    ],
)
def test_a_search_that_cannot_run_is_refused_with_a_reason(alice, body, status, error):
    answer = post(alice, body)
    assert answer.status_code == status and error in answer.json()["error"]
