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
