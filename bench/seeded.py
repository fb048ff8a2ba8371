"""Django on a temporary SQLite file holding the demo neighbourhood, for the spatial benches."""

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def seeded_demo(annotations: int) -> tuple[int, float]:
    """Set Django up on a new SQLite file and seed `annotations` demo annotations (seed 0).

    Returns how many were created and the seconds the seed took.
    """
    workdir = tempfile.mkdtemp(prefix="geosense-bench-")
    os.environ["DATABASE_URL"] = f"sqlite:///{workdir}/bench.sqlite3"
    os.environ.setdefault("DEBUG", "1")
    os.environ["GEOSENSE_ENV_FILE"] = ""  # measured on the defaults, not on a local .env
    os.environ["DJANGO_SETTINGS_MODULE"] = "geosense.settings"
    import django

    django.setup()
    from django.core.management import call_command

    from geosense.annotations.services import demo_seed

    call_command("migrate", verbosity=0)
    started = time.perf_counter()
    report = demo_seed(annotations=annotations, seed=0)
    return report.created, time.perf_counter() - started
