import pytest
from django.contrib.auth import get_user_model

from geosense.accounts.services import api_token_create
from geosense.annotations.services import annotation_create

from .shapes import point, rectangle

pytestmark = pytest.mark.django_db
URL = "/api/annotations"


@pytest.fixture
def user():
    return get_user_model().objects.create_user(username="ana", password="pw-ana-123")


@pytest.fixture
def area():
    house = annotation_create(category="house", geometry=rectangle(-118.52, 34.15, 12, 10))
    tree = annotation_create(
        category="tree", geometry=point(-118.5201, 34.1501), attributes={"species": "olive"}
    )
    far = annotation_create(category="tree", geometry=point(-118.40, 34.15))
    return house, tree, far


def test_anonymous_callers_are_refused_with_a_json_error(client, area):
    response = client.get(URL)

    assert response.status_code == 401
    assert "error" in response.json()


def test_an_invalid_bearer_token_is_refused(client, area):
    response = client.get(URL, headers={"Authorization": "Bearer gs_nope"})

    assert response.status_code == 401


def test_a_bearer_token_gets_the_feature_collection_of_a_bbox(client, user, area):
    house, tree, _ = area
    token = api_token_create(user=user)

    response = client.get(
        URL, {"bbox": "-118.53,34.14,-118.51,34.16"}, headers={"Authorization": f"Bearer {token}"}
    )

    body = response.json()
    assert response.status_code == 200
    assert body["type"] == "FeatureCollection"
    assert {f["id"] for f in body["features"]} == {house.id, tree.id}
    by_id = {f["id"]: f for f in body["features"]}
    assert by_id[house.id]["properties"]["class"] == "house"
    assert by_id[house.id]["properties"]["area_m2"] == pytest.approx(120, rel=0.01)
    assert by_id[tree.id]["properties"]["species"] == "olive"
    assert "length_m" in by_id[tree.id]["properties"]


def test_a_session_user_can_filter_by_class(client, user, area):
    client.force_login(user)

    response = client.get(URL, {"class": "tree"})

    assert {f["properties"]["class"] for f in response.json()["features"]} == {"tree"}
    assert len(response.json()["features"]) == 2


@pytest.mark.parametrize("bbox", ["1,2,3", "a,b,c,d", "10,10,0,0", "0,0,200,10", "nan,0,1,1"])
def test_a_malformed_bbox_answers_400_with_a_json_error(client, user, bbox):
    client.force_login(user)

    response = client.get(URL, {"bbox": bbox})

    assert response.status_code == 400
    assert "bbox" in response.json()["error"]


def test_only_get_is_allowed(client, user):
    client.force_login(user)

    assert client.post(URL).status_code in {403, 405}
