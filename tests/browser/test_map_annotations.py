"""The map of the chat page, driven as the chat and the client tools drive it (window.geosenseMap).

Each test reads the annotations from the server's database and checks what the user sees:
shapes shown or hidden, the popup of a clicked shape, highlight marks and link labels,
the view after a focus, the contexts a question sends, and a selection.
"""

import base64
import struct

import pytest
from playwright.sync_api import expect

from chat.markup.formatting import format_area, format_length, format_overlap
from tests.browser.helpers import map_click_annotation, map_rendered_ids, screenshot

LIVE = "SELECT id FROM annotations_annotation WHERE deleted_at IS NULL AND category = ? ORDER BY id"


@pytest.fixture
def map_page(logged_in_page):
    logged_in_page.wait_for_function("window.geosenseMap && window.geosenseMap.ready === true")
    return logged_in_page


def ids_of(server, category: str, count: int) -> list[int]:
    return [row[0] for row in server.sql(LIVE, (category,))[:count]]


def test_the_legend_hides_and_shows_a_class(map_page, daphne_server):
    page = map_page
    trees = set(ids_of(daphne_server, "tree", 10**6))
    toggle = page.locator('.map-legend input[data-class="tree"]')
    drawn_before = set(map_rendered_ids(page))
    classes_before = map_rendered_ids(page, "classes")

    toggle.uncheck()
    hidden_view = page.evaluate("window.geosenseMap.view()")
    hidden_context = page.evaluate("window.geosenseMap.contexts(['visibility'])")
    drawn_while_hidden = set(map_rendered_ids(page))
    classes_while_hidden = map_rendered_ids(page, "classes")
    toggle.check()
    shown_view = page.evaluate("window.geosenseMap.view()")
    drawn_after = set(map_rendered_ids(page))

    # Shapes and count points (small trees are counted at this zoom) of every class are drawn.
    assert "tree" in classes_before
    assert "tree" not in classes_while_hidden
    assert set(classes_while_hidden) == set(classes_before) - {"tree"}
    assert not drawn_while_hidden & trees
    assert drawn_while_hidden == drawn_before - trees
    assert "tree" not in hidden_view["visible_classes"]
    assert "house" in hidden_view["visible_classes"]
    assert hidden_context == [
        {
            "type": "visibility",
            "data": {"classes": hidden_view["visible_classes"], "hidden": ["tree"]},
        }
    ]
    assert "tree" in shown_view["visible_classes"]
    assert drawn_after == drawn_before
    assert map_rendered_ids(page, "classes") == classes_before


def test_clicking_a_house_shows_its_id_class_and_measures(map_page, daphne_server):
    page = map_page
    house = ids_of(daphne_server, "house", 1)[0]
    ((area, length),) = daphne_server.sql(
        "SELECT area_m2, length_m FROM annotations_annotation WHERE id = ?", (house,)
    )
    page.evaluate(f"window.geosenseMap.focus([{house}])")

    map_click_annotation(page, house)
    popup = page.get_by_test_id("annotation-popup")

    def measure(name: str) -> str:
        return popup.locator(f'[data-measure="{name}"] dd').inner_text()

    assert popup.is_visible()
    assert measure("id") == str(house)
    assert measure("class") == "house"
    assert measure("area") == format_area(area)
    assert measure("perimeter") == format_length(length)
    screenshot(page, "map-popup")


def test_a_distance_highlight_marks_exactly_its_ids_and_labels_each_link(map_page, daphne_server):
    page = map_page
    trees = ids_of(daphne_server, "tree", 3)
    houses = ids_of(daphne_server, "house", 3)
    values = [4.3, 1234.5, 0.456]

    result = page.evaluate(
        "data => window.geosenseMap.highlight(data)",
        {"ids": trees, "links": houses, "linkValues": values, "linkType": "distance"},
    )
    labels = page.eval_on_selector_all(
        "#map [data-testid=link-label]", "els => els.map(e => [e.dataset.linkIndex, e.textContent])"
    )
    view = page.evaluate("window.geosenseMap.view()")
    boxes = [
        daphne_server.sql(
            "SELECT min_lon, min_lat, max_lon, max_lat FROM annotations_annotation WHERE id = ?",
            (annotation,),
        )[0]
        for annotation in trees + houses
    ]

    assert result == {"shown": sorted(trees), "missing": []}
    assert page.evaluate("window.geosenseMap.highlightedIds()") == sorted(trees)
    assert map_rendered_ids(page, "highlighted") == sorted(trees)
    assert map_rendered_ids(page, "links") == [0, 1, 2]
    assert sorted(labels) == [[str(i), format_length(v)] for i, v in enumerate(values)]
    assert [text for _, text in sorted(labels)] == ["4.3 m", "1.2 km", "0.46 m"]
    west, south, east, north = view["bounds"]
    for min_lon, min_lat, max_lon, max_lat in boxes:
        assert west <= (min_lon + max_lon) / 2 <= east
        assert south <= (min_lat + max_lat) / 2 <= north
    screenshot(page, "map-highlight")


def test_an_overlap_highlight_labels_percentages_and_lists_missing_ids(map_page, daphne_server):
    page = map_page
    pools = ids_of(daphne_server, "pool", 2)
    houses = ids_of(daphne_server, "house", 2)

    result = page.evaluate(
        "data => window.geosenseMap.highlight(data)",
        {
            "ids": [*pools, 999999],
            "links": houses,
            "linkValues": [0.42, 0.045],
            "linkType": "overlap",
        },
    )
    labels = page.locator("#map [data-testid=link-label]").all_inner_texts()

    assert result == {"shown": sorted(pools), "missing": [999999]}
    assert (
        sorted(labels) == sorted([format_overlap(0.42), format_overlap(0.045)]) == ["4.5%", "42%"]
    )
    assert "1 not on the map" in page.get_by_test_id("map-highlight-bar").inner_text()


def test_attribute_hints_are_formatted_in_the_popup_of_a_highlighted_feature(
    map_page, daphne_server
):
    page = map_page
    houses = ids_of(daphne_server, "house", 2)
    page.evaluate(
        "data => window.geosenseMap.highlight(data)",
        {
            "ids": houses,
            "areas": [850.4, 12500],
            "cost": 2.5,
            "attributeHints": {"areas": "area", "cost": "credits"},
        },
    )
    page.evaluate(f"window.geosenseMap.focus([{houses[1]}])")
    map_click_annotation(page, houses[1])
    popup = page.get_by_test_id("annotation-popup")

    assert (
        popup.locator('[data-measure="areas"] dd').inner_text() == format_area(12500) == "1.25 ha"
    )
    assert "cost: 2.5 credits" in page.get_by_test_id("map-highlight-bar").inner_text()


def test_clear_highlight_removes_marks_lines_and_labels(map_page, daphne_server):
    page = map_page
    trees = ids_of(daphne_server, "tree", 2)
    houses = ids_of(daphne_server, "house", 2)
    data = {"ids": trees, "links": houses, "linkValues": [3, 5], "linkType": "distance"}

    page.evaluate("data => window.geosenseMap.highlight(data)", data)
    page.evaluate("window.geosenseMap.clearHighlight()")
    marks_after_api = len(map_rendered_ids(page, "highlighted"))
    lines_after_api = len(map_rendered_ids(page, "links"))
    expect(page.locator("#map [data-testid=link-label]")).to_have_count(0)
    page.evaluate("data => window.geosenseMap.highlight(data)", data)
    page.get_by_test_id("map-clear-highlight").click()

    assert (marks_after_api, lines_after_api) == (0, 0)
    assert page.evaluate("window.geosenseMap.highlightedIds()") == []
    assert map_rendered_ids(page, "highlighted") == []
    assert map_rendered_ids(page, "links") == []
    assert page.get_by_test_id("map-highlight-bar").count() == 0
    expect(page.locator("#map [data-testid=link-label]")).to_have_count(0)


def test_focus_moves_the_view_to_the_annotation_and_flashes_it(map_page, daphne_server):
    page = map_page
    road = ids_of(daphne_server, "road", 1)[0]
    ((min_lon, min_lat, max_lon, max_lat),) = daphne_server.sql(
        "SELECT min_lon, min_lat, max_lon, max_lat FROM annotations_annotation WHERE id = ?",
        (road,),
    )
    before = page.evaluate("window.geosenseMap.view()")

    found = page.evaluate(f"window.geosenseMap.focus([{road}, 999999])")
    flashing = page.evaluate("window.geosenseMap.focusedIds()")
    after = page.evaluate("window.geosenseMap.view()")

    assert found == [road]
    assert flashing == [road]
    assert road in map_rendered_ids(page)
    assert after != before
    west, south, east, north = after["bounds"]
    assert west <= min_lon and max_lon <= east and south <= min_lat and max_lat <= north
    assert (east - west) < (before["bounds"][2] - before["bounds"][0])


def test_contexts_describe_the_view_and_picture_it(map_page):
    page = map_page
    page.locator('.map-legend input[data-class="shed"]').uncheck()

    contexts = page.evaluate(
        "window.geosenseMap.contexts(['visibility', 'position', 'image', 'nonsense'])"
    )
    view = page.evaluate("window.geosenseMap.view()")
    visibility, position, image = contexts
    png = base64.b64decode(image["data"]["png"].removeprefix("data:image/png;base64,"))
    width, height = struct.unpack(">II", png[16:24])
    drawn_pixels = page.evaluate(
        """async (url) => {
          const picture = new Image(); picture.src = url; await picture.decode();
          const canvas = document.createElement('canvas');
          canvas.width = picture.width; canvas.height = picture.height;
          const context = canvas.getContext('2d'); context.drawImage(picture, 0, 0);
          const pixels = context.getImageData(0, 0, canvas.width, canvas.height).data;
          // Pixels of none of the background and base-map colours: annotations.
          const quiet = [[0xec, 0xea, 0xe6], [0xf7, 0xf5, 0xf0], [0xdc, 0xeb, 0xd3], [0xe2, 0xde, 0xd6]];
          let drawn = 0;
          for (let i = 0; i < pixels.length; i += 4) {
            const near = ([r, g, b]) =>
              Math.abs(pixels[i] - r) + Math.abs(pixels[i + 1] - g) + Math.abs(pixels[i + 2] - b) < 24;
            if (!quiet.some(near)) drawn += 1;
          }
          return drawn;
        }""",
        image["data"]["png"],
    )

    assert [c["type"] for c in contexts] == ["visibility", "position", "image"]
    assert visibility["data"]["hidden"] == ["shed"]
    assert visibility["data"]["classes"] == view["visible_classes"]
    assert position["data"] == {
        "center": view["center"],
        "zoom": view["zoom"],
        "bounds": view["bounds"],
    }
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert (width, height) == (image["data"]["width"], image["data"]["height"])
    assert 0 < width <= 800
    assert drawn_pixels > 500


def test_a_selection_is_confirmed_with_the_clicked_annotations(map_page, daphne_server):
    page = map_page
    houses = ids_of(daphne_server, "house", 2)
    page.evaluate(
        "() => { window.picked = window.geosenseMap.select({prompt: 'Pick two houses'}); }"
    )
    bar = page.get_by_test_id("map-select-bar")
    bar_text = bar.inner_text()

    for house in houses:
        page.evaluate(f"window.geosenseMap.focus([{house}])")
        map_click_annotation(page, house)
    count_text = page.get_by_test_id("map-select-count").inner_text()
    selected_while_open = page.evaluate("window.geosenseMap.selectedIds()")
    page.get_by_test_id("map-select-confirm").click()

    assert bar.count() == 0
    assert "Pick two houses" in bar_text
    assert count_text == "2 selected"
    assert selected_while_open == sorted(houses)
    assert page.evaluate("window.picked") == {"ids": sorted(houses)}
    assert page.evaluate("window.geosenseMap.selectedIds()") == []
    assert page.get_by_test_id("annotation-popup").count() == 0


def test_a_selection_of_one_class_ignores_others_and_cancel_answers_null(map_page, daphne_server):
    page = map_page
    house = ids_of(daphne_server, "house", 1)[0]
    page.evaluate(
        "() => { window.picked = window.geosenseMap.select({prompt: 'Pick pools', class: 'pool'}); }"
    )

    prompt = page.get_by_test_id("map-select-bar").inner_text()
    page.evaluate(f"window.geosenseMap.focus([{house}])")
    map_click_annotation(page, house)
    selected = len(page.evaluate("window.geosenseMap.selectedIds()"))
    page.get_by_test_id("map-select-cancel").click()

    assert "Pick pools" in prompt
    assert selected == 0
    assert page.evaluate("window.picked") is None
    assert page.get_by_test_id("map-select-bar").count() == 0
