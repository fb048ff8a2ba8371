"""Helpers for browser tests: logging in and keeping screenshots."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

from playwright.sync_api import Error as PlaywrightError

if TYPE_CHECKING:
    from playwright.sync_api import Page

SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"


def screenshot(page: Page, name: str) -> Path:
    """Save a full-page PNG under test-artifacts/screenshots/ (git-ignored) and return its path."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', name).strip('-')}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def log_in(page: Page, *, username: str = "demo", password: str = "demo") -> Page:
    """Log in through the login form of the page's server (the context's `base_url`)."""
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(r"/chat/"))
    return page


# The map draws in WebGL: no DOM element per annotation. Tests read what it draws through
# window.geosenseMap (queryRenderedFeatures underneath) and click where a shape is drawn.


def map_idle(page: Page) -> None:
    """Wait until the map has drawn everything it is loading (after a fit, a toggle…)."""
    page.evaluate("window.geosenseMap.idle()")


def map_rendered_ids(page: Page, which: str = "features") -> list[int]:
    """Ids drawn on screen now: annotation shapes, or the `highlighted`/`linkTargets` overlays."""
    map_idle(page)
    return page.evaluate("(which) => window.geosenseMap.renderedIds(which)", which)


def map_click_annotation(page: Page, annotation_id: int) -> None:
    """Click on the screen where annotation `annotation_id` is drawn (it must be in view)."""
    map_idle(page)
    point = page.evaluate("(id) => window.geosenseMap.screenPoint(id)", annotation_id)
    assert point is not None, f"annotation {annotation_id} is not drawn on the map"
    box = page.locator("#map").bounding_box()
    assert box is not None
    page.mouse.click(box["x"] + point["x"], box["y"] + point["y"])


class PageRecorder:
    """What a page's console said and the frames its sockets carried, for a walk's failure
    message: a walk that fails only in a full CI run says, in its report, what the page and
    the server saw (`explain`)."""

    LIMIT = 200  # the latest lines of each kind kept

    def __init__(self, page: Page) -> None:
        self.console: list[str] = []
        self.frames: list[str] = []
        page.on("console", lambda m: self._keep(self.console, f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: self._keep(self.console, f"pageerror: {e}"))
        page.on("websocket", self._watch_socket)

    def _keep(self, lines: list[str], line: str) -> None:
        lines.append(line[:500])
        del lines[: -self.LIMIT]

    def _watch_socket(self, socket) -> None:
        self._keep(self.frames, f"open {socket.url}")
        socket.on("framesent", lambda payload: self._keep(self.frames, f"> {payload}"))
        socket.on("framereceived", lambda payload: self._keep(self.frames, f"< {payload}"))
        socket.on("close", lambda _socket: self._keep(self.frames, "closed"))

    def explain(self, page: Page, server_log: str = "") -> str:
        """The page's address and panel, its console, its socket frames, the server log's end."""
        try:
            state = page.evaluate(
                "() => { const p = document.getElementById('chat-panel');"
                " return [location.href, p && p.dataset.sessionId, p && p.dataset.busy,"
                " document.querySelectorAll('#transcript .message').length,"
                " window.geosenseSocketReady]; }"
            )
        except PlaywrightError as error:  # a crashed page still gets its report
            state = f"(page not readable: {error})"
        return "\n".join(
            [
                f"page [url, session, busy, messages, socket ready]: {state}",
                "console:",
                *self.console,
                "socket frames:",
                *self.frames,
                "server log (end):",
                server_log[-6000:],
            ]
        )


def open_new_conversation(page: Page, seconds: float = 20) -> None:
    """Click "New conversation" and wait until its panel is on screen and wired. On a page
    that already shows a new conversation nothing else tells the two panels apart, and a walk
    that types at once may type into the panel being replaced. Polls with page.evaluate, which
    a page's CSP does not govern (wait_for_function evaluates with eval)."""
    page.evaluate("() => { document.getElementById('chat-panel').dataset.replaced = 'true'; }")
    page.get_by_test_id("new-conversation").click()
    deadline = time.monotonic() + seconds
    while not page.evaluate(
        "() => { const p = document.getElementById('chat-panel');"
        " return !p.dataset.replaced && p.dataset.mounted === 'true'; }"
    ):
        if time.monotonic() > deadline:
            raise AssertionError(f"the New conversation panel was not shown within {seconds} s")
        page.wait_for_timeout(50)
