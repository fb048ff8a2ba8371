"""Words a person reads about tools: every tool has a title, every call a one-line summary."""

import re

import pytest

from tests.chat.costs import python_calls_of
from tools.builtin import BUILTIN_TOOLS
from tools.client import ClientToolRefused, client_tool_declare, summary_fill
from tools.registry import BackendTool, backend_tool, backend_tool_register
from tools.wording import ids_text, metres_text

CODE = re.compile(r"_|\b(?:m2|order|distance m|bbox|samples)\b")


@pytest.mark.parametrize(
    ("name", "arguments", "summary"),
    [
        (
            "spatial_relation",
            {"relation": "within_distance", "source": "tree", "target": "house", "distance_m": 20},
            "Trees within 20 m of a house",
        ),
        (
            "spatial_relation",
            {"relation": "overlap", "source": "solar_panel", "target": "house"},
            "Solar panels overlapping a house",
        ),
        (
            "spatial_relation",
            {
                "relation": "within_distance",
                "source": "pool",
                "target": "orchard",
                "distance_m": 1500,
            },
            "Pools within 1.5 km of an orchard",
        ),
        (
            "query_annotations",
            {"class": "house", "order_by": "-area_m2", "limit": 3},
            "The 3 largest houses",
        ),
        (
            "query_annotations",
            {"class": "road", "order_by": "-length_m", "limit": 1},
            "The longest road",
        ),
        (
            "query_annotations",
            {"class": "pool", "order_by": "area_m2", "limit": 1},
            "The smallest pool",
        ),
        ("query_annotations", {"ids": [3, 4]}, "Annotations #3 and #4"),
        ("query_annotations", {"class": "tree"}, "Trees"),
        (
            "query_annotations",
            {"class": "tree", "bbox": [-118.5221, 34.1560, -118.5180, 34.1580]},
            "Trees inside an area of about 378 m by 221 m",
        ),
        ("list_classes", {}, "Every class"),
        ("measure", {"id": 12}, "Annotation #12"),
        (
            "nearest_annotations",
            {"lat": 34.15684, "lon": -118.52267, "class": "tree"},
            "The 5 trees nearest to 34.1568° N, 118.5227° W",
        ),
        (
            "similarity_search",
            {"samples": [{"id": 25}, {"id": 216, "v": "context"}], "class": "pool"},
            "Pools like #25 and #216 (by “context”), up to 20 results",
        ),
        ("delete_annotations", {"ids": [7]}, "#7 (an administrator can restore it)"),
        (
            "delete_annotations",
            {"ids": list(range(1, 13))},
            "#1, #2, #3, #4, #5, #6, #7 and 5 more (an administrator can restore them)",
        ),
        (
            "area_report",
            {"question": "Which  street\nhas most trees?"},
            "“Which street has most trees?”",
        ),
    ],
)
def test_a_backend_call_is_summarised_in_words(name, arguments, summary):
    assert backend_tool(name).summary_of(arguments).replace("×", "by") == summary


def test_every_builtin_tool_has_a_title_in_words():
    for tool in BUILTIN_TOOLS:
        assert tool.title and not CODE.search(tool.title), tool.name


def test_a_tool_without_a_title_is_not_registered():
    untitled = BackendTool("untitled", "No title.", {"type": "object"}, lambda c, a: {})
    with pytest.raises(ValueError, match="needs a title"):
        backend_tool_register(untitled)


def test_a_summary_that_cannot_read_its_arguments_is_empty_not_an_error():
    assert backend_tool("spatial_relation").summary_of({"relation": "overlap"}) == ""


# --- client tools ----------------------------------------------------------------------------

FOCUS = {
    "kind": "one-way",
    "name": "map_focus",
    "description": "Pan and zoom to annotations.",
    "arguments": {
        "type": "object",
        "properties": {"ids": {"type": "array"}, "class": {"type": "string"}},
    },
    "title": "Show annotations on the map",
    "summary": "{ids:ids}[, only {class:class}]",
}


def test_a_client_tool_declares_its_title_and_summary_template():
    tool = client_tool_declare(FOCUS, backend_names=())
    assert tool.title_text == "Show annotations on the map"
    assert tool.summary_of({"ids": [3, 4, 5]}) == "#3, #4 and #5"
    assert tool.summary_of({"ids": [3], "class": "solar_panel"}) == "#3, only solar panels"
    assert tool.declaration()["summary"] == "{ids:ids}[, only {class:class}]"


def test_a_client_tool_without_a_title_is_named_by_its_name_in_words():
    tool = client_tool_declare({**FOCUS, "title": "", "summary": ""}, backend_names=())
    assert tool.title_text == "Map focus"
    assert tool.summary_of({"ids": [1]}) == ""


def test_a_client_calls_words_cost_few_python_calls_on_the_loop():
    """A served call reads its tool's title and summary for its event and again for its stored
    result, on the event loop (issue 15): the title is worded once per tool, and a tool that
    declares no summary (most) fills no template. 11 Python calls before."""
    tool = client_tool_declare({**FOCUS, "title": "", "summary": ""}, backend_names=())

    def both_read_twice() -> None:
        for _ in range(2):
            assert (tool.title_text, tool.summary_of({"ids": [1]})) == ("Map focus", "")

    # the function, the title's wording once (the cache's `__get__`, title_text, sentence),
    # summary_of for each read
    assert python_calls_of(both_read_twice) <= 6


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("summary", "{nope}", "'nope' is not one of the tool's arguments"),
        ("summary", "{ids:json}", "is not {argument}"),
        ("summary", "x" * 201, "at most 200 characters"),
        ("title", "two\nlines", "one line"),
        ("title", 7, "one line"),
    ],
)
def test_a_client_tools_words_are_checked_when_it_registers(field, value, reason):
    with pytest.raises(ClientToolRefused, match=re.escape(reason)):
        client_tool_declare({**FOCUS, field: value}, backend_names=())


def test_a_summary_value_that_looks_like_a_placeholder_stays_text():
    assert summary_fill("{a} and {b}", {"a": "{b}", "b": "x"}) == "{b} and x"
    assert summary_fill("[{a}]{b}", {"b": "only b"}) == "only b"
    assert summary_fill("{flag}, {n}, {list}", {"flag": True, "n": 2.5, "list": ["x", "y"]}) == (
        "yes, 2.5, x and y"
    )


# --- the words themselves --------------------------------------------------------------------


def test_ids_and_metres_read_as_words():
    assert ids_text([4]) == "#4"
    assert ids_text(range(1, 20)) == "#1, #2, #3, #4, #5, #6, #7 and 12 more"
    assert [metres_text(v) for v in (0.5, 20, 123.4, 1500, 250_000)] == [
        "0.5 m",
        "20 m",
        "123 m",
        "1.5 km",
        "250 km",
    ]
