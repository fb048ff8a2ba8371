"""The page at phone, tablet and desktop widths: the composer always in view, the conversations
reachable (a drawer below 1100 px), the map and the chat switched on a phone, and a legend that
leaves the map visible."""

import pytest
from playwright.sync_api import expect

from tests.browser.helpers import log_in, screenshot
from tests.browser.test_chat_basics import ask, last_answer, new_session

PHONE = {"width": 390, "height": 844}
TABLET = {"width": 1000, "height": 800}
DESKTOP = {"width": 1400, "height": 900}
SIDEWAYS = {"width": 844, "height": 390}  # a phone held sideways
LEGEND_SHARE_MAX = 0.2


def in_viewport(page, locator) -> bool:
    box = locator.bounding_box()
    size = page.viewport_size
    return (
        box is not None
        and box["x"] >= 0
        and box["y"] >= 0
        and box["x"] + box["width"] <= size["width"] + 0.5
        and box["y"] + box["height"] <= size["height"] + 0.5
    )


def legend_share(page) -> float:
    """The part of the map's area the legend covers."""
    legend = page.locator(".map-legend").bounding_box()
    shown = page.locator("#map").bounding_box()
    return legend["width"] * legend["height"] / (shown["width"] * shown["height"])


def open_conversations(page):
    """The list as a person reaches it: on screen, or behind the header's button."""
    new = page.get_by_test_id("new-conversation")
    if not new.is_visible():
        page.get_by_role("button", name="Conversations", exact=True).click()
        # The drawer slides in: wait until it is in place.
        page.wait_for_function(
            "document.getElementById('sessions').getBoundingClientRect().left >= 0"
        )
    expect(new).to_be_visible()
    return new


@pytest.mark.parametrize(
    "viewport", [PHONE, TABLET, DESKTOP, SIDEWAYS], ids=["phone", "tablet", "desktop", "sideways"]
)
def test_the_composer_the_conversations_and_the_map_are_usable_at_every_width(
    browser, daphne_server, context_for, page_errors, viewport
):
    page = log_in(context_for(daphne_server, viewport=viewport).new_page())
    earlier = new_session(page)
    ask(page, "how many trees are there?")
    expect(last_answer(page)).to_contain_text("trees")
    new_session(page)
    for question in ("how many trees are there?", "how many pools are there?", "what is here?"):
        ask(page, question)
        expect(page.get_by_label("Your message")).to_have_value("")
        expect(page.locator("#send-button")).to_be_enabled()

    # The composer stays in view below a long transcript, as the page opens (Playwright's own
    # actions scroll what they touch into view, so the page is loaded again untouched).
    page.reload()
    expect(last_answer(page)).to_be_attached()
    assert in_viewport(page, page.get_by_label("Your message"))
    assert in_viewport(page, page.get_by_role("button", name="Send"))

    # The conversations are reachable, and choosing one opens it.
    new = open_conversations(page)
    assert in_viewport(page, new)
    entry = page.locator(f".session-list a[data-session-id='{earlier}']")
    expect(entry).to_be_visible()
    entry.click()
    page.wait_for_url(f"**/chat/{earlier}/")
    expect(page.get_by_label("Your message")).to_be_visible()
    assert in_viewport(page, page.get_by_label("Your message"))

    # The map is there (on a phone, behind the switch) and the legend leaves it visible.
    if viewport is PHONE:
        expect(page.locator("#map")).not_to_be_visible()
        page.get_by_role("button", name="Map", exact=True).click()
        expect(page.get_by_label("Your message")).not_to_be_visible()
    expect(page.locator("#map")).to_be_visible()
    page.wait_for_function("window.geosenseMap && window.geosenseMap.ready === true")
    expect(page.locator(".map-legend")).to_be_visible()
    assert legend_share(page) <= LEGEND_SHARE_MAX
    screenshot(page, f"layout-{viewport['width']}")
    assert page_errors == []


def test_on_a_phone_the_legend_unfolds_and_the_drawer_closes_on_escape(
    browser, daphne_server, context_for
):
    page = log_in(context_for(daphne_server, viewport=PHONE).new_page())
    new_session(page)
    page.get_by_role("button", name="Map", exact=True).click()
    page.wait_for_function("window.geosenseMap && window.geosenseMap.ready === true")
    tree = page.locator('.map-legend input[data-class="tree"]')
    expect(tree).not_to_be_visible()

    page.locator(".map-legend summary").click()
    expect(tree).to_be_visible()
    tree.uncheck()
    expect(tree).not_to_be_checked()
    page.locator(".map-legend summary").click()
    expect(tree).not_to_be_visible()

    toggle = page.get_by_role("button", name="Conversations", exact=True)
    toggle.click()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    expect(page.get_by_test_id("new-conversation")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.get_by_test_id("new-conversation")).not_to_be_visible()
    expect(toggle).to_have_attribute("aria-expanded", "false")


def test_on_a_phone_showing_an_answer_on_the_map_switches_to_the_map(
    browser, daphne_server, context_for
):
    page = log_in(context_for(daphne_server, viewport=PHONE).new_page())
    new_session(page)
    page.get_by_label("Allow backend tools").check()
    ask(page, "which is the largest house?")
    chip = last_answer(page).locator("button.chip.ref").first
    expect(chip).to_be_visible()

    chip.click()

    expect(page.locator("#map")).to_be_visible()
    expect(page.get_by_role("button", name="Map", exact=True)).to_have_attribute(
        "aria-pressed", "true"
    )
    page.get_by_role("button", name="Chat", exact=True).click()
    expect(chip).to_be_visible()


def test_on_a_phone_a_highlight_that_arrives_marks_the_map_switch(
    browser, daphne_server, context_for
):
    page = log_in(context_for(daphne_server, viewport=PHONE).new_page())
    new_session(page)
    page.get_by_label("Allow backend tools").check()
    map_switch = page.get_by_role("button", name="Map", exact=True)
    expect(map_switch).not_to_have_attribute("data-news", "true")

    ask(page, "show trees within 20 m of a house")

    expect(last_answer(page)).to_contain_text("within")
    page.wait_for_function("window.geosenseMap.highlightedIds().length > 0")
    expect(map_switch).to_have_attribute("data-news", "true")
    map_switch.click()
    expect(page.locator("#map")).to_be_visible()
    expect(map_switch).not_to_have_attribute("data-news", "true")


def focused_in_drawer(page) -> bool:
    return page.evaluate("document.getElementById('sessions').contains(document.activeElement)")


def test_on_a_phone_the_open_drawer_keeps_the_keyboard_focus(browser, daphne_server, context_for):
    page = log_in(context_for(daphne_server, viewport=PHONE).new_page())
    new_session(page)
    toggle = page.get_by_role("button", name="Conversations", exact=True)
    open_conversations(page)
    controls = page.evaluate(
        "[...document.querySelectorAll('#sessions a[href], #sessions button')]"
        ".filter((e) => e.getClientRects().length > 0).length"
    )
    page.wait_for_function("document.getElementById('sessions').contains(document.activeElement)")

    for _ in range(controls + 1):  # once round and one more: focus never leaves the drawer
        page.keyboard.press("Tab")
        assert focused_in_drawer(page)
    close = page.get_by_role("button", name="Close the conversations")
    close.focus()
    page.keyboard.press("Shift+Tab")  # from the first control back to the last
    assert focused_in_drawer(page)
    assert page.evaluate(
        "document.activeElement === [...document.querySelectorAll('#sessions a[href]')].pop()"
    )
    page.keyboard.press("Tab")
    expect(close).to_be_focused()

    page.keyboard.press("Escape")  # closed, the page's controls are reachable again
    expect(toggle).to_be_focused()
    page.keyboard.press("Tab")
    assert not focused_in_drawer(page)
