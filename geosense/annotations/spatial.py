"""Which engine answers the spatial questions: the in-process index or PostGIS.

`spatial_backend()` is the one place that decides. "index" (the embedded default: SQLite, or
any database) answers from `index.py`, a copy of the live annotations in each process. "postgis"
(the default on PostgreSQL, where migration annotations/0005 made the `geom` column) answers
with SQL from `postgis.py`, and no process builds the index. `GEOSENSE_SPATIAL_BACKEND` can
force either ("index" works on every database; "postgis" only on PostgreSQL).
"""

from typing import Literal

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

SpatialBackendName = Literal["index", "postgis"]


def spatial_backend() -> SpatialBackendName:
    """The engine for this process's database: the setting when it names one, else PostGIS on
    PostgreSQL and the in-process index elsewhere. Two attribute reads: cheap per call, so
    that a test can switch it with `override_settings`."""
    chosen = getattr(settings, "GEOSENSE_SPATIAL_BACKEND", "auto")
    postgresql = connection.vendor == "postgresql"
    if chosen == "index":
        return "index"
    if chosen == "postgis":
        if not postgresql:
            raise ImproperlyConfigured("GEOSENSE_SPATIAL_BACKEND=postgis needs PostgreSQL")
        return "postgis"
    return "postgis" if postgresql else "index"
