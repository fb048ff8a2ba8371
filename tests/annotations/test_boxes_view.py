"""POST /api/annotations/boxes: where the WebGL map fits highlights and ends link lines."""

import json

import pytest
from django.contrib.auth import get_user_model

from geosense.annotations.models import Annotation
from geosense.annotations.services import annotation_create

from .shapes import point, rectangle

pytestmark = pytest.mark.django_db
URL = "/api/annotations/boxes"


@pytest.fixture
def user():
    return get_user_model().objects.create_user(username="ana", password="pw-ana-123")


def post(client, body):
    return client.post(URL, data=json.dumps(body), content_type="application/json")


def test_the_live_ids_answer_their_class_and_box_and_the_others_are_left_out(client, user):
    house = annotation_create(category="house", geometry=rectangle(-118.52, 34.15, 12, 10))
    tree = annotation_create(category="tree", geometry=point(-118.5201, 34.1501))
    gone = annotation_create(category="tree", geometry=point(-118.40, 34.15))
    Annotation.objects.filter(pk=gone.pk).update(deleted_at="2026-01-01T00:00:00Z")
    client.force_login(user)

    body = post(client, {"ids": [tree.id, house.id, gone.id, 999_999, tree.id]}).json()

    assert [row[:2] for row in body["boxes"]] == [[house.id, "house"], [tree.id, "tree"]]
    w, s, e, n = body["boxes"][0][2:]
    assert w < -118.52 < e and s < 34.15 < n
    assert body["boxes"][1][2:] == pytest.approx([-118.5201, 34.1501, -118.5201, 34.1501])


def test_sparse_ids_are_read_in_chunks_with_the_same_answer(client, user):
    made = [
        annotation_create(category="tree", geometry=point(-118.5 + i * 1e-4, 34.15))
        for i in range(3)
    ]
    client.force_login(user)

    body = post(client, {"ids": [made[0].id, made[2].id, 10_000_000]}).json()

    assert [row[0] for row in body["boxes"]] == [made[0].id, made[2].id]


@pytest.mark.parametrize(
    "body",
    [
        [1, 2],
        {"ids": "1,2"},
        {"ids": [1, "2"]},
        {"ids": [True]},
        {"ids": [0]},
        {"ids": [2**70]},
        {"ids": list(range(1, 100_002))},
    ],
)
def test_a_malformed_body_answers_400_with_a_json_error(client, user, body):
    client.force_login(user)

    response = post(client, body)

    assert response.status_code == 400
    assert "error" in response.json()


def test_anonymous_callers_and_gets_are_refused(client, user):
    assert post(client, {"ids": [1]}).status_code == 401
    client.force_login(user)
    assert client.get(URL).status_code == 405
