"""Fixtures shared by every test folder.

The environment defaults of the test process are set in `tests/settings.py` (pytest-django
reads the settings before any conftest). Unit tests use an in-memory SQLite test database;
the browser harness runs Daphne in another process against a SQLite file of its own.
"""

import pytest

pytest_plugins = ["tests.fakes.fixtures", "tests.browser.fixtures"]


def pytest_asyncio_loop_factories(config, item):
    """Every async test on uvloop's loop: the one a served process runs on (geosense/serve.py),
    so the engine's cancellations, timers and thread hand-overs are tested where they run.
    Without uvloop (not on Windows, as the launcher) the plugin's own, asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture(autouse=True)
def _empty_cache():
    """Rate limits count in the cache (geosense/throttle.py): every test starts with none."""
    from django.core.cache import cache

    cache.clear()
