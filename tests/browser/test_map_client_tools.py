"""The page's client-tool declarations and formatting, checked against the server's own code.

The page imports static/geosense/page-tools.js and format.js; these tests load the same
modules in the page and hand what they produce to the server's validators and formatters.
"""

import random

import pytest

from chat.markup.formatting import FORMATTERS
from tools.client import client_tool_declare
from tools.registry import backend_tool_names
from tools.schemas import validation_error

IMPORT_TOOLS = """async () => {
  const tools = await import('/static/geosense/page-tools.js');
  const location = await import('/static/geosense/location.js');
  return [tools.MAP_GET_VIEW_TOOL, tools.MAP_FOCUS_TOOL, tools.MAP_SELECT_TOOL, location.LOCATION_TOOL];
}"""


@pytest.fixture
def map_page(logged_in_page):
    logged_in_page.wait_for_function("window.geosenseMap && window.geosenseMap.ready === true")
    return logged_in_page


def test_the_server_accepts_every_page_tool_declaration(map_page):
    declarations = map_page.evaluate(IMPORT_TOOLS)

    tools = [client_tool_declare(d, backend_names=backend_tool_names()) for d in declarations]

    assert [(t.name, t.kind, t.serve) for t in tools] == [
        ("map_get_view", "blocking", True),
        ("map_focus", "one-way", False),
        ("map_select", "blocking", False),
        ("location_get", "blocking", True),
    ]


def test_the_map_view_satisfies_the_map_get_view_result_schema(map_page):
    get_view = map_page.evaluate(IMPORT_TOOLS)[0]
    map_page.locator('.map-legend input[data-class="tree"]').uncheck()

    view = map_page.evaluate("window.geosenseMap.view()")

    assert validation_error(schema=get_view["result"], value=view) is None
    assert "tree" not in view["visible_classes"]


def _values() -> list[object]:
    rng = random.Random(7)
    values: list[object] = [0, -0.0, 0.5, 2.5, 0.125, 1.005, 99.95, 99.97, 999.5, 1000, 2.675]
    for _ in range(1500):
        value = rng.random() * 10 ** rng.randint(-3, 7) * rng.choice([1, -1])
        values.append(round(value, rng.randint(0, 3)) if rng.random() < 0.3 else value)
        values.append(rng.randint(0, 4000) / 8)  # exact binary ties
    return [*values, "4.3", " 12 ", "", "abc", None, True, "1e3", ".5", "0x10", "nan"]


POSITIONS = [
    {"latitude": 52.52, "longitude": 13.405},
    {"lat": -33.5, "lng": -70.25},
    [13.4, 52.5],
    [1, 2, 3],
    {"latitude": None, "lat": 3, "lon": 4},
    {"lat": 91, "lon": 0},
]


def test_the_page_formats_every_measure_exactly_as_the_server(map_page):
    cases = [
        [kind, value]
        for kind in FORMATTERS
        for value in (POSITIONS if kind == "position" else _values())
    ]

    page_texts = map_page.evaluate(
        """async (cases) => {
          const { FORMATTERS } = await import('/static/geosense/format.js');
          return cases.map(([kind, value]) => FORMATTERS[kind](value));
        }""",
        cases,
    )

    mismatches = [
        (kind, value, FORMATTERS[kind](value), text)
        for (kind, value), text in zip(cases, page_texts, strict=True)
        if FORMATTERS[kind](value) != text
    ]
    assert len(cases) > 15000
    assert mismatches == []
