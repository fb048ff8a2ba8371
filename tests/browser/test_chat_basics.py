"""The chat page with the local agent: a session, a streamed answer, the second tab, the log."""

from playwright.sync_api import expect

from tests.browser.helpers import screenshot

TREES = "SELECT COUNT(*) FROM annotations_annotation WHERE category = 'tree' AND deleted_at IS NULL"


CREATE_SESSION = """async () => {
  const token = JSON.parse(document.body.getAttribute('hx-headers'))['x-csrftoken'];
  const response = await fetch('/api/sessions', {
    method: 'POST', headers: {'X-CSRFToken': token, 'Content-Type': 'application/json'}, body: '{}',
  });
  return (await response.json()).id;
}"""


def new_session(page):
    """Open a new, saved conversation and return its id. "New conversation" itself saves
    nothing until the first message (test_sessions_list.py walks that path); tests that need the
    id before their first message create the session through the API, as a script would."""
    session_id = page.evaluate(CREATE_SESSION)
    page.goto(f"/chat/{session_id}/")
    page.wait_for_function("window.geosenseSocketReady === true")
    return session_id


def ask(page, text):
    page.get_by_label("Your message").fill(text)
    page.get_by_role("button", name="Send").click()


def last_answer(page):
    return page.locator(".message.assistant[data-message-id]").last


def test_a_new_conversation_answers_how_many_trees(logged_in_page, daphne_server, page_errors):
    page = logged_in_page
    session_id = new_session(page)

    ask(page, "how many trees are there?")

    (trees,) = daphne_server.sql(TREES)[0]
    expect(last_answer(page)).to_contain_text(f"There are {trees} trees.")
    expect(page.get_by_label("Your message")).to_have_value("")
    expect(page.locator("#connection-state")).to_have_text("Connected")
    expect(page.locator(".session-list [aria-current=page]")).to_have_text(
        "how many trees are there?"
    )
    stored = daphne_server.sql(
        "SELECT role, content FROM chat_message WHERE session_id = ? ORDER BY id",
        (session_id.replace("-", ""),),
    )
    assert [role for role, _ in stored] == ["user", "assistant"]
    screenshot(page, "chat-answer")
    page.reload()
    expect(last_answer(page)).to_contain_text(f"There are {trees} trees.")
    assert page_errors == []


def test_switching_sessions_keeps_the_page_and_rebinds_the_socket(logged_in_page):
    page = logged_in_page
    first = new_session(page)
    ask(page, "how many trees are there?")
    expect(last_answer(page)).to_contain_text("trees")
    new_session(page)
    page.evaluate("window.samePage = true")

    page.locator(f".session-list a[data-session-id='{first}']").click()

    page.wait_for_url(f"**/chat/{first}/")
    expect(page.locator(".session-list [aria-current=page]")).to_have_attribute(
        "data-session-id", first
    )
    expect(last_answer(page)).to_contain_text("trees")
    page.wait_for_function("window.geosenseSocketReady === true")
    page.get_by_label("Your message").fill("what is the map view?")
    page.get_by_label("Your message").press("Enter")
    expect(last_answer(page)).to_contain_text("The map is centred on")
    assert page.evaluate("window.samePage") is True


KEEP_SOCKETS = """
const Native = window.WebSocket;
window.openedSockets = [];
window.WebSocket = class extends Native {
  constructor(...args) { super(...args); window.openedSockets.push(this); }
};
"""


def test_after_a_lost_connection_the_socket_reconnects_and_serves_tools_again(logged_in_page):
    page = logged_in_page
    page.add_init_script(KEEP_SOCKETS)
    new_session(page)
    state = page.locator("#connection-state")
    expect(state).to_have_text("Connected")

    page.evaluate("window.openedSockets.at(-1).close(4000)")
    expect(state).to_have_text("Reconnecting…")
    screenshot(page, "chat-reconnecting")

    expect(state).to_have_text("Connected", timeout=20_000)
    page.wait_for_function("window.geosenseSocketReady === true")
    assert page.evaluate("window.openedSockets.length") == 2
    ask(page, "what is the map view?")
    expect(last_answer(page)).to_contain_text("The map is centred on")
