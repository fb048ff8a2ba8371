"""Issue 12, item 7: the chat page works under its own Content-Security-Policy.

The browser harness bypasses the CSP (Playwright's wait_for_function uses eval); this test
does not: it loads the page, lets its socket connect, asks the local agent something that
draws on the map, and fails on any CSP violation the browser reports.
"""

import time

from playwright.sync_api import expect

from tests.browser.helpers import log_in


def _until(page, expression: str, seconds: float = 20) -> None:
    """Poll with page.evaluate (DevTools evaluation, which the page's CSP does not govern)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if page.evaluate(expression):
            return
        page.wait_for_timeout(100)
    raise AssertionError(f"not true within {seconds} s: {expression}")


def test_the_chat_page_runs_under_its_csp_without_a_violation(browser, daphne_server_factory):
    # A server of its own (the default setting spelled out makes it distinct): run last in the
    # whole suite on the shared server, after every other walk's sessions, the first message
    # of a new conversation was not answered within 15 s (twice in CI runs on 1 December 2026;
    # never with the walks before it run alone). Left open in the closing note of that stop.
    daphne_server = daphne_server_factory({"GEOSENSE_CLIENT_TOOL_TIMEOUT": "30"})
    context = browser.new_context(base_url=daphne_server.url, bypass_csp=False)
    violations: list[str] = []
    context.add_init_script(
        "document.addEventListener('securitypolicyviolation',"
        " e => (window.cspViolations = window.cspViolations || []).push(e.violatedDirective))"
    )
    page = context.new_page()
    page.on(
        "console",
        lambda m: (
            m.type == "error" and "Content Security Policy" in m.text and violations.append(m.text)
        ),
    )
    page.on(
        "pageerror", lambda e: "Content Security Policy" in str(e) and violations.append(str(e))
    )
    try:
        log_in(page)
        page.get_by_test_id("new-conversation").click()
        expect(page.locator("#chat-panel")).to_have_attribute("data-session-id", "")
        page.get_by_label("Your message").fill("how many trees are there?")
        page.get_by_role("button", name="Send").click()
        # A new conversation's first message may wait up to BIND_WAIT_MS (5 s, socket.js) for
        # the socket to bind the session it creates: the answer gets that and the turn's time.
        expect(page.locator(".message.assistant[data-message-id]").last).to_contain_text(
            "There are", timeout=15_000
        )
        _until(page, "() => window.geosenseMap && window.geosenseMap.ready === true")
        page.wait_for_timeout(500)
        violations += page.evaluate("() => window.cspViolations || []")
        # The WebGL map ran its tile workers (same-origin module workers) under the policy.
        map_state = page.evaluate(
            "() => [window.geosenseMap.error, window.geosenseMap.renderedIds().length]"
        )
    finally:
        context.close()
    assert violations == []
    assert map_state[0] is None and map_state[1] > 0
