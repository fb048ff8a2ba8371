"""Settings for the test process: the app's own settings, read with test defaults in place.

pytest-django loads the settings before any conftest is imported, so the environment defaults
the suite needs are set here, just before `geosense.settings` reads the environment. The live
Daphne server of the browser tests is another process and uses `geosense.settings` itself.
"""

import os

# A developer's `.env` (their model server, their database) is not the suite's: no env file
# is read, here or in the servers the tests start (they inherit this).
os.environ["GEOSENSE_ENV_FILE"] = ""
os.environ.setdefault("SECRET_KEY", "test-secret")
os.environ.setdefault("DEBUG", "1")
# No index built behind a test's back when geosense.asgi is imported (its tests' databases are
# not yet there); the live servers of the browser tests inherit this.
os.environ.setdefault("GEOSENSE_INDEX_WARM", "0")
# A developer's own model server must never be called by the suite: tests that want the
# openai agent point it at the fake server explicitly.
for _name in [n for n in os.environ if n == "GEOSENSE_AGENT" or n.startswith("GEOSENSE_LLM_")]:
    del os.environ[_name]

# No heartbeat thread writing to the test database: claims last their lease, as they did
# before heartbeats existed; the tests of chat/processes.py turn them on where they need them.
os.environ.setdefault("GEOSENSE_PROCESS_HEARTBEAT", "0")

from geosense.settings import *  # noqa: E402, F403
