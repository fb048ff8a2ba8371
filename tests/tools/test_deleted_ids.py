"""A deleted annotation is refused by every tool that takes ids, in a sentence for a person
(issue 16, item 10): the spatial tools and the page's map tools alike."""

import asyncio

import pytest

from geosense.annotations.models import Annotation
from geosense.annotations.services import annotations_soft_delete, demo_seed
from tests.client_tools import FOCUS
from tools import builtin
from tools.client import ClientTool
from tools.registry import ToolContext, ToolError

pytestmark = pytest.mark.django_db
CONTEXT = ToolContext(artifact_save=lambda **_: "a1")


@pytest.fixture
def seeded():
    demo_seed(annotations=300, seed=0)
    annotations_soft_delete(ids=[7, 9])


def refusal(handler, arguments) -> str:
    with pytest.raises(ToolError) as caught:
        handler(CONTEXT, arguments)
    return str(caught.value)


def test_measure_says_an_annotation_was_deleted_or_never_was(seeded):
    assert (
        refusal(builtin.measure, {"id": 7}) == "#7 was deleted (an administrator can restore it)."
    )
    assert refusal(builtin.measure, {"id": 99999}) == "There is no annotation #99999."
    assert builtin.measure(CONTEXT, {"id": 8})["id"] == 8


def test_similarity_refuses_a_deleted_sample(seeded):
    text = refusal(builtin.similarity_search, {"samples": [{"id": 9}, {"id": 7}]})
    assert text == "#7 and #9 were deleted (an administrator can restore them)."


def test_a_query_by_ids_names_the_deleted_ones(seeded):
    assert refusal(builtin.query_annotations, {"ids": [7]}).startswith("#7 was deleted")
    some = builtin.query_annotations(CONTEXT, {"ids": [7, 8, 99999]})
    assert [a["id"] for a in some["annotations"]] == [8]
    assert some["missing"] == (
        "#7 was deleted (an administrator can restore it). There is no annotation #99999."
    )
    assert "missing" not in builtin.query_annotations(CONTEXT, {"ids": [8]})


def test_deleting_again_says_it_was_deleted_already(seeded):
    text = refusal(builtin.delete_annotations, {"ids": [7]})
    assert text == "Nothing was deleted. #7 was deleted (an administrator can restore it)."


@pytest.mark.django_db(transaction=True)
def test_the_map_tools_are_never_asked_to_show_a_deleted_annotation():
    # Ids go on from earlier tests here (no rollback): take them from the rows seeded.
    demo_seed(annotations=300, seed=0)
    first = Annotation.objects.order_by("id").values_list("id", flat=True)[0]
    gone, live = first + 6, first + 7
    annotations_soft_delete(ids=[gone])
    focus = ClientTool.from_declaration(FOCUS)
    problem = asyncio.run(focus.arguments_problem({"ids": [live, gone]}))
    assert problem == f"#{gone} was deleted (an administrator can restore it)"
    assert asyncio.run(focus.arguments_problem({"ids": [live, first + 9]})) is None
    # An id no annotation ever had is the page's to skip, as its description says.
    assert asyncio.run(focus.arguments_problem({"ids": [first + 99999]})) is None
