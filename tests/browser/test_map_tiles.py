"""The WebGL map over the vector tiles, at a size and through changes (issue 17, issue 16 item 10).

- The legend counts the whole dataset, class by class, as /api/annotations does, on a server
  seeded with 200,000 annotations (~13 s of CPU to seed, once per run: the module's server);
  a highlight of 10,000 ids is drawn with its link lines (on 20,000 annotations).
- A deletion approved in one tab disappears from every open map without a reload, the legend
  counts one less, and only the tiles that held the annotation change their ETag.
- The map asks no tile outside the data's bounds, and an annotation added outside them is drawn
  after the change reaches the page, without a reload (the source takes the new bounds).
"""

import math
import re

import pytest
from playwright.sync_api import expect

from tests.browser.daphne_server import manage, server_env, start_server
from tests.browser.helpers import log_in, map_idle, map_rendered_ids
from tests.browser.test_chat_approvals import approval_card
from tests.browser.test_chat_basics import ask, last_answer, new_session

WALK_ANNOTATIONS = 200_000
HIGHLIGHT_ANNOTATIONS = 20_000
TILE_URL = re.compile(r"/tiles/annotations/(\d+)/(\d+)/(\d+)\.mvt")
LIVE = (
    "SELECT id, category, min_lon, min_lat, max_lon, max_lat FROM annotations_annotation"
    " WHERE deleted_at IS NULL ORDER BY id"
)


def seeded_server_of(tmp_path_factory, annotations: int):
    """A server started on a file already seeded with `annotations`: it builds its index and
    the tiles of the data's extent as it starts, as a deployed process does (seeding into a
    running server's file would leave the first page to build them)."""
    folder = tmp_path_factory.mktemp(f"map-{annotations}-")
    db_path = folder / "db.sqlite3"
    env = server_env(db_path=db_path)
    manage("migrate", "--noinput", env=env)
    manage("seed_demo", "--annotations", str(annotations), "--seed", "1", env=env)
    return start_server(
        db_path=db_path, log_path=folder / "server.log", extra_env={"GEOSENSE_WALK": folder.name}
    )


@pytest.fixture(scope="module")
def seeded_server(tmp_path_factory):
    """200,000 annotations, for the legend's counts (~13 s of CPU to seed)."""
    server = seeded_server_of(tmp_path_factory, WALK_ANNOTATIONS)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def highlight_server(tmp_path_factory):
    """20,000 annotations: enough for 10,000 highlighted ids and 10,000 link ends."""
    server = seeded_server_of(tmp_path_factory, HIGHLIGHT_ANNOTATIONS)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def changes_server(daphne_server_factory):
    """A server of its own: the walk deletes an annotation other walks may pick."""
    return daphne_server_factory(env={"GEOSENSE_WALK": "map-changes"})


def open_map(context_for, server):
    page = log_in(context_for(server).new_page())
    # A server still finishing its start-up work (the index of 200,000 annotations on a loaded
    # CI machine) answers the first tiles late: a wait, not a timed assertion.
    page.wait_for_function(
        "window.geosenseMap && window.geosenseMap.ready === true", timeout=180_000
    )
    return page


def legend_counts(page) -> dict[str, int]:
    return dict(
        page.eval_on_selector_all(
            ".map-legend-row",
            "rows => rows.map(r => [r.querySelector('input').dataset.class,"
            " Number(r.querySelector('[data-count]').dataset.count)])",
        )
    )


def tile_of(lon: float, lat: float, zoom: int) -> tuple[int, int, int]:
    n = 2**zoom
    y = (1 - math.asinh(math.tan(math.radians(lat))) / math.pi) / 2 * n
    return zoom, int((lon + 180) / 360 * n), int(y)


def test_the_legend_counts_every_class_as_the_api_does(context_for, seeded_server):
    page = open_map(context_for, seeded_server)
    classes = sorted({row[1] for row in seeded_server.sql(LIVE)})

    api_counts = {}
    for name in classes:
        body = page.request.get(f"/api/annotations?class={name}").json()
        api_counts[name] = body.get("total", len(body["features"]))

    assert sum(api_counts.values()) == WALK_ANNOTATIONS
    assert legend_counts(page) == api_counts
    assert page.evaluate("window.geosenseMap.count") == WALK_ANNOTATIONS


def test_a_highlight_of_10000_ids_is_drawn_with_its_links(context_for, highlight_server):
    page = open_map(context_for, highlight_server)
    rows = highlight_server.sql(LIVE)
    ids = [row[0] for row in rows[:10_000]]
    links = [row[0] for row in rows[10_000:20_000]]
    values = [float(i % 500) for i in range(10_000)]

    result = page.evaluate(
        "data => window.geosenseMap.highlight(data)",
        {"ids": ids, "links": links, "linkValues": values, "linkType": "distance"},
    )
    map_idle(page)
    highlighted = page.evaluate("window.geosenseMap.highlightedIds()")
    drawn_links = map_rendered_ids(page, "links")
    drawn_marks = map_rendered_ids(page, "highlighted")
    labels = page.locator("#map [data-testid=link-label]")

    assert result == {"shown": sorted(ids), "missing": []}
    assert highlighted == sorted(ids)
    assert drawn_links == list(range(10_000))
    assert set(drawn_marks) <= set(ids) and len(drawn_marks) > 9_000
    assert 0 < labels.count() <= 300
    assert "10,000 highlighted" in page.get_by_test_id("map-highlight-bar").inner_text()


def test_a_deletion_leaves_every_open_map_without_a_reload(context_for, changes_server):
    server = changes_server
    rows = [row for row in server.sql(LIVE) if row[1] == "house"]
    house, _, *box = rows[0]
    far = max(rows, key=lambda r: abs(r[2] - box[0]) + abs(r[3] - box[1]))
    house_tile = tile_of((box[0] + box[2]) / 2, (box[1] + box[3]) / 2, 18)
    far_tile = tile_of((far[2] + far[4]) / 2, (far[3] + far[5]) / 2, 18)
    assert abs(house_tile[1] - far_tile[1]) + abs(house_tile[2] - far_tile[2]) > 2

    asker = open_map(context_for, server)
    watcher = open_map(context_for, server)
    for page in (asker, watcher):
        page.evaluate("(id) => window.geosenseMap.focus([id])", house)
    assert house in map_rendered_ids(watcher)
    counts_before = legend_counts(watcher)
    revision_before = watcher.evaluate("window.geosenseMap.revision")

    def etag(tile):
        return watcher.request.get("/tiles/annotations/{}/{}/{}.mvt".format(*tile)).headers["etag"]

    tags_before = {tile: etag(tile) for tile in (house_tile, far_tile)}
    assert tags_before == {tile: etag(tile) for tile in (house_tile, far_tile)}  # stable

    new_session(asker)
    ask(asker, f"delete annotation {house}")
    card = approval_card(asker)
    card.get_by_role("button", name="Approve").click()
    expect(last_answer(asker)).to_contain_text("Deleted")

    for page in (watcher, asker):
        page.wait_for_function(
            "(before) => window.geosenseMap.revision !== before", arg=revision_before
        )
    drawn_after = {page: map_rendered_ids(page) for page in (watcher, asker)}
    unchanged = watcher.request.get(
        "/tiles/annotations/{}/{}/{}.mvt".format(*far_tile),
        headers={"If-None-Match": tags_before[far_tile]},
    )

    assert all(house not in drawn for drawn in drawn_after.values())
    assert all(len(drawn) > 0 for drawn in drawn_after.values())
    assert legend_counts(watcher) == {**counts_before, "house": counts_before["house"] - 1}
    assert etag(house_tile) != tags_before[house_tile]
    assert etag(far_tile) == tags_before[far_tile]
    assert unchanged.status == 304
    assert watcher.evaluate("(id) => window.geosenseMap.focus([id])", house) == []


def tile_meets(tile: tuple[int, int, int], bounds: list[float]) -> bool:
    z, x, y = tile
    west, south, east, north = bounds
    _, x0, y1 = tile_of(west, south, z)
    _, x1, y0 = tile_of(east, north, z)
    return x0 <= x <= x1 and y0 <= y <= y1


def test_an_annotation_added_outside_the_data_is_drawn_without_a_reload(
    context_for, daphne_server_factory
):
    server = daphne_server_factory(env={"GEOSENSE_WALK": "map-grows"})
    context = context_for(server)
    asked = []  # the tiles of the first visit (log_in opens the chat page)
    context.on("request", lambda request: asked.extend(TILE_URL.findall(request.url)))
    page = log_in(context.new_page())
    page.wait_for_function("window.geosenseMap && window.geosenseMap.ready === true")
    bounds = page.request.get("/tiles/annotations.json").json()["bounds"]
    first_tiles = [tuple(int(n) for n in tile) for tile in asked]
    assert first_tiles and all(tile_meets(tile, bounds) for tile in first_tiles)

    _, south, east, north = bounds
    lon, lat = east + 0.02, (south + north) / 2  # zoom 16 tiles there do not meet the old bounds
    assert not tile_meets(tile_of(lon, lat, 16), bounds)
    added = int(
        server.shell(
            "from geosense.annotations.services import annotation_create\n"
            "print(annotation_create(category='tree', geometry="
            f"{{'type': 'Point', 'coordinates': [{lon}, {lat}]}}).pk)"
        ).strip()
    )
    revision = page.evaluate("window.geosenseMap.revision")
    # What the socket's `annotations-changed` frame does (a write in another process reaches
    # this server's pages through Redis, which the walks do not run): the page hears of it.
    page.evaluate(
        "document.dispatchEvent(new CustomEvent('geosense:annotations-changed', {detail: {}}))"
    )
    page.wait_for_function("(before) => window.geosenseMap.revision !== before", arg=revision)
    page.evaluate(
        "([lon, lat]) => window.geosenseMap.map.jumpTo({center: [lon, lat], zoom: 17})", [lon, lat]
    )

    assert added in map_rendered_ids(page)


def test_legend_names_from_the_data_get_colours_and_keep_their_order(context_for, daphne_server):
    """Issue 12 item 10: `__proto__` and `constructor` are classes like any other (Maps, not
    object keys), and a right-to-left override inside a name stays inside it (<bdi>): the
    count after the name is still drawn to its right."""
    hostile = {"__proto__": 3, "constructor": 2, "\u202eevil": 1}
    page = context_for(daphne_server).new_page()

    def add_classes(route):
        body = route.fetch().json()
        body["counts"] = {**body["counts"], **hostile}
        route.fulfill(json=body)

    page.route("**/tiles/annotations.json", add_classes)
    log_in(page)
    page.wait_for_function("window.geosenseMap && window.geosenseMap.ready === true")
    rows = page.eval_on_selector_all(
        ".map-legend-row",
        """rows => rows.map(r => {
          const name = r.querySelector('bdi').getBoundingClientRect();
          const count = r.querySelector('[data-count]').getBoundingClientRect();
          return [r.querySelector('input').dataset.class,
                  getComputedStyle(r.querySelector('.map-legend-swatch')).backgroundColor,
                  Number(r.querySelector('[data-count]').dataset.count),
                  count.left >= name.right - 0.5];
        })""",
    )
    by_name = {name: (colour, count, in_order) for name, colour, count, in_order in rows}

    for name, count in hostile.items():
        colour, shown, in_order = by_name[name]
        assert colour.startswith("rgb(") and colour != "rgba(0, 0, 0, 0)", name
        assert shown == count
        assert in_order, f"the count of {name!r} is drawn before its name"
    assert len({colour for colour, _, _ in by_name.values()}) == len(by_name)
    page.locator('.map-legend input[data-class="__proto__"]').uncheck()
    assert "__proto__" not in page.evaluate("window.geosenseMap.view()")["visible_classes"]
