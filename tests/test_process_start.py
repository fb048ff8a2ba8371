"""What a Daphne process does before it serves: nothing costly is left for the first request.

Importing the model client's package (aiohttp, ~0.25 s of CPU; the `openai` SDK the agent
used before took about a second) is done before serving. Left to the first turn after a
start, it ran on the event loop: every user of the process waited, and a process restarted
after a crash took its sessions' next message seconds late (`bench/recovery.py`).
"""

import subprocess
import sys

from tests.browser.daphne_server import BASE_DIR, manage, server_env

PROBE = """
import sys
import geosense.asgi  # what Daphne imports before it listens
print("chat.agents.openai" in sys.modules, "aiohttp" in sys.modules, "openai" in sys.modules)
from django.urls import get_resolver
print("url_patterns" in vars(get_resolver()))  # a cached_property, kept once read
import gc
print(gc.get_freeze_count(), len(gc.get_objects()), gc.get_threshold()[0])
"""


def _imported_at_start(tmp_path, agent: str) -> list[str]:
    env = server_env(
        db_path=tmp_path / "db.sqlite3",
        extra={"GEOSENSE_AGENT": agent, "GEOSENSE_INDEX_WARM": "0"},
    )
    manage("migrate", "--noinput", env=env)
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout.split()


def test_the_openai_agent_is_imported_before_the_process_serves(tmp_path):
    agent_module, package, sdk, urls_resolved, *_gc = _imported_at_start(tmp_path, "openai")
    assert (agent_module, package) == ("True", "True")
    assert sdk == "False", "the agent talks to the server on aiohttp alone, not through the SDK"
    assert urls_resolved == "True", "the first request would import every view module"


def test_the_local_agent_does_not_import_the_model_client(tmp_path):
    agent_module, package, sdk, _urls, *_gc = _imported_at_start(tmp_path, "local")
    assert (agent_module, package, sdk) == ("False", "False", "False")


def test_what_the_process_made_before_serving_is_out_of_the_collectors_walk(tmp_path):
    """Modules, classes, Django's registries and the URLconf live as long as the process, yet
    each full collection walked them all (~110,000 objects at start-up, half the collector's work
    at 200 users: full collections paused the process up to ~250 ms of CPU). They are frozen once
    the process has started (`gc.freeze`), so a collection walks only what serving made."""
    *_imports, frozen, tracked, _young = _imported_at_start(tmp_path, "openai")
    assert int(frozen) > 50_000
    assert int(tracked) < 2_000, tracked


def test_a_serving_process_collects_young_objects_every_50000_not_every_700(tmp_path):
    """At 200 users CPython's default (a young pass every 700 net allocations) made ~40 passes
    a second and pushed in-flight turns' objects into the middle and full generations, whose
    passes walked them again: 0.74-0.88 s of the collector's CPU in a server's first 16 s,
    0.28-0.30 s with passes 50,000 apart (bench/gc_site; docs/benchmarks.md)."""
    *_imports, young = _imported_at_start(tmp_path, "openai")
    assert int(young) == 50_000
