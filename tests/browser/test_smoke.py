"""The harness end to end: a live Daphne server, Debian's Chromium, the demo login, the map."""

import re
import uuid

from tests.browser.helpers import map_rendered_ids, screenshot

LIVE_ANNOTATIONS = "SELECT id, category FROM annotations_annotation WHERE deleted_at IS NULL"


def test_demo_sees_every_annotation_drawn_on_the_map(logged_in_page, daphne_server, page_errors):
    page = logged_in_page
    page.wait_for_function("window.geosenseMap && window.geosenseMap.ready === true")

    api = page.request.get("/api/annotations")
    features = api.json()["features"]
    # WebGL draws no element per shape: the map says which ids and classes it drew (shapes,
    # and count points for the shapes too small to see at this zoom), the legend the rest.
    drawn_ids = set(map_rendered_ids(page))
    drawn_classes = map_rendered_ids(page, "classes")
    legend = page.eval_on_selector_all(
        ".map-legend-row",
        "rows => rows.map(r => [r.querySelector('input').dataset.class,"
        " Number(r.querySelector('[data-count]').dataset.count),"
        " getComputedStyle(r.querySelector('.map-legend-swatch')).backgroundColor])",
    )
    stored = daphne_server.sql(LIVE_ANNOTATIONS)
    api_counts: dict[str, int] = {}
    for feature in features:
        api_counts[feature["properties"]["class"]] = (
            api_counts.get(feature["properties"]["class"], 0) + 1
        )

    assert api.ok
    assert len(stored) > 0
    assert {str(f["id"]) for f in features} == {str(row[0]) for row in stored}
    assert drawn_ids <= {f["id"] for f in features} and len(drawn_ids) > 0
    assert drawn_classes == sorted(api_counts)
    assert {name: count for name, count, _ in legend} == api_counts
    assert page.evaluate("window.geosenseMap.count") == len(features)
    colour_of_class = {name: colour for name, _, colour in legend}
    assert len(set(colour_of_class.values())) == len(colour_of_class) > 1
    assert page.get_by_test_id("current-user").inner_text() == "demo"
    assert page.get_by_role("button", name="Log out").is_visible()
    assert page_errors == []
    screenshot(page, "smoke-map")


def test_an_anonymous_visitor_is_sent_to_the_login_form(page):
    page.goto("/")

    assert re.search(r"/accounts/login/\?next=/chat/$", page.url)
    assert page.get_by_role("heading", name="Log in to GeoSense").is_visible()


def test_a_wrong_password_is_refused_with_a_readable_error(page):
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill("demo")
    page.get_by_label("Password").fill("not-the-password")
    page.get_by_role("button", name="Log in").click()

    assert page.get_by_role("alert").inner_text().startswith("Your username and password")
    assert "/accounts/login/" in page.url


NEW_SESSION = """
from django.contrib.auth.models import User
from chat.models import ChatSession
user, _ = User.objects.get_or_create(username={username!r})
print(ChatSession.objects.create(user=user, title={title!r}).pk)
"""


def test_a_session_that_does_not_exist_answers_404(logged_in_page):
    response = logged_in_page.goto(f"/chat/{uuid.uuid4()}/")

    assert response.status == 404


def test_another_users_session_answers_404(logged_in_page, daphne_server):
    code = NEW_SESSION.format(username="someone-else", title="Not yours")
    session_id = uuid.UUID(daphne_server.shell(code).strip())

    response = logged_in_page.goto(f"/chat/{session_id}/")

    assert response.status == 404


def test_an_own_session_is_listed_and_marked_current(logged_in_page, daphne_server):
    code = NEW_SESSION.format(username="demo", title="Pools near the school")
    session_id = uuid.UUID(daphne_server.shell(code).strip())

    logged_in_page.goto(f"/chat/{session_id}/")

    current = logged_in_page.locator(".session-list [aria-current=page]")
    assert current.inner_text() == "Pools near the school"
    assert logged_in_page.title().startswith("Pools near the school")
