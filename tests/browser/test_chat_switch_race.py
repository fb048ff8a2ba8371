"""A conversation switch that crosses a send: whichever the reader did last wins, and nothing
the reader sent disappears.

Found as a CI flake (issue 16): the CSP walk, on the server every walk before it had used, clicked
"New conversation" on a page that already showed one, typed and sent before the slow server's
panel came back; the panel then replaced the one that was sending, whose message and answer went
on in a detached panel: nothing on screen, the box emptied. The walks below hold the requests
(Playwright routes) so each order happens every time, on any machine.
"""

import re

from playwright.sync_api import expect

from tests.browser.test_chat_basics import ask, last_answer

UUID_URL = re.compile(r"/chat/[0-9a-f-]{36}/$")
NEW_URL = re.compile(r"/chat/$")

# The panel's answer arrived (htmx swaps, or does not, in the task that fires this event).
COUNT_SWAP_ANSWERS = """() => {
  window.chatPanelAnswers = 0;
  document.body.addEventListener('htmx:beforeSwap', (event) => {
    if (event.detail.target?.id === 'chat-panel') window.chatPanelAnswers += 1;
  });
}"""
MARK_PANEL = "() => { document.getElementById('chat-panel').dataset.left = 'true'; }"
NEW_PANEL_MOUNTED = """() => {
  const panel = document.getElementById('chat-panel');
  return !panel.dataset.left && panel.dataset.mounted === 'true';
}"""


def hold(page, url: str, *, method: str, htmx: bool | None = None) -> list:
    """The first request to `url` by `method` waits in the returned list until the test lets
    it go; every other request goes through."""
    held: list = []
    taken: list = []

    def on_route(route) -> None:
        request = route.request
        is_htmx = request.headers.get("hx-request") == "true"
        if not taken and request.method == method and (htmx is None or htmx == is_htmx):
            taken.append(route)
            held.append(route)
        else:
            route.continue_()

    page.route(url, on_route)
    return held


def wait_held(page, held: list) -> None:
    for _ in range(200):
        if held:
            return
        page.wait_for_timeout(50)
    raise AssertionError("the request was never made")


def test_a_message_sent_while_a_new_conversation_loads_stays_on_screen(logged_in_page):
    page = logged_in_page
    page.wait_for_load_state("networkidle")
    page.evaluate(COUNT_SWAP_ANSWERS)
    held = hold(page, "**/chat/", method="GET", htmx=True)

    page.get_by_test_id("new-conversation").click()
    wait_held(page, held)
    ask(page, "how many trees are there?")
    expect(last_answer(page)).to_contain_text("There are")
    page.wait_for_url(UUID_URL)
    session_id = page.url.rstrip("/").rsplit("/", 1)[1]

    held.pop().continue_()  # the panel asked for before the message comes back now
    page.wait_for_function("window.chatPanelAnswers === 1")

    # The reader's last act was the message: its conversation stays, and is followed live.
    expect(page.locator("#chat-panel")).to_have_attribute("data-session-id", session_id)
    expect(page.locator(".message.user").last).to_contain_text("how many trees are there?")
    expect(last_answer(page)).to_contain_text("There are")
    assert UUID_URL.search(page.url)
    page.wait_for_function("window.geosenseSocketReady === true")
    ask(page, "what is the map view?")
    expect(last_answer(page)).to_contain_text("The map is centred on")


def test_a_new_conversation_opened_while_the_first_message_is_saved_stays_new(logged_in_page):
    page = logged_in_page
    page.wait_for_load_state("networkidle")
    held = hold(page, "**/api/sessions", method="POST")

    ask(page, "how many trees are there?")
    wait_held(page, held)
    page.evaluate(MARK_PANEL)
    page.get_by_test_id("new-conversation").click()
    page.wait_for_function(NEW_PANEL_MOUNTED)
    held.pop().continue_()  # the left conversation is saved now, and its turn runs

    # Its answer ends in the list (a new-answer dot); the page stays on the new conversation:
    # its address, its empty transcript, and a socket that shows no other conversation's turn.
    expect(page.locator(".session-list a[data-new-answer=true]")).to_have_count(1)
    expect(page.locator("#chat-panel")).to_have_attribute("data-session-id", "")
    assert NEW_URL.search(page.url)
    expect(page.locator("#transcript .message")).to_have_count(0)
    ask(page, "what is the map view?")
    expect(last_answer(page)).to_contain_text("The map is centred on")
    expect(page.locator("#transcript .message.user")).to_have_count(1)


def test_text_typed_while_a_new_conversation_loads_is_carried_into_it(logged_in_page):
    page = logged_in_page
    page.wait_for_load_state("networkidle")
    page.evaluate(COUNT_SWAP_ANSWERS)
    page.evaluate(MARK_PANEL)
    held = hold(page, "**/chat/", method="GET", htmx=True)

    page.get_by_test_id("new-conversation").click()
    wait_held(page, held)
    page.get_by_label("Your message").fill("how many trees")  # in the panel on screen
    held.pop().continue_()
    page.wait_for_function(NEW_PANEL_MOUNTED)

    # The new panel has the text, with the focus at its end: the reader goes on typing.
    box = page.get_by_label("Your message")
    expect(box).to_have_value("how many trees")
    expect(box).to_be_focused()
    page.keyboard.type(" are there?")
    page.keyboard.press("Enter")
    expect(last_answer(page)).to_contain_text("There are")
    expect(page.locator(".message.user").last).to_contain_text("how many trees are there?")
    page.wait_for_url(UUID_URL)
