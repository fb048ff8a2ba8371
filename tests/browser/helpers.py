"""Helpers for browser tests: logging in and keeping screenshots."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

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
