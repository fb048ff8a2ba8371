"""Issue 16 item 12: the demo has two vector kinds per annotation, so a sample's `v` changes what
a find-similar search finds; a `v` its annotation lacks renders as a readable chip."""

import json

import numpy as np
import pytest
import shapely
from django.test import Client

from geosense.annotations.geometry import context_vectors_json, neighbour_counts
from geosense.annotations.models import Annotation
from geosense.annotations.selectors import annotation_list
from tests.chat.conftest import make_caller
from tests.chat.test_markup import render

BLOCK = "<tool type=\"find-similar\" data='{data}'>Find pools like #{id}</tool>"


class MapData(set):
    """The data's classes and the vector kinds of annotations, as the page gives them."""

    def __init__(self, vectors: dict[int, list[str]]) -> None:
        super().__init__({"pool", "house"})
        self.vectors = vectors
        self.asked: list[list[int]] = []

    def vectors_of(self, ids: list[int]) -> dict[int, list[str]]:
        self.asked.append(ids)
        return {i: self.vectors[i] for i in ids if i in self.vectors}


def test_neighbour_counts_count_each_class_in_the_cells_around_leaving_itself_out():
    points = shapely.points([(5, 5), (15, 5), (45, 5), (200, 200)])
    counts = neighbour_counts(points, ["pool", "tree", "tree", "pool"], ["pool", "tree"], cell_m=10)

    assert counts.tolist() == [[0, 1], [1, 0], [0, 0], [0, 0]]
    assert context_vectors_json(np.array([[0, 1], [3, 0]])) == ["[0.0,0.6931]", "[1.3863,0.0]"]


@pytest.mark.django_db(transaction=True)
def test_every_demo_annotation_has_a_shape_and_a_context_vector(neighbourhood):
    kinds = {
        tuple((name, len(vector)) for name, vector in vectors.items())
        for vectors in Annotation.objects.values_list("vectors", flat=True)
    }
    classes = len(set(Annotation.objects.values_list("category", flat=True)))

    assert kinds == {(("shape", 8), ("context", classes))}


@pytest.mark.django_db(transaction=True)
def test_the_samples_v_changes_what_the_search_finds(neighbourhood):
    caller = make_caller("vera")
    pool = annotation_list(category="pool")[0].id

    def found(v: str | None) -> list[int]:
        sample = {"id": pool} if v is None else {"id": pool, "v": v}
        answer = Client().post(
            caller.url("/find-similar"),
            data={"samples": [sample]},
            content_type="application/json",
            headers={"Authorization": f"Bearer {caller.token}"},
        )
        assert answer.status_code == 200, answer.content
        return answer.json()["ids"]

    assert found("shape") == found(None)
    assert found("context") != found("shape")
    assert len(found("context")) == 20


def test_a_sample_naming_a_vector_its_annotation_lacks_is_a_readable_chip_not_a_button():
    data = MapData({216: ["shape", "context"]})
    sample = json.dumps({"samples": [{"id": 216, "v": "1234-abcd"}]})

    page = render(BLOCK.format(data=sample, id=216), classes=data)

    assert not page.find("button", "find-similar-run")
    said = "#216 cannot be compared by “1234-abcd”: it has no such vector (its vectors: “shape”, “context”)"
    assert page.one("span", "markup-error")["attrs"]["title"] == said
    assert page.one("p", "find-similar-problem")["text"] == said
    assert data.asked == [[216]]


@pytest.mark.parametrize("v", ["context", "shape", None])
def test_a_sample_naming_a_vector_it_has_keeps_its_button(v):
    data = MapData({216: ["shape", "context"]})
    sample = {"id": 216} if v is None else {"id": 216, "v": v}

    page = render(BLOCK.format(data=json.dumps({"samples": [sample]}), id=216), classes=data)

    assert page.find("button", "find-similar-run")
    assert data.asked == ([] if v is None else [[216]])
