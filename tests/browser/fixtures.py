"""Fixtures of the browser harness, available to every test folder.

- `daphne_server_factory(env={...})`: a Daphne process on a free port with a seeded SQLite file
  of its own (see `tests/browser/daphne_server.py`), one per distinct `env`, kept for the run;
  `daphne_server` is the one with no extra environment.
- `browser`: Debian's Chromium driven by Playwright's sync API, once per run. Without
  /usr/bin/chromium the tests that use it are skipped, or fail when
  `GEOSENSE_REQUIRE_BROWSER=1`.
- `context_for(server, **options)`: a fresh browser context whose `base_url` is that server;
  `context`, `page` and `logged_in_page` (demo/demo) use `daphne_server`.
- `page_errors`: uncaught exceptions and console errors of the test's pages.
Every test that uses `browser` gets the `browser` marker and runs after all other tests; a
failing one leaves a screenshot of each open page in test-artifacts/screenshots/.
"""

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Error as PlaywrightError

from tests.browser.daphne_server import DaphneServer, DaphneServers
from tests.browser.helpers import log_in, screenshot

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
_failed_key = pytest.StashKey[bool]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the browser tests and run them last: Playwright's sync API keeps its event loop
    marked as running in the main thread for as long as the browser lives, and no asyncio test
    can run its own loop after that."""
    in_browser = [item for item in items if "browser" in getattr(item, "fixturenames", ())]
    for item in in_browser:
        item.add_marker(pytest.mark.browser)
    chosen = set(in_browser)
    items[:] = [item for item in items if item not in chosen] + in_browser


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    if report.when == "call" and report.failed:
        item.stash[_failed_key] = True
    return report


@pytest.fixture(scope="session")
def daphne_server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaphneServers]:
    servers = DaphneServers(tmp_path_factory.mktemp("live-server"))
    yield servers
    servers.close()


@pytest.fixture(scope="session")
def daphne_server(daphne_server_factory: DaphneServers) -> DaphneServer:
    return daphne_server_factory()


@pytest.fixture(scope="session")
def browser():
    if not CHROMIUM.exists():
        reason = f"Debian's Chromium is not installed at {CHROMIUM}"
        if os.environ.get("GEOSENSE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{reason} and GEOSENSE_REQUIRE_BROWSER=1")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


@pytest.fixture
def page_errors() -> list[str]:
    return []


@pytest.fixture
def context_for(
    browser, page_errors: list[str], request: pytest.FixtureRequest
) -> Iterator[Callable[..., object]]:
    contexts = []

    def new_context(server: DaphneServer, **options):
        options.setdefault("viewport", {"width": 1280, "height": 800})
        # Playwright's wait_for_function evaluates its predicate with eval, which the app's
        # CSP refuses; tests/security/test_csp_browser.py drives the page with the CSP on.
        options.setdefault("bypass_csp", True)
        context = browser.new_context(base_url=server.url, **options)
        context.on("page", lambda page: _watch(page, page_errors))
        contexts.append(context)
        return context

    # Playwright's sync API keeps an event loop in this thread, which trips Django's
    # async-safety check for ORM calls made by the test itself. Servers and their manage.py
    # commands never inherit this (daphne_server.py leaves it out of their environment).
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        yield new_context
    finally:
        if request.node.stash.get(_failed_key, False):
            for n, page in enumerate(p for c in contexts for p in c.pages):
                with contextlib.suppress(PlaywrightError):  # a crashed page has no picture
                    screenshot(page, f"FAILED-{request.node.nodeid}-{n}")
        for context in contexts:
            context.close()
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def _watch(page, errors: list[str]) -> None:
    def on_console(message) -> None:
        if message.type == "error":
            errors.append(f"console.error: {message.text}")

    page.on("pageerror", lambda error: errors.append(f"pageerror: {error}"))
    page.on("console", on_console)


@pytest.fixture
def context(context_for, daphne_server: DaphneServer):
    return context_for(daphne_server)


@pytest.fixture
def page(context):
    return context.new_page()


@pytest.fixture
def logged_in_page(page):
    return log_in(page)
