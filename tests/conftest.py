"""Fixtures shared by every test folder.

The environment defaults of the test process are set in `tests/settings.py` (pytest-django
reads the settings before any conftest). Unit tests use an in-memory SQLite test database;
the browser harness runs Daphne in another process against a SQLite file of its own.
"""

pytest_plugins = ["tests.fakes.fixtures", "tests.browser.fixtures"]
