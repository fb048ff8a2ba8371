"""Issue 12, item 7: the chat page works under its own Content-Security-Policy.

The browser harness bypasses the CSP (Playwright's wait_for_function uses eval); this test
does not: it loads the page, lets its socket connect, asks the local agent something that
draws on the map, and fails on any CSP violation the browser reports.
"""

import time

from playwright.sync_api import expect

from tests.browser.helpers import PageRecorder, log_in, open_new_conversation


def _until(page, expression: str, seconds: float = 20) -> None:
    """Poll with page.evaluate (DevTools evaluation, which the page's CSP does not govern)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if page.evaluate(expression):
            return
        page.wait_for_timeout(100)
    raise AssertionError(f"not true within {seconds} s: {expression}")


def test_the_chat_page_runs_under_its_csp_without_a_violation(browser, daphne_server):
    # On the server every walk shares, run last: its first message once went unanswered in CI
    # when the busy server's "New conversation" panel came back after the walk had typed (or
    # sent) in the panel it replaced (fixed in the page: panel-swaps.js,
    # test_chat_switch_race.py; the walk now waits for the panel).
    context = browser.new_context(base_url=daphne_server.url, bypass_csp=False)
    violations: list[str] = []
    context.add_init_script(
        "document.addEventListener('securitypolicyviolation',"
        " e => (window.cspViolations = window.cspViolations || []).push(e.violatedDirective))"
    )
    page = context.new_page()
    recorder = PageRecorder(page)
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
        open_new_conversation(page)
        page.get_by_label("Your message").fill("how many trees are there?")
        page.get_by_role("button", name="Send").click()
        # A new conversation's first message may wait up to BIND_WAIT_MS (5 s, socket.js) for
        # the socket to bind the session it creates: the answer gets that and the turn's time.
        try:
            expect(page.locator(".message.assistant[data-message-id]").last).to_contain_text(
                "There are", timeout=15_000
            )
        except AssertionError as error:
            raise AssertionError(
                f"{error}\n{recorder.explain(page, daphne_server.log())}"
            ) from None
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
